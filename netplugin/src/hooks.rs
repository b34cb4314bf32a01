//! Per-operation observation points of the data path.
//!
//! Every operation on a comm passes through here: a connection opening (connect, accept), a
//! request posted (isend, irecv), completed or failed (in `test`), a connection closing. Each
//! point updates the per-connection counters in [`shared_maps::ConnTable`] and runs the
//! verified BPF program attached to that hook, if any.
//!
//! Programs come from the objects named by `NCCL_BPF_POLICY` (or its alias
//! `NCCL_BPF_NET_POLICY`): every program in a `net/*` section is attached to its hook. A policy that fails to load or verify is reported in
//! NCCL's log and the plugin carries on without it: traffic never depends on a policy.

use policy_runtime::setting::{self, Scope, Source};
use policy_runtime::{LoadOptions, LoadedProgram, NetCtx};
use shared_maps::{ConnDirection, ConnSlotGuard, ConnTable, Registry};
use std::sync::{LazyLock, OnceLock};
use std::time::Instant;

/// Connections tracked per process; more still work but are not counted.
pub const MAX_TRACKED_CONNS: usize = 4096;

static CONNS: LazyLock<ConnTable> = LazyLock::new(|| ConnTable::new(MAX_TRACKED_CONNS));

/// The process-wide per-connection table.
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

/// The tuner's sections, which the net side leaves to it.
const TUNER_SECTIONS: [&str; 2] = ["tuner", "tuner/init"];

// `op` values of `struct ncclbpf_net_ctx`.
const OP_CONNECT: u32 = 1;
const OP_ACCEPT: u32 = 2;
const OP_ISEND: u32 = 3;
const OP_IRECV: u32 = 4;
const OP_COMPLETE_SEND: u32 = 5;
const OP_COMPLETE_RECV: u32 = 6;
const OP_CLOSE: u32 = 7;

/// Programs attached to net hooks.
#[derive(Default)]
pub struct NetPolicies {
    by_hook: [Option<LoadedProgram>; 6],
}

impl NetPolicies {
    fn get(&self, h: NetHook) -> Option<&LoadedProgram> {
        self.by_hook[h as usize].as_ref()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hook.iter().all(Option::is_none)
    }

    /// Loads every `net/*` program of the objects `sources` name, first come per hook.
    /// Problems are returned as log lines; the programs that loaded are kept.
    pub fn load(sources: &[Source], registry: &Registry) -> (NetPolicies, Vec<String>) {
        let mut out = NetPolicies::default();
        let mut problems = vec![];
        let opts = LoadOptions::default();
        for src in sources.iter().filter(|s| s.scope != Scope::Tuner) {
            let path = &src.path;
            let obj = match std::fs::read(path)
                .map_err(|e| e.to_string())
                .and_then(|b| policy_object::Object::parse(&b).map_err(|e| e.to_string()))
            {
                Ok(o) => o,
                Err(e) => {
                    problems.push(format!("{}={path}: {e}", src.var));
                    continue;
                }
            };
            for p in &obj.programs {
                let net = HOOK_SECTIONS.iter().position(|s| *s == p.section);
                if net.is_none() && !TUNER_SECTIONS.contains(&p.section.as_str()) {
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
                match LoadedProgram::load(&obj, Some(&p.name), registry, &opts) {
                    Ok(lp) => out.by_hook[h] = Some(lp),
                    Err(e) => problems.push(format!("{path}: {e}")),
                }
            }
        }
        (out, problems)
    }
}

static POLICIES: OnceLock<NetPolicies> = OnceLock::new();

/// Loads the `net/*` programs of `NCCL_BPF_POLICY` (and `NCCL_BPF_NET_POLICY`) once per
/// process (later calls keep the first result).
pub fn init_policies() {
    POLICIES.get_or_init(|| {
        let sources = setting::sources();
        if sources.is_empty() {
            return NetPolicies::default();
        }
        let (p, problems) = NetPolicies::load(&sources, Registry::global());
        for m in problems {
            crate::nlog!(WARN, NET, "net policy: {m}");
        }
        for (h, prog) in p.by_hook.iter().enumerate() {
            if let Some(prog) = prog {
                crate::nlog!(
                    INFO,
                    NET,
                    "net policy: '{}' attached to {} ({} insns, verified in {:?}, {:?})",
                    prog.name,
                    HOOK_SECTIONS[h],
                    prog.stats.insns,
                    prog.times.verify,
                    prog.tier()
                );
            }
        }
        p
    });
}

fn policies() -> Option<&'static NetPolicies> {
    POLICIES.get().filter(|p| !p.is_empty())
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

/// The hooks of one connection end.
pub struct ConnHooks {
    slot: Option<ConnSlotGuard<'static>>,
    info: ConnInfo,
    policies: Option<&'static NetPolicies>,
}

impl ConnHooks {
    pub fn on_open(info: ConnInfo) -> ConnHooks {
        let h = ConnHooks {
            slot: CONNS.register(info.direction, info.conn_id, info.peer_port),
            info,
            policies: policies(),
        };
        let (hook, op) = match info.direction {
            ConnDirection::Send => (NetHook::Connect, OP_CONNECT),
            ConnDirection::Recv => (NetHook::Accept, OP_ACCEPT),
        };
        h.run(hook, op, 0, 0, 0);
        h
    }

