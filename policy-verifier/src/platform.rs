//! What a program may touch: each hook's context fields, the helpers it may call, and the
//! maps of its object. Mirrors `policies/include/ncclbpf.h`.

pub use policy_object::Scope;

/// Field access rights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Perm {
    Read,
    ReadWrite,
}

#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    pub offset: u32,
    pub size: u32,
    pub perm: Perm,
}

/// What a helper argument must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// An initialized scalar.
    Scalar,
    /// A map pointer (`&my_map`).
    MapPtr,
    /// A pointer to `key_size` initialized bytes (stack or map value).
    MapKey,
    /// A pointer to `value_size` initialized bytes (stack or map value).
    MapValue,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ret {
    Scalar,
    /// A pointer into the value of the map passed as argument 1, or NULL.
    MapValueOrNull,
}

#[derive(Clone, Copy, Debug)]
pub struct Helper {
    pub id: i32,
    pub name: &'static str,
    pub args: &'static [Arg],
    pub ret: Ret,
    /// Whether the helper changes the map passed as argument 1 (refused for read-only maps,
    /// however the map pointer was formed).
    pub writes_map: bool,
}

pub const HELPER_MAP_LOOKUP: i32 = 1;
pub const HELPER_MAP_UPDATE: i32 = 2;
pub const HELPER_MAP_DELETE: i32 = 3;
pub const HELPER_KTIME_GET_NS: i32 = 5;
pub const HELPER_GET_SMP_PROCESSOR_ID: i32 = 8;

/// Every helper the runtime implements.
pub const HELPERS: &[Helper] = &[
    Helper {
        id: HELPER_MAP_LOOKUP,
        name: "bpf_map_lookup_elem",
        args: &[Arg::MapPtr, Arg::MapKey],
        ret: Ret::MapValueOrNull,
        writes_map: false,
    },
    Helper {
        id: HELPER_MAP_UPDATE,
        name: "bpf_map_update_elem",
        args: &[Arg::MapPtr, Arg::MapKey, Arg::MapValue, Arg::Scalar],
        ret: Ret::Scalar,
        writes_map: true,
    },
    Helper {
        id: HELPER_MAP_DELETE,
        name: "bpf_map_delete_elem",
        args: &[Arg::MapPtr, Arg::MapKey],
        ret: Ret::Scalar,
        writes_map: true,
    },
    Helper {
        id: HELPER_KTIME_GET_NS,
        name: "bpf_ktime_get_ns",
        args: &[],
        ret: Ret::Scalar,
        writes_map: false,
    },
    Helper {
        id: HELPER_GET_SMP_PROCESSOR_ID,
        name: "bpf_get_smp_processor_id",
        args: &[],
        ret: Ret::Scalar,
        writes_map: false,
    },
];

pub fn helper(id: i32) -> Option<&'static Helper> {
    HELPERS.iter().find(|h| h.id == id)
}

/// A hook: where a program attaches, its context and its helpers.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub section: &'static str,
    pub ctx_size: u32,
    pub fields: &'static [Field],
    pub helpers: &'static [i32],
    /// Why helpers missing from `helpers` are missing, for the rejection message.
    pub helper_note: &'static str,
    /// Whether the program decides for the communicator (tuner hooks): what it writes to the
    /// context must come out the same on every rank, so it may not depend on a rank-local
    /// value (the locality rule, [`crate::check`]).
    pub decides: bool,
    /// Context fields whose value is this rank's own (read, but tainted in hooks that decide),
    /// with the reason.
    pub local_fields: &'static [(&'static str, &'static str)],
    /// Whether the runtime installs the communicator's views of its per-communicator maps
    /// ([`MapInfo::per_comm`]) before the program runs. Agreed maps and staged config maps are
    /// process-wide while their contents are per communicator: a tuner context that runs the
    /// agreement writes its own contents into them before its `tuner` and `tuner/epoch`
    /// programs (`Agreement::install` in tuner/src/agree.rs, docs/agreement.md §3-4).
    /// `tuner/chunk` (per collective, from NCCL's `getChunkSize`) and `tuner/init` (once per
    /// communicator, at init) run without it and read whichever communicator's contents were
    /// installed last: in a hook that decides and has no views, values read from those maps
    /// are rank-local.
    pub views: bool,
}

