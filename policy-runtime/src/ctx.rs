//! The contexts programs receive, laid out as `policies/include/ncclbpf.h` declares them.

/// `struct ncclbpf_tuner_ctx`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunerCtx {
    pub msg_size: u64,
    pub comm_id: u64,
    pub coll_type: u32,
    pub nranks: u32,
    pub nnodes: u32,
    pub num_pipe_ops: u32,
    pub reg_buff: u32,
    pub max_channels: u32,
    pub algo: i32,
    pub proto: i32,
    pub nchannels: u32,
    /// Bit `a * 3 + p`: NCCL's cost table lets it run algorithm `a` with protocol `p` for this
    /// collective (0: no table, e.g. tuner ABI v2). Filled only for programs that read it.
    pub usable: u32,
    /// What NCCL would pick without the tuner: the first cheapest usable table entry (-1 when
    /// not known). Filled only for programs that read them.
    pub nccl_algo: i32,
    pub nccl_proto: i32,
}

impl TunerCtx {
    /// Where the fields computed from NCCL's cost table start ([`TunerCtx::usable`]), and
    /// their length: a program that reads none of them gets them unfilled.
    pub const TABLE_FIELDS: (u32, u32) = (52, 12);
}

/// `struct ncclbpf_net_ctx`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCtx {
    pub conn_id: u64,
    pub bytes: u64,
    pub comm_id: u64,
    pub op: u32,
    pub peer_port: u32,
    pub dev: u32,
    pub nstreams: u32,
    pub latency_ns: u64,
    pub status: i32,
    pub reserved: u32,
}

/// `struct ncclbpf_tuner_chunk_ctx` (`tuner/chunk`, tuner ABI v6 `getChunkSize`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunerChunkCtx {
    pub msg_size: u64,
    pub comm_id: u64,
    pub coll_type: u32,
    pub algo: i32,
    pub proto: i32,
    pub nchannels: u32,
    pub nranks: u32,
    pub nnodes: u32,
    pub chunk_size: u64,
}

/// Entries of `ncclTunerConstants_v5_t` (all `double`), in NCCL's order.
pub const TUNER_CONSTANTS: usize = 144;

/// `struct ncclbpf_tuner_init_ctx` (`tuner/init`, tuner ABI v5+ `init`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TunerInitCtx {
    pub comm_id: u64,
    pub nranks: u32,
    pub nnodes: u32,
    pub nvl_domains: i32,
    pub min_ranks_per_nvl_domain: i32,
    pub max_ranks_per_nvl_domain: i32,
    pub reserved: u32,
    /// `ncclTunerConstants_v5_t` as NCCL lays it out.
    pub constants: [f64; TUNER_CONSTANTS],
}

impl Default for TunerInitCtx {
    fn default() -> Self {
        TunerInitCtx {
            comm_id: 0,
            nranks: 0,
            nnodes: 0,
            nvl_domains: 0,
            min_ranks_per_nvl_domain: 0,
            max_ranks_per_nvl_domain: 0,
            reserved: 0,
            constants: [0.0; TUNER_CONSTANTS],
        }
    }
}

/// Words of the `tuner/epoch` state vector.
pub const EPOCH_STATE_WORDS: usize = 32;

/// `struct ncclbpf_tuner_epoch_ctx` (`tuner/epoch`): what the agreement combined for one epoch
/// of a communicator, and the communicator's agreed state, which the program updates.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunerEpochCtx {
    pub comm_id: u64,
    /// The epoch whose records were just combined.
    pub epoch: u64,
    /// Records combined.
    pub nranks: u32,
    /// Collectives per epoch (K).
    pub colls: u32,
    /// The slowest rank's wall time for the epoch.
    pub duration_max_ns: u64,
    /// The fastest rank's.
    pub duration_min_ns: u64,
    /// Bytes of the epoch's collectives (`msg_size` summed).
    pub bytes: u64,
    /// The communicator's agreed state, kept from the last run (zero at first); the program
    /// reads and writes it.
    pub state: [u64; EPOCH_STATE_WORDS],
    /// The most any rank's net connections of the communicator had a request in flight
    /// during the epoch (`ncclbpf_agreement::net_busy`; after `state`, so that the header's
    /// offsets stay those of objects built before it).
    pub net_busy_max_ns: u64,
    /// The least (0 where some rank has no net busy time: net v7–v10, or no net connections).
    pub net_busy_min_ns: u64,
}