    /// Whether completions need post times (a policy may read latencies).
    pub fn wants_time(&self) -> bool {
        self.policies.is_some()
    }

    fn run(&self, hook: NetHook, op: u32, bytes: u64, latency_ns: u64, status: i32) {
        let Some(prog) = self.policies.and_then(|p| p.get(hook)) else {
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
        prog.run(&mut ctx);
    }

    fn send(&self) -> bool {
        self.info.direction == ConnDirection::Send
    }

    /// A request was posted.
    pub fn on_post(&self, bytes: usize) {
        if let Some(s) = &self.slot {
            s.posted();
        }
        let (hook, op) = if self.send() {
            (NetHook::Isend, OP_ISEND)
        } else {
            (NetHook::Irecv, OP_IRECV)
        };
        self.run(hook, op, bytes as u64, 0, 0);
    }

    /// A request completed with `bytes` moved; `posted` is when it was posted (if timed).
    pub fn on_complete(&self, bytes: usize, posted: Option<Instant>) {
        if let Some(s) = &self.slot {
            s.completed(bytes as u64);
        }
        let latency = posted.map_or(0, |t| t.elapsed().as_nanos() as u64);
        let op = if self.send() {
            OP_COMPLETE_SEND
        } else {
            OP_COMPLETE_RECV
        };
        self.run(NetHook::Complete, op, bytes as u64, latency, 0);
    }

    /// A request failed with `code` (an `ncclResult_t`).
    pub fn on_error(&self, code: i32) {
        if let Some(s) = &self.slot {
            s.failed();
        }
        let op = if self.send() {
            OP_COMPLETE_SEND
        } else {
            OP_COMPLETE_RECV
        };
        self.run(NetHook::Complete, op, 0, 0, code);
    }

    /// The connection closes: its totals go to NCCL's log.
    pub fn on_close(&self) {
        if let Some(s) = &self.slot {
            let c = s.snapshot();
            let dir = if c.direction == ConnDirection::Send {
                "send"
            } else {
                "recv"
            };
            crate::nlog!(
                INFO,
                NET,
                "closed {dir} connection {:#018x} (peer port {}): {} bytes in {} messages, {} errors, {} in flight",
                c.conn_id,
                c.peer_port,
                c.bytes,
                c.messages,
                c.errors,
                c.inflight
            );
        }
        self.run(NetHook::Close, OP_CLOSE, 0, 0, 0);
    }
}