/// `reg_buff` comes from each rank's own registration cache (NCCL 2.28-2.30 `ncclPrepareTasks`
/// / `ncclRegFind`, docs/nccl-collective-facts.md): registration can take effect on one rank
/// and not on another.
pub const TUNER_LOCAL_FIELDS: &[(&str, &str)] = &[
    (
        "reg_buff",
        "NCCL looks the buffer up in this rank's own registration cache, which can differ between ranks",
    ),
    (
        "usable",
        "NCCL's cost table agrees between ranks only in its cheapest entry: whether another entry is usable can depend on the node's topology (NVSwitch count, local ranks), an NVLS bind that failed on one rank, or each process's NCCL_ALGO/NCCL_PROTO (nccl_algo and nccl_proto, the cheapest entry, are agreed)",
    ),
];

impl Hook {
    pub fn field_at(&self, off: u32) -> Option<&Field> {
        self.fields
            .iter()
            .find(|f| (f.offset..f.offset + f.size).contains(&off))
    }
}

const fn f(name: &'static str, offset: u32, size: u32, perm: Perm) -> Field {
    Field {
        name,
        offset,
        size,
        perm,
    }
}

use Perm::{Read as R, ReadWrite as RW};

/// `struct ncclbpf_tuner_ctx`.
pub const TUNER_FIELDS: &[Field] = &[
    f("msg_size", 0, 8, R),
    f("comm_id", 8, 8, R),
    f("coll_type", 16, 4, R),
    f("nranks", 20, 4, R),
    f("nnodes", 24, 4, R),
    f("num_pipe_ops", 28, 4, R),
    f("reg_buff", 32, 4, R),
    f("max_channels", 36, 4, R),
    f("algo", 40, 4, RW),
    f("proto", 44, 4, RW),
    f("nchannels", 48, 4, RW),
    f("usable", 52, 4, R),
    f("nccl_algo", 56, 4, R),
    f("nccl_proto", 60, 4, R),
];

/// `struct ncclbpf_net_ctx`.
pub const NET_FIELDS: &[Field] = &[
    f("conn_id", 0, 8, R),
    f("bytes", 8, 8, R),
    f("comm_id", 16, 8, R),
    f("op", 24, 4, R),
    f("peer_port", 28, 4, R),
    f("dev", 32, 4, R),
    f("nstreams", 36, 4, R),
    f("latency_ns", 40, 8, R),
    f("status", 48, 4, R),
    // Always 0 (the runtime fills the whole context): readable so that a copy of the context
    // (clang loads `status` and `reserved` as one 8-byte word) verifies.
    f("reserved", 52, 4, R),
];

/// `struct ncclbpf_tuner_chunk_ctx` (`tuner/chunk`).
pub const TUNER_CHUNK_FIELDS: &[Field] = &[
    f("msg_size", 0, 8, R),
    f("comm_id", 8, 8, R),
    f("coll_type", 16, 4, R),
    f("algo", 20, 4, R),
    f("proto", 24, 4, R),
    f("nchannels", 28, 4, R),
    f("nranks", 32, 4, R),
    f("nnodes", 36, 4, R),
    f("chunk_size", 40, 8, RW),
];

