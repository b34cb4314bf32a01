//! Per-operation observation points of the data path.
//!
//! Every operation on a comm passes through here: a connection opening (connect, accept), a
//! request posted (isend, irecv), completed or failed (in `test`), a connection closing. Each
//! point updates the connection's record in [`shared_maps::ConnTable`] and runs the verified
//! BPF program attached to that hook, if any.
//!
//! The table lives in shared memory (the runtime map `ncclbpf_conns`, see
//! [`shared_maps::conn_table`]), so `ncclbpf status` reads every connection's counters, pending
//! requests and time of last progress from outside, also while this process is stuck inside a
//! collective. Its cost on the data path: a post reads the coarse clock (vDSO) only when the
//! connection becomes busy, a completion reads it once; every other update is a relaxed store.
//!
//! Programs come from the objects named by `NCCL_BPF_POLICY` (or its alias
//! `NCCL_BPF_NET_POLICY`): every program in a `net/*` section is attached to its hook. A policy that fails to load or verify is reported in
//! NCCL's log and the plugin carries on without it: traffic never depends on a policy.
//!
//! The six hooks' programs form one [`NetSet`], replaced as a whole by a reload (the control
//! socket, [`crate::control`]): each connection end holds a [`Handle`] on it, so a hook call
//! costs one atomic load to learn that nothing changed, runs one whole version of the set, and
//! an old set (its JIT code, its map references) is freed once every connection end has moved
//! on from it. A hook with no program at start can get one by reload.

use ncclbpf_agreement::net_busy::BusyClock;
pub use policy_runtime::setting::is_tuner_section;
use policy_runtime::setting::{self, Scope, Source};
use policy_runtime::{Handle, LoadOptions, LoadedProgram, NetCtx, Swappable};
use shared_maps::{ConnDirection, ConnLabels, ConnSlotGuard, ConnTable, ProgressMark, Registry};
use std::net::IpAddr;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Instant;

/// Connections tracked per process; more still work but are not counted.
pub const MAX_TRACKED_CONNS: usize = 4096;

static CONNS: LazyLock<ConnTable> = LazyLock::new(|| {
    ConnTable::shared(Registry::global(), MAX_TRACKED_CONNS).unwrap_or_else(|e| {
        crate::nlog!(
            WARN,
            NET,
            "per-connection table: {e}; connections are counted in private memory, which \
             ncclbpf status cannot read"
        );
        ConnTable::new(MAX_TRACKED_CONNS)
    })
});

/// The process-wide per-connection table (in shared memory when it could be made).
pub fn conn_table() -> &'static ConnTable {
    &CONNS
}

/// The hooks, in `NCCLBPF_OP_*` order of `ncclbpf.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetHook {
    Connect = 0,
    Accept = 1,
    Isend = 2,
    Irecv = 3,
    Complete = 4,
    Close = 5,
}

pub const HOOK_SECTIONS: [&str; 6] = [
    "net/connect",
    "net/accept",
    "net/isend",
    "net/irecv",
    "net/complete",
    "net/close",
];

/// The hook a section names, if it is a net hook.
pub fn hook_of(section: &str) -> Option<usize> {
    HOOK_SECTIONS.iter().position(|s| *s == section)
}

// `op` values of `struct ncclbpf_net_ctx`.
const OP_CONNECT: u32 = 1;
const OP_ACCEPT: u32 = 2;
const OP_ISEND: u32 = 3;
const OP_IRECV: u32 = 4;
const OP_COMPLETE_SEND: u32 = 5;
const OP_COMPLETE_RECV: u32 = 6;
const OP_CLOSE: u32 = 7;

/// A program attached to a hook, and where it came from.
pub struct Attached {
    pub prog: LoadedProgram,
    /// The object it was loaded from.
    pub source: String,
    /// The [`NetSet`] generation that attached it (1: at start).
    pub generation: u64,
    /// A hash of its section and instructions as in the object (before map binding): the same
    /// program has the same tag, whatever process loaded it.
    pub tag: u64,
    /// Whether some load of the program may read `latency_ns` (the verifier's
    /// `Stats::reads_ctx`): only then are requests timed,
    /// two clock reads per request that a program like `conn_counter` never looks at.
    pub reads_latency: bool,
}