impl TunerEpochCtx {
    /// `state` as bytes, in memory order: what the object's state map
    /// (`NCCLBPF_AGREED_STATE`) holds, entry `k` at bytes `k * value_size ..`.
    pub fn state_bytes(&self) -> [u8; EPOCH_STATE_WORDS * 8] {
        let mut out = [0u8; EPOCH_STATE_WORDS * 8];
        for (chunk, w) in out.chunks_exact_mut(8).zip(&self.state) {
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        out
    }
}

/// `struct ncclbpf_profiler_ctx` (`profiler/coll`, `profiler/p2p`, `profiler/proxy_op`,
/// `profiler/proxy_step`, `profiler/kernel_ch`, `profiler/net`): one event, at its end. Read-only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfilerCtx {
    pub comm_id: u64,
    /// Collectives: NCCL's sequence number of the collective (per function); proxy steps: the
    /// step; 0 otherwise.
    pub seq: u64,
    /// Collectives and p2p: the operation's bytes (as the tuner counts them); proxy ops: steps
    /// × chunk size; proxy steps: bytes transferred.
    pub bytes: u64,
    /// Collectives, p2p and kernel channels: GPU execution time; the others: host time from
    /// start to stop (ns).
    pub duration_ns: u64,
    /// When it started: the GPU's globaltimer for collectives, p2p and kernel channels, the
    /// host's `CLOCK_MONOTONIC` for the others (ns).
    pub start_ns: u64,
    /// `NCCLBPF_PROF_*`.
    pub event: u32,
    /// NCCL's `ncclFunc_t` of the collective (15: other or not known).
    pub coll: u32,
    pub algo: i32,
    pub proto: i32,
    pub channel: u32,
    pub peer: i32,
    pub rank: u32,
    pub nranks: u32,
    pub nchannels: u32,
    /// The last state recorded for the event (-1: none).
    pub state: i32,
    pub is_send: u32,
    /// 1 when `duration_ns` was measured (0: the GPU times were missing).
    pub timed: u32,
    /// Collectives and p2p: the caller's per-call profiler tag (NCCL 2.31+, profiler v7; 0:
    /// untagged or an older NCCL).
    pub user_tag: u64,
    /// Collectives: 1 for a symmetric-memory kernel (profiler v7; `algo` and `proto` are -1).
    pub symmetric: u32,
    /// 0 (keeps the struct without padding).
    pub reserved: u32,
}

/// A context a program can run on.
pub trait Context {
    /// Which hooks' programs take this context.
    const KIND: CtxKind;
    /// Whether programs of this section take this context.
    fn accepts(section: &str) -> bool {
        CtxKind::of(section) == Some(Self::KIND)
    }
    fn as_mut_ptr(&mut self) -> *mut u8;
}

/// The context a section's programs take, decided once at load so that a call compares one
/// byte instead of the section's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtxKind {
    Tuner,
    TunerChunk,
    TunerInit,
    TunerEpoch,
    Net,
    Profiler,
}

impl CtxKind {
    pub fn of(section: &str) -> Option<CtxKind> {
        match section {
            "tuner" => Some(CtxKind::Tuner),
            "tuner/chunk" => Some(CtxKind::TunerChunk),
            "tuner/init" => Some(CtxKind::TunerInit),
            "tuner/epoch" => Some(CtxKind::TunerEpoch),
            s if s.starts_with("net/") => Some(CtxKind::Net),
            s if s.starts_with("profiler/") => Some(CtxKind::Profiler),
            _ => None,
        }
    }
}

impl Context for TunerCtx {
    const KIND: CtxKind = CtxKind::Tuner;
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self as *mut TunerCtx as *mut u8
    }
}

impl Context for TunerChunkCtx {
    const KIND: CtxKind = CtxKind::TunerChunk;
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self as *mut TunerChunkCtx as *mut u8
    }
}

impl Context for TunerInitCtx {
    const KIND: CtxKind = CtxKind::TunerInit;
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self as *mut TunerInitCtx as *mut u8
    }
}

impl Context for TunerEpochCtx {
    const KIND: CtxKind = CtxKind::TunerEpoch;
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self as *mut TunerEpochCtx as *mut u8
    }
}

impl Context for ProfilerCtx {
    const KIND: CtxKind = CtxKind::Profiler;
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self as *mut ProfilerCtx as *mut u8
    }
}