/// The tables of `ncclTunerConstants_v5_t` in `struct ncclbpf_tuner_init_ctx`: name and number
/// of 8-byte entries, in order from [`TUNER_INIT_TABLES_AT`].
pub const TUNER_INIT_TABLES: [(&str, u32); 7] = [
    ("base_latencies", 7 * 3),
    ("hw_latencies", 3 * 7 * 3),
    ("ll_max_bws", 4 * 3),
    ("per_ch_max_ring_ll128_bws", 4 * 3),
    ("per_ch_max_tree_ll128_bws", 4 * 3),
    ("per_ch_max_tree_bws", 4 * 3),
    ("per_ch_max_nvls_tree_bws", 4 * 3),
];
/// Where the constants start in the init context.
pub const TUNER_INIT_TABLES_AT: u32 = 32;
const TUNER_INIT_ENTRIES: usize = 21 + 63 + 5 * 12;
/// Size of `struct ncclbpf_tuner_init_ctx`: the header and NCCL's 1152 bytes of constants.
pub const TUNER_INIT_CTX_SIZE: u32 = TUNER_INIT_TABLES_AT + 8 * TUNER_INIT_ENTRIES as u32;

/// `struct ncclbpf_tuner_init_ctx` (`tuner/init`): a read-only header, then every constant as
/// its own writable 8-byte field (so a write is always one whole entry).
pub const TUNER_INIT_FIELDS: &[Field] = &tuner_init_fields();

const fn tuner_init_fields() -> [Field; 7 + TUNER_INIT_ENTRIES] {
    let mut out = [f("", 0, 0, R); 7 + TUNER_INIT_ENTRIES];
    out[0] = f("comm_id", 0, 8, R);
    out[1] = f("nranks", 8, 4, R);
    out[2] = f("nnodes", 12, 4, R);
    out[3] = f("nvl_domains", 16, 4, R);
    out[4] = f("min_ranks_per_nvl_domain", 20, 4, R);
    out[5] = f("max_ranks_per_nvl_domain", 24, 4, R);
    out[6] = f("reserved", 28, 4, R);
    let mut i = 7;
    let mut off = TUNER_INIT_TABLES_AT;
    let mut t = 0;
    while t < TUNER_INIT_TABLES.len() {
        let (name, n) = TUNER_INIT_TABLES[t];
        let mut k = 0;
        while k < n {
            out[i] = f(name, off, 8, RW);
            i += 1;
            off += 8;
            k += 1;
        }
        t += 1;
    }
    out
}

/// Words of the `tuner/epoch` state vector (`NCCLBPF_STATE_WORDS`).
pub const TUNER_EPOCH_STATE_WORDS: u32 = 32;
/// Where `state[]` starts in the epoch context.
pub const TUNER_EPOCH_STATE_AT: u32 = 48;
/// Where the net busy times follow `state[]` (appended, so that older objects' offsets hold).
pub const TUNER_EPOCH_NET_BUSY_AT: u32 = TUNER_EPOCH_STATE_AT + 8 * TUNER_EPOCH_STATE_WORDS;
/// Size of `struct ncclbpf_tuner_epoch_ctx`: a 48-byte header, `state[32]`, the net busy times.
pub const TUNER_EPOCH_CTX_SIZE: u32 = TUNER_EPOCH_NET_BUSY_AT + 16;

/// `struct ncclbpf_tuner_epoch_ctx` (`tuner/epoch`): a read-only header of agreed values, then
/// every word of `state[]` as its own writable 8-byte field.
pub const TUNER_EPOCH_FIELDS: &[Field] = &tuner_epoch_fields();

const fn tuner_epoch_fields() -> [Field; 9 + TUNER_EPOCH_STATE_WORDS as usize] {
    let mut out = [f("", 0, 0, R); 9 + TUNER_EPOCH_STATE_WORDS as usize];
    out[0] = f("comm_id", 0, 8, R);
    out[1] = f("epoch", 8, 8, R);
    out[2] = f("nranks", 16, 4, R);
    out[3] = f("colls", 20, 4, R);
    out[4] = f("duration_max_ns", 24, 8, R);
    out[5] = f("duration_min_ns", 32, 8, R);
    out[6] = f("bytes", 40, 8, R);
    let mut k = 0;
    while k < TUNER_EPOCH_STATE_WORDS {
        out[7 + k as usize] = f("state", TUNER_EPOCH_STATE_AT + 8 * k, 8, RW);
        k += 1;
    }
    let n = 7 + TUNER_EPOCH_STATE_WORDS as usize;
    out[n] = f("net_busy_max_ns", TUNER_EPOCH_NET_BUSY_AT, 8, R);
    out[n + 1] = f("net_busy_min_ns", TUNER_EPOCH_NET_BUSY_AT + 8, 8, R);
    out
}