impl Attached {
    pub fn new(
        prog: LoadedProgram,
        obj: &policy_object::Object,
        source: &str,
        generation: u64,
    ) -> Attached {
        let tag = obj
            .program(&prog.name)
            .map_or(0, |p| program_tag(&p.section, &p.insns));
        let mut prog = prog;
        prog.tag = generation;
        let reads_latency = prog.stats.reads_ctx(
            std::mem::offset_of!(NetCtx, latency_ns) as u32,
            size_of::<u64>() as u32,
        );
        Attached {
            prog,
            source: source.to_string(),
            generation,
            tag,
            reads_latency,
        }
    }
}

/// 64 bits of BLAKE3 over the section name and the encoded instructions.
pub fn program_tag(section: &str, insns: &[policy_object::insn::Insn]) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(section.as_bytes());
    h.update(&[0]);
    for i in insns {
        h.update(&i.encode());
    }
    let b = h.finalize();
    u64::from_be_bytes(b.as_bytes()[..8].try_into().expect("32-byte hash"))
}

/// The programs of the six net hooks; a reload replaces the whole set at once.
#[derive(Clone, Default)]
pub struct NetSet {
    pub by_hook: [Option<Arc<Attached>>; 6],
}

impl NetSet {
    pub fn is_empty(&self) -> bool {
        self.by_hook.iter().all(Option::is_none)
    }

    /// Loads every `net/*` program of the objects `sources` name, first come per hook, as
    /// generation 1. Problems are returned as log lines; the programs that loaded are kept.
    pub fn load(sources: &[Source], registry: &Registry) -> (NetSet, Vec<String>) {
        let mut out = NetSet::default();
        let mut problems = vec![];
        let opts = LoadOptions::default();
        // Objects whose maps conflict with an earlier listed object's: refused on every side.
        let refused = setting::declaration_conflicts(sources);
        for src in sources.iter().filter(|s| s.scope != Scope::Tuner) {
            let path = &src.path;
            if let Some(why) = refused.get(path) {
                problems.push(why.clone());
                continue;
            }
            let obj = match src.read_object() {
                Ok(o) => o,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            for p in &obj.programs {
                let net = hook_of(&p.section);
                if net.is_none()
                    && !is_tuner_section(&p.section)
                    && !setting::is_profiler_section(&p.section)
                {
                    problems.push(format!(
                        "{path}: program '{}' in section '{}' attaches to no hook; ignored",
                        p.name, p.section
                    ));
                }
                let Some(h) = net.filter(|_| src.scope.wants(&p.section)) else {
                    continue;
                };
                if out.by_hook[h].is_some() {
                    problems.push(format!(
                        "{path}: a second program for {} ('{}') ignored",
                        p.section, p.name
                    ));
                    continue;
                }
                match LoadedProgram::load_as(&obj, Some(&p.name), path, registry, &opts) {
                    Ok(lp) => out.by_hook[h] = Some(Arc::new(Attached::new(lp, &obj, path, 1))),
                    Err(e) => problems.push(format!("{path}: {e}")),
                }
            }
        }
        (out, problems)
    }
}

static NET: OnceLock<Swappable<NetSet>> = OnceLock::new();

/// The process's net programs: on first use, the `net/*` programs of `NCCL_BPF_POLICY` (and
/// `NCCL_BPF_NET_POLICY`), problems logged.
pub fn net() -> &'static Swappable<NetSet> {
    NET.get_or_init(|| {
        let sources = setting::sources();
        if sources.is_empty() || crate::plugin::backend_only() {
            return Swappable::new(NetSet::default());
        }
        let (set, problems) = NetSet::load(&sources, Registry::global());
        for m in problems {
            crate::nlog!(WARN, NET, "net policy: {m}");
        }
        for (h, a) in set.by_hook.iter().enumerate() {
            if let Some(a) = a {
                crate::nlog!(
                    INFO,
                    NET,
                    "net policy: '{}' attached to {} ({} insns, verified in {:?}, {:?})",
                    a.prog.name,
                    HOOK_SECTIONS[h],
                    a.prog.stats.insns,
                    a.prog.times.verify,
                    a.prog.tier()
                );
            }
        }
        Swappable::new(set)
    })
}

/// Loads the `net/*` programs of `NCCL_BPF_POLICY` (and `NCCL_BPF_NET_POLICY`) once per
/// process (later calls keep the first result; reloads replace it).
pub fn init_policies() {
    net();
}