impl Context for NetCtx {
    const KIND: CtxKind = CtxKind::Net;
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self as *mut NetCtx as *mut u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy_verifier::platform::{
        NET_FIELDS, TUNER_CHUNK_FIELDS, TUNER_FIELDS, TUNER_INIT_TABLES_AT, hook,
    };
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_verifier_tables() {
        assert_eq!(
            size_of::<TunerCtx>() as u32,
            hook("tuner").unwrap().ctx_size
        );
        assert_eq!(
            size_of::<NetCtx>() as u32,
            hook("net/isend").unwrap().ctx_size
        );
        let t = [
            offset_of!(TunerCtx, msg_size),
            offset_of!(TunerCtx, comm_id),
            offset_of!(TunerCtx, coll_type),
            offset_of!(TunerCtx, nranks),
            offset_of!(TunerCtx, nnodes),
            offset_of!(TunerCtx, num_pipe_ops),
            offset_of!(TunerCtx, reg_buff),
            offset_of!(TunerCtx, max_channels),
            offset_of!(TunerCtx, algo),
            offset_of!(TunerCtx, proto),
            offset_of!(TunerCtx, nchannels),
            offset_of!(TunerCtx, usable),
            offset_of!(TunerCtx, nccl_algo),
            offset_of!(TunerCtx, nccl_proto),
        ];
        assert_eq!(
            TunerCtx::TABLE_FIELDS,
            (offset_of!(TunerCtx, usable) as u32, 12)
        );
        assert_eq!(t.len(), TUNER_FIELDS.len());
        for (o, f) in t.iter().zip(TUNER_FIELDS) {
            assert_eq!(*o as u32, f.offset, "{}", f.name);
        }
        let n = [
            offset_of!(NetCtx, conn_id),
            offset_of!(NetCtx, bytes),
            offset_of!(NetCtx, comm_id),
            offset_of!(NetCtx, op),
            offset_of!(NetCtx, peer_port),
            offset_of!(NetCtx, dev),
            offset_of!(NetCtx, nstreams),
            offset_of!(NetCtx, latency_ns),
            offset_of!(NetCtx, status),
            offset_of!(NetCtx, reserved),
        ];
        assert_eq!(n.len(), NET_FIELDS.len());
        for (o, f) in n.iter().zip(NET_FIELDS) {
            assert_eq!(*o as u32, f.offset, "{}", f.name);
        }
        assert_eq!(
            size_of::<TunerChunkCtx>() as u32,
            hook("tuner/chunk").unwrap().ctx_size
        );
        let c = [
            offset_of!(TunerChunkCtx, msg_size),
            offset_of!(TunerChunkCtx, comm_id),
            offset_of!(TunerChunkCtx, coll_type),
            offset_of!(TunerChunkCtx, algo),
            offset_of!(TunerChunkCtx, proto),
            offset_of!(TunerChunkCtx, nchannels),
            offset_of!(TunerChunkCtx, nranks),
            offset_of!(TunerChunkCtx, nnodes),
            offset_of!(TunerChunkCtx, chunk_size),
        ];
        assert_eq!(c.len(), TUNER_CHUNK_FIELDS.len());
        for (o, f) in c.iter().zip(TUNER_CHUNK_FIELDS) {
            assert_eq!(*o as u32, f.offset, "{}", f.name);
        }
        let init = hook("tuner/init").unwrap();
        assert_eq!(size_of::<TunerInitCtx>() as u32, init.ctx_size);
        assert_eq!(
            size_of::<TunerInitCtx>(),
            32 + 1152,
            "NCCL's constants are 1152 bytes"
        );
        assert_eq!(
            offset_of!(TunerInitCtx, constants) as u32,
            TUNER_INIT_TABLES_AT
        );
        // Every constant is one writable 8-byte field, in order.
        let writable: Vec<_> = init
            .fields
            .iter()
            .filter(|f| f.perm == policy_verifier::platform::Perm::ReadWrite)
            .collect();
        assert_eq!(writable.len(), TUNER_CONSTANTS);
        for (i, f) in writable.iter().enumerate() {
            assert_eq!((f.offset, f.size), (TUNER_INIT_TABLES_AT + 8 * i as u32, 8));
        }
        assert_eq!(writable[21].name, "hw_latencies");
        assert_eq!(writable[84].name, "ll_max_bws");
    }