/// `struct ncclbpf_profiler_ctx` (`profiler/*`): one event at its end, read-only.
pub const PROFILER_FIELDS: &[Field] = &[
    f("comm_id", 0, 8, R),
    f("seq", 8, 8, R),
    f("bytes", 16, 8, R),
    f("duration_ns", 24, 8, R),
    f("start_ns", 32, 8, R),
    f("event", 40, 4, R),
    f("coll", 44, 4, R),
    f("algo", 48, 4, R),
    f("proto", 52, 4, R),
    f("channel", 56, 4, R),
    f("peer", 60, 4, R),
    f("rank", 64, 4, R),
    f("nranks", 68, 4, R),
    f("nchannels", 72, 4, R),
    f("state", 76, 4, R),
    f("is_send", 80, 4, R),
    f("timed", 84, 4, R),
    f("user_tag", 88, 8, R),
    f("symmetric", 96, 4, R),
    f("reserved", 100, 4, R),
];

/// Size of `struct ncclbpf_profiler_ctx`.
pub const PROFILER_CTX_SIZE: u32 = 104;

/// The profiler's hooks, one per event type it follows.
pub const PROFILER_SECTIONS: [&str; 6] = [
    "profiler/coll",
    "profiler/p2p",
    "profiler/proxy_op",
    "profiler/proxy_step",
    "profiler/kernel_ch",
    "profiler/net",
];

const MAP_HELPERS: &[i32] = &[HELPER_MAP_LOOKUP, HELPER_MAP_UPDATE, HELPER_MAP_DELETE];
const NET_HELPERS: &[i32] = &[
    HELPER_MAP_LOOKUP,
    HELPER_MAP_UPDATE,
    HELPER_MAP_DELETE,
    HELPER_KTIME_GET_NS,
    HELPER_GET_SMP_PROCESSOR_ID,
];

const fn net(section: &'static str) -> Hook {
    Hook {
        section,
        ctx_size: 56,
        fields: NET_FIELDS,
        helpers: NET_HELPERS,
        helper_note: "",
        decides: false,
        local_fields: &[],
        views: false,
    }
}

/// A profiler hook: observes, decides nothing, so its maps are rank-local like the net hooks'
/// (a tuner program that reads them is refused by the locality rule).
const fn profiler(section: &'static str) -> Hook {
    Hook {
        section,
        ctx_size: PROFILER_CTX_SIZE,
        fields: PROFILER_FIELDS,
        helpers: NET_HELPERS,
        helper_note: "",
        decides: false,
        local_fields: &[],
        views: false,
    }
}