/// What a connection end tells its hooks about itself.
#[derive(Clone, Copy, Debug)]
pub struct ConnInfo {
    pub direction: ConnDirection,
    pub conn_id: u64,
    pub peer_port: u16,
    pub dev: u32,
    /// The communicator's hash (net v11+), 0 when NCCL gives none.
    pub comm_id: u64,
    pub nstreams: u32,
}

/// The hooks of one connection end. Its methods take `&mut self`: the comm calls them under
/// its state lock (or owning the comm), which is what lets the handle cache the set.
pub struct ConnHooks {
    slot: Option<ConnSlotGuard<'static>>,
    info: ConnInfo,
    net: Handle<NetSet>,
    /// The communicator's busy clock (net v11+: NCCL names the communicator), shared by all
    /// its connection ends; `inflight` is this end's share of the requests it counts.
    busy: Option<Arc<BusyClock>>,
    inflight: u64,
}

/// Where the two ends of a connection's control stream are, as far as this end knows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ends {
    pub peer_ip: Option<IpAddr>,
    /// This end's port (the other end's peer port), 0 if unknown.
    pub local_port: u16,
}

impl ConnHooks {
    /// [`Self::on_open_at`] with the peer's address and the local port unknown.
    pub fn on_open(info: ConnInfo) -> ConnHooks {
        ConnHooks::on_open_at(info, Ends::default())
    }

    /// Hooks that observe nothing: no record, no programs (a side channel's, whose wrapped
    /// connection is observed instead).
    pub fn quiet(info: ConnInfo) -> ConnHooks {
        static NONE: LazyLock<Swappable<NetSet>> =
            LazyLock::new(|| Swappable::new(NetSet::default()));
        ConnHooks {
            slot: None,
            info,
            net: NONE.handle(),
            busy: None,
            inflight: 0,
        }
    }

    /// A connection end opens: claims its record (labelled with `info` and `ends`) and runs
    /// the connect or accept program.
    pub fn on_open_at(info: ConnInfo, ends: Ends) -> ConnHooks {
        let labels = ConnLabels {
            direction: info.direction,
            conn_id: info.conn_id,
            comm_id: info.comm_id,
            dev: info.dev,
            peer_ip: ends.peer_ip,
            peer_port: info.peer_port,
            local_port: ends.local_port,
        };
        // A plain backend for another copy of ncclbpf counts nothing: the outer copy does.
        let counted = !crate::plugin::backend_only();
        let mut h = ConnHooks {
            slot: if counted {
                CONNS.register(&labels)
            } else {
                None
            },
            info,
            net: net().handle(),
            busy: if counted {
                ncclbpf_agreement::net_busy::clock(info.comm_id)
            } else {
                None
            },
            inflight: 0,
        };
        let (hook, op) = match info.direction {
            ConnDirection::Send => (NetHook::Connect, OP_CONNECT),
            ConnDirection::Recv => (NetHook::Accept, OP_ACCEPT),
        };
        h.run(hook, op, 0, 0, 0);
        h
    }

