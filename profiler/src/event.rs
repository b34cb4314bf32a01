//! What an event is, in our own types: the adapters (`plugin/src/profiler.rs`) copy NCCL's
//! descriptor into a [`Descr`] before anything else looks at it, so no raw pointer of NCCL's
//! outlives the call that passed it.

use crate::handles::Handle;
use ncclnet_headers::profiler::event;

/// NCCL's collective names (`ncclFuncToString`), as `ncclFunc_t` values; [`FUNC_OTHER`] for
/// any other.
pub const FUNCS: [(&str, u8); 11] = [
    ("Broadcast", 0),
    ("Reduce", 1),
    ("AllGather", 2),
    ("ReduceScatter", 3),
    ("AllReduce", 4),
    ("SendRecv", 5),
    ("Send", 6),
    ("Recv", 7),
    ("AlltoAll", 8),
    ("Scatter", 9),
    ("Gather", 10),
];
pub const FUNC_OTHER: u8 = 15;

/// `ncclAlgoToString` names, as NCCL's algorithm numbers.
pub const ALGOS: [&str; 7] = [
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];
/// `ncclProtoToString` names, as NCCL's protocol numbers.
pub const PROTOS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

/// `ncclDatatypeToString` names and sizes in bytes (`ncclUint8` has no name of its own in
/// NCCL 2.28: it reports "Unknown", whose size we do not know).
const DATATYPES: [(&str, u8); 11] = [
    ("ncclInt8", 1),
    ("ncclInt32", 4),
    ("ncclUint32", 4),
    ("ncclInt64", 8),
    ("ncclUint64", 8),
    ("ncclFloat16", 2),
    ("ncclFloat32", 4),
    ("ncclFloat64", 8),
    ("ncclBfloat16", 2),
    ("ncclFloat8e4m3", 1),
    ("ncclFloat8e5m2", 1),
];

pub fn func_of(name: &[u8]) -> u8 {
    FUNCS
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map_or(FUNC_OTHER, |&(_, v)| v)
}

pub fn func_name(f: u8) -> &'static str {
    FUNCS
        .iter()
        .find(|&&(_, v)| v == f)
        .map_or("other", |&(n, _)| n)
}

/// -1 for a name NCCL did not use before 2.30.
pub fn algo_of(name: &[u8]) -> i8 {
    ALGOS
        .iter()
        .position(|n| n.as_bytes() == name)
        .map_or(-1, |i| i as i8)
}

pub fn proto_of(name: &[u8]) -> i8 {
    PROTOS
        .iter()
        .position(|n| n.as_bytes() == name)
        .map_or(-1, |i| i as i8)
}

/// 0 when the size is not known.
pub fn datatype_size(name: &[u8]) -> u8 {
    DATATYPES
        .iter()
        .find(|(n, _)| n.as_bytes() == name)
        .map_or(0, |&(_, s)| s)
}

/// A collective or point-to-point operation as its descriptor gives it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Op {
    /// `comm->seqNumber[func]` (collectives; 0 for p2p).
    pub seq: u64,
    pub func: u8,
    /// Elements (NCCL's `count`: per rank for all_gather and reduce_scatter).
    pub count: u64,
    /// Bytes per element (0: unknown).
    pub type_size: u8,
    pub algo: i8,
    pub proto: i8,
    pub nchannels: u8,
    pub root_or_peer: i32,
    /// The caller's per-call profiler tag (profiler v7, NCCL 2.31+; 0: untagged or an older
    /// NCCL).
    pub user_tag: u64,
    /// A symmetric-memory collective (profiler v7): NCCL names a kernel variant instead of an
    /// algorithm and protocol, so `algo` and `proto` are -1.
    pub sym: bool,
}

/// What an event describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Coll(Op),
    P2p(Op),
    ProxyOp {
        channel: u8,
        peer: i32,
        nsteps: i32,
        chunk_size: i32,
        is_send: bool,
    },
    ProxyStep {
        step: i32,
    },
    KernelCh {
        channel: u8,
        /// GPU globaltimer at the channel's start (ns).
        start: u64,
    },
    NetPlugin {
        id: i64,
    },
    /// A type we count but do not follow (group, API, proxy control, copy-engine events, v7's
    /// kernel phases, and types newer than this plugin): its bit.
    Other(u64),
}

impl Kind {
    /// The event-type bit.
    pub fn bit(&self) -> u64 {
        match self {
            Kind::Coll(_) => event::COLL,
            Kind::P2p(_) => event::P2P,
            Kind::ProxyOp { .. } => event::PROXY_OP,
            Kind::ProxyStep { .. } => event::PROXY_STEP,
            Kind::KernelCh { .. } => event::KERNEL_CH,
            Kind::NetPlugin { .. } => event::NET_PLUGIN,
            Kind::Other(b) => *b,
        }
    }
}

/// A descriptor, copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descr {
    pub kind: Kind,
    /// `parentObj`: a handle of ours (or NULL, or anything).
    pub parent: Handle,
    pub rank: i32,
}

/// The state of `recordEventState`, with its argument where the state has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateUpdate {
    pub state: i32,
    /// `kernelCh.pTimer` for `KernelChStop`, `proxyStep.transSize` for proxy-step states, 0
    /// otherwise (or when NCCL passed no arguments).
    pub arg: u64,
}

/// Names of event-type bits, for log lines and metrics labels.
pub fn bit_name(bit: u64) -> &'static str {
    match bit {
        event::GROUP => "group",
        event::COLL => "coll",
        event::P2P => "p2p",
        event::PROXY_OP => "proxy_op",
        event::PROXY_STEP => "proxy_step",
        event::PROXY_CTRL => "proxy_ctrl",
        event::KERNEL_CH => "kernel_ch",
        event::NET_PLUGIN => "net_plugin",
        event::GROUP_API => "group_api",
        event::COLL_API => "coll_api",
        event::P2P_API => "p2p_api",
        event::KERNEL_LAUNCH => "kernel_launch",
        event::CE_COLL => "ce_coll",
        event::CE_SYNC => "ce_sync",
        event::CE_BATCH => "ce_batch",
        event::KERNEL_PHASE => "kernel_phase",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_names_map_to_its_numbers() {
        assert_eq!(func_of(b"AllReduce"), 4);
        assert_eq!(func_of(b"ReduceScatter"), 3);
        assert_eq!(func_of(b"Invalid"), FUNC_OTHER);
        assert_eq!(func_name(4), "AllReduce");
        assert_eq!(algo_of(b"RING"), 1);
        assert_eq!(algo_of(b"PAT"), 6);
        assert_eq!(algo_of(b"Unknown"), -1);
        assert_eq!(proto_of(b"SIMPLE"), 2);
        assert_eq!(proto_of(b"simple"), -1);
        assert_eq!(datatype_size(b"ncclBfloat16"), 2);
        assert_eq!(datatype_size(b"ncclFloat64"), 8);
        assert_eq!(datatype_size(b"Unknown"), 0);
    }
}