/// Every hook, by section name.
pub const HOOKS: &[Hook] = &[
    Hook {
        section: "tuner",
        ctx_size: 64,
        fields: TUNER_FIELDS,
        helpers: MAP_HELPERS,
        helper_note: "tuner decisions must be identical on every rank, so clocks and CPU ids are not available",
        decides: true,
        local_fields: TUNER_LOCAL_FIELDS,
        views: true,
    },
    Hook {
        section: "tuner/chunk",
        ctx_size: 48,
        fields: TUNER_CHUNK_FIELDS,
        helpers: MAP_HELPERS,
        helper_note: "every rank must compute the same chunk size, so clocks and CPU ids are not available",
        decides: true,
        local_fields: &[],
        views: false,
    },
    Hook {
        section: "tuner/init",
        ctx_size: TUNER_INIT_CTX_SIZE,
        fields: TUNER_INIT_FIELDS,
        helpers: MAP_HELPERS,
        helper_note: "every rank must write the same constants, so clocks and CPU ids are not available",
        decides: true,
        local_fields: &[],
        views: false,
    },
    Hook {
        section: "tuner/epoch",
        ctx_size: TUNER_EPOCH_CTX_SIZE,
        fields: TUNER_EPOCH_FIELDS,
        helpers: MAP_HELPERS,
        helper_note: "the epoch state must come out the same on every rank, so clocks and CPU ids are not available",
        decides: true,
        local_fields: &[],
        views: true,
    },
    net("net/connect"),
    net("net/accept"),
    net("net/isend"),
    net("net/irecv"),
    net("net/complete"),
    net("net/close"),
    profiler(PROFILER_SECTIONS[0]),
    profiler(PROFILER_SECTIONS[1]),
    profiler(PROFILER_SECTIONS[2]),
    profiler(PROFILER_SECTIONS[3]),
    profiler(PROFILER_SECTIONS[4]),
    profiler(PROFILER_SECTIONS[5]),
];

pub fn hook(section: &str) -> Option<&'static Hook> {
    HOOKS.iter().find(|h| h.section == section)
}

/// A map as the verifier sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapInfo {
    pub name: String,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub read_only: bool,
    /// Global data (`.rodata`/`.data`/`.bss`): the only maps an `lddw` may point into
    /// directly (src 2).
    pub global_data: bool,
    /// Who changes its contents: programs may write only [`Scope::Local`] maps, and tuner
    /// programs may not decide from them (nor, in hooks without the communicator's views, from
    /// maps that are [`per_comm`](Self::per_comm)).
    pub scope: Scope,
    /// An array (or per-CPU array): every key below `max_entries` has an entry, so whether a
    /// lookup finds one depends on the key alone, not on what any rank stored.
    pub array: bool,
}

impl MapInfo {
    /// Whether a program may write it.
    pub fn writable(&self) -> bool {
        !self.read_only && self.scope.program_writable()
    }

    /// Whether its contents are per communicator while the map is the process's: agreed maps
    /// (each communicator's agreement fills its own) and config maps other than `.rodata`
    /// (staged updates take effect at each communicator's own collective). The runtime keeps
    /// per-communicator views of agreed maps and of the config maps staged updates may change
    /// (arrays of u64 values); every config map but `.rodata` counts here, so that the rule
    /// does not hang on which config maps the runtime lets staged updates change. `.rodata`
    /// comes with the object and never changes.
    pub fn per_comm(&self) -> bool {
        match self.scope {
            Scope::Agreed => true,
            Scope::Config => !self.global_data,
            Scope::Local => false,
        }
    }
}

/// Limits of verification: the program's size and call depth, and the budget of one
/// verification ([`crate::budget`] says what each counts and why these defaults).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Instructions in the program.
    pub max_insns: usize,
    /// Instructions processed over all explored paths.
    pub max_processed: usize,
    /// States kept per pruning point (the oldest goes first).
    pub max_states_per_insn: usize,
    /// Nested BPF-to-BPF calls.
    pub max_call_depth: usize,
    /// States held at once: stored at pruning points or waiting to be explored.
    pub max_states: usize,
    /// Bytes of the states held at once.
    pub max_state_bytes: usize,
    /// Units of work: processed instructions, and the registers and slots of every
    /// comparison of a state against a stored one (deterministic: the same on every rank).
    pub max_work: u64,
    /// Wall-clock time of one verification: a backstop behind `max_work`.
    pub max_time: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_insns: 4096,
            max_processed: 1_000_000,
            max_states_per_insn: 64,
            max_call_depth: 8,
            max_states: 65_536,
            max_state_bytes: 64 << 20,
            max_work: 500_000_000,
            max_time: std::time::Duration::from_secs(5),
        }
    }
}

pub const STACK_SIZE: i64 = 512;