    /// Stamps this connection's progress from a helper thread (a chunk moved); `None` when
    /// the connection has no record (the table was full). Must not outlive the hooks: the
    /// comm joins its helpers before it drops them.
    pub fn progress_mark(&self) -> Option<ProgressMark<'static>> {
        self.slot.as_ref().map(ConnSlotGuard::progress_mark)
    }

    /// Whether any net program is attached (the whole set, as this connection sees it now).
    pub fn has_programs(&mut self) -> bool {
        !self.net.get().is_empty()
    }

    /// Whether completions need post times (the completion program may read latencies).
    #[inline]
    pub fn wants_time(&mut self) -> bool {
        self.net.get().by_hook[NetHook::Complete as usize]
            .as_ref()
            .is_some_and(|a| a.reads_latency)
    }

    #[inline]
    fn run(&mut self, hook: NetHook, op: u32, bytes: u64, latency_ns: u64, status: i32) {
        let Some(a) = &self.net.get().by_hook[hook as usize] else {
            return;
        };
        let mut ctx = NetCtx {
            conn_id: self.info.conn_id,
            bytes,
            comm_id: self.info.comm_id,
            op,
            peer_port: u32::from(self.info.peer_port),
            dev: self.info.dev,
            nstreams: self.info.nstreams,
            latency_ns,
            status,
            reserved: 0,
        };
        a.prog.run(&mut ctx);
        // Counted for outside readers (ncclbpf_policy_runs_total); open and close run once.
        if let Some(s) = &self.slot
            && matches!(hook, NetHook::Isend | NetHook::Irecv | NetHook::Complete)
        {
            s.ran(hook == NetHook::Complete);
        }
    }

    fn send(&self) -> bool {
        self.info.direction == ConnDirection::Send
    }

    /// A request was posted.
    pub fn on_post(&mut self, bytes: usize) {
        if let Some(s) = &self.slot {
            s.posted();
        }
        if let Some(b) = &self.busy {
            b.start();
            self.inflight += 1;
        }
        let (hook, op) = if self.send() {
            (NetHook::Isend, OP_ISEND)
        } else {
            (NetHook::Irecv, OP_IRECV)
        };
        self.run(hook, op, bytes as u64, 0, 0);
    }

    /// A request completed with `bytes` moved; `posted` is when it was posted (if timed).
    pub fn on_complete(&mut self, bytes: usize, posted: Option<Instant>) {
        if let Some(s) = &self.slot {
            s.completed(bytes as u64);
        }
        self.request_ended();
        let latency = posted.map_or(0, |t| t.elapsed().as_nanos() as u64);
        let op = if self.send() {
            OP_COMPLETE_SEND
        } else {
            OP_COMPLETE_RECV
        };
        self.run(NetHook::Complete, op, bytes as u64, latency, 0);
    }

    /// A request failed with `code` (an `ncclResult_t`).
    pub fn on_error(&mut self, code: i32) {
        if let Some(s) = &self.slot {
            s.failed();
        }
        self.request_ended();
        let op = if self.send() {
            OP_COMPLETE_SEND
        } else {
            OP_COMPLETE_RECV
        };
        self.run(NetHook::Complete, op, 0, 0, code);
    }

    /// One of this end's requests is over (done or failed): the busy clock may stop.
    fn request_ended(&mut self) {
        if let Some(b) = &self.busy
            && self.inflight > 0
        {
            self.inflight -= 1;
            b.end();
        }
    }

    /// The connection closes: its totals go to NCCL's log.
    pub fn on_close(&mut self) {
        if let Some(s) = &self.slot {
            let c = s.snapshot();
            crate::nlog!(
                INFO,
                NET,
                "closed {} connection {:#018x} (peer {}): {} bytes in {} messages, {} errors, {} in flight",
                c.direction.name(),
                c.conn_id,
                c.peer_text(),
                c.bytes,
                c.messages,
                c.errors,
                c.inflight
            );
        }
        self.run(NetHook::Close, OP_CLOSE, 0, 0, 0);
    }
}

impl Drop for ConnHooks {
    /// Requests still in flight when the end goes away will not complete: they stop counting
    /// toward the communicator's busy time.
    fn drop(&mut self) {
        while self.inflight > 0 {
            self.request_ended();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(name: &str) -> NetSet {
        let path = ncclbpf_policies::object(&format!("src/{name}.o")).unwrap();
        let reg = Registry::new(
            std::env::temp_dir().join(format!("ncclbpf-hooks-test-{}-{name}", std::process::id())),
        );
        let src = Source {
            path: path.display().to_string(),
            var: "NCCL_BPF_POLICY",
            scope: Scope::All,
        };
        let (set, problems) = NetSet::load(&[src], &reg);
        assert!(problems.is_empty(), "{problems:?}");
        set
    }

    /// Requests are timed only for a completion program that reads `latency_ns`: `net_stats`
    /// (its latency histogram) does, `conn_counter` does not.
    #[test]
    fn requests_are_timed_only_for_programs_that_read_latencies() {
        let complete = NetHook::Complete as usize;
        let stats = loaded("net_stats");
        let counter = loaded("conn_counter");
        let a = stats.by_hook[complete]
            .as_ref()
            .expect("net_stats has net/complete");
        let b = counter.by_hook[complete]
            .as_ref()
            .expect("conn_counter has net/complete");
        assert!(a.reads_latency, "net_stats reads latency_ns");
        assert!(!b.reads_latency, "conn_counter does not");
    }
}