    #[test]
    fn the_profiler_context_matches_the_verifier_table() {
        use policy_verifier::platform::{PROFILER_FIELDS, PROFILER_SECTIONS};
        for s in PROFILER_SECTIONS {
            let h = hook(s).unwrap();
            assert_eq!(size_of::<ProfilerCtx>() as u32, h.ctx_size, "{s}");
            assert!(!h.decides, "{s} observes only");
            assert_eq!(CtxKind::of(s), Some(CtxKind::Profiler));
        }
        let o = [
            offset_of!(ProfilerCtx, comm_id),
            offset_of!(ProfilerCtx, seq),
            offset_of!(ProfilerCtx, bytes),
            offset_of!(ProfilerCtx, duration_ns),
            offset_of!(ProfilerCtx, start_ns),
            offset_of!(ProfilerCtx, event),
            offset_of!(ProfilerCtx, coll),
            offset_of!(ProfilerCtx, algo),
            offset_of!(ProfilerCtx, proto),
            offset_of!(ProfilerCtx, channel),
            offset_of!(ProfilerCtx, peer),
            offset_of!(ProfilerCtx, rank),
            offset_of!(ProfilerCtx, nranks),
            offset_of!(ProfilerCtx, nchannels),
            offset_of!(ProfilerCtx, state),
            offset_of!(ProfilerCtx, is_send),
            offset_of!(ProfilerCtx, timed),
            offset_of!(ProfilerCtx, user_tag),
            offset_of!(ProfilerCtx, symmetric),
            offset_of!(ProfilerCtx, reserved),
        ];
        assert_eq!(o.len(), PROFILER_FIELDS.len());
        for (o, f) in o.iter().zip(PROFILER_FIELDS) {
            assert_eq!(*o as u32, f.offset, "{}", f.name);
            assert_eq!(f.perm, policy_verifier::platform::Perm::Read, "{}", f.name);
        }
    }

    #[test]
    fn the_epoch_context_matches_the_verifier_table() {
        use policy_verifier::platform::{Field, Perm, TUNER_EPOCH_FIELDS, TUNER_EPOCH_STATE_AT};
        let h = hook("tuner/epoch").unwrap();
        assert_eq!(size_of::<TunerEpochCtx>() as u32, h.ctx_size);
        assert_eq!(size_of::<TunerEpochCtx>(), 320);
        let header = [
            ("comm_id", offset_of!(TunerEpochCtx, comm_id), 8),
            ("epoch", offset_of!(TunerEpochCtx, epoch), 8),
            ("nranks", offset_of!(TunerEpochCtx, nranks), 4),
            ("colls", offset_of!(TunerEpochCtx, colls), 4),
            (
                "duration_max_ns",
                offset_of!(TunerEpochCtx, duration_max_ns),
                8,
            ),
            (
                "duration_min_ns",
                offset_of!(TunerEpochCtx, duration_min_ns),
                8,
            ),
            ("bytes", offset_of!(TunerEpochCtx, bytes), 8),
            (
                "net_busy_max_ns",
                offset_of!(TunerEpochCtx, net_busy_max_ns),
                8,
            ),
            (
                "net_busy_min_ns",
                offset_of!(TunerEpochCtx, net_busy_min_ns),
                8,
            ),
        ];
        let (ro, rw): (Vec<&Field>, Vec<&Field>) = TUNER_EPOCH_FIELDS
            .iter()
            .partition(|f| f.perm == Perm::Read);
        assert_eq!(ro.len(), header.len());
        for ((name, off, size), f) in header.iter().zip(&ro) {
            assert_eq!((*name, *off as u32, *size), (f.name, f.offset, f.size));
        }
        assert_eq!(
            offset_of!(TunerEpochCtx, state) as u32,
            TUNER_EPOCH_STATE_AT
        );
        assert_eq!(rw.len(), EPOCH_STATE_WORDS);
        for (i, f) in rw.iter().enumerate() {
            assert_eq!(
                (f.name, f.offset, f.size),
                ("state", TUNER_EPOCH_STATE_AT + 8 * i as u32, 8)
            );
        }
        assert_eq!(CtxKind::of("tuner/epoch"), Some(CtxKind::TunerEpoch));
        assert!(TunerEpochCtx::accepts("tuner/epoch") && !TunerEpochCtx::accepts("tuner"));
        let mut c = TunerEpochCtx::default();
        c.state[1] = 0x0102;
        let b = c.state_bytes();
        assert_eq!(&b[8..16], &0x0102u64.to_ne_bytes());
    }
}
