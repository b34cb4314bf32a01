//! The profiler plugin ABI: `ncclProfiler_v4` (NCCL 2.27), `ncclProfiler_v5` (2.28),
//! `ncclProfiler_v6` (2.29, 2.30) and `ncclProfiler_v7` (2.31+), from NCCL's
//! `src/include/plugin/nccl_profiler.h` and `profiler/profiler_v4.h` … `v7.h`.
//!
//! Every version is a table of six slots (48 bytes): name, init, startEvent, stopEvent,
//! recordEventState, finalize. `stopEvent` and `recordEventState` get only the event handle,
//! no context: a plugin must be able to tell its own handles from anything else by the handle
//! alone.
//!
//! The descriptor is a header (type, parent handle, rank) and a union. v5 and v6 lay it out the
//! same (112 bytes; v6 adds three copy-engine members that fit in v5's union); in v4 `type` is a
//! `uint8_t` and `coll`/`p2p` lack `parentGroup` (104 bytes). Union members are separate
//! structs here, read only for the type the header names.
//!
//! v7 keeps v6's header and table and grows the union to 112 bytes (descriptor 136): a
//! per-call `userTag` (`u64`, 0 = untagged) at the end of `collApi`, `p2pApi`, `coll`, `p2p`
//! and `ceColl`; `coll` also gains `kernelVariant` and `isSymColl` (symmetric-memory
//! kernels); and a `kernelPhase` member for the new KernelPhase event (bit 15), whose stop
//! state (31) carries its GPU end time in the same 8-byte state-argument union as KernelCh.
//! The v7 layouts are pinned to NVIDIA/nccl commit 88980683 (`makefiles/version.mk` 2.31.2),
//! `src/include/plugin/profiler/profiler_v7.h` and `nccl_profiler.h`.

use crate::common::{DebugLogger, NcclResult};
use std::ffi::{c_char, c_int, c_void};

/// Event-type bits (`ncclProfile*`): the descriptor's `type` and the activation mask.
pub mod event {
    pub const GROUP: u64 = 1 << 0;
    pub const COLL: u64 = 1 << 1;
    pub const P2P: u64 = 1 << 2;
    pub const PROXY_OP: u64 = 1 << 3;
    pub const PROXY_STEP: u64 = 1 << 4;
    pub const PROXY_CTRL: u64 = 1 << 5;
    pub const KERNEL_CH: u64 = 1 << 6;
    pub const NET_PLUGIN: u64 = 1 << 7;
    /// v5+.
    pub const GROUP_API: u64 = 1 << 8;
    pub const COLL_API: u64 = 1 << 9;
    pub const P2P_API: u64 = 1 << 10;
    pub const KERNEL_LAUNCH: u64 = 1 << 11;
    /// v6 (copy-engine collectives).
    pub const CE_COLL: u64 = 1 << 12;
    pub const CE_SYNC: u64 = 1 << 13;
    pub const CE_BATCH: u64 = 1 << 14;
    /// Every bit NCCL 2.30 defines.
    pub const ALL: u64 = (1 << 15) - 1;
    /// v7: a kernel's barrier phase on one channel (initial sync, compute, final sync), a child
    /// of a KernelCh event. NCCL turns KernelCh on with it.
    pub const KERNEL_PHASE: u64 = 1 << 15;
}

/// `ncclProfilerEventState_t` values the plugin looks at (an `int` on the wire).
pub mod state {
    pub const PROXY_STEP_SEND_GPU_WAIT: i32 = 8;
    pub const PROXY_STEP_SEND_WAIT: i32 = 9;
    pub const PROXY_STEP_RECV_WAIT: i32 = 10;
    pub const PROXY_STEP_RECV_FLUSH_WAIT: i32 = 11;
    pub const PROXY_STEP_RECV_GPU_WAIT: i32 = 12;
    pub const PROXY_CTRL_IDLE: i32 = 13;
    pub const PROXY_CTRL_APPEND_END: i32 = 18;
    pub const PROXY_OP_IN_PROGRESS_V4: i32 = 19;
    pub const PROXY_STEP_SEND_PEER_WAIT_V4: i32 = 20;
    pub const NET_PLUGIN_UPDATE: i32 = 21;
    /// Recorded just before a KernelCh event stops; `args.kernel_ch.p_timer` is the GPU
    /// globaltimer at the channel's end.
    pub const KERNEL_CH_STOP: i32 = 22;
    pub const GROUP_START_API_STOP: i32 = 23;
    pub const GROUP_END_API_START: i32 = 24;
    pub const CE_COLL_START: i32 = 25;
    pub const CE_BATCH_COMPLETE: i32 = 30;
    /// v7: recorded before a KernelPhase event stops; `args.kernelCh.pTimer` is the phase's end.
    pub const KERNEL_PHASE_STOP: i32 = 31;
}

/// `NCCL_PROFILER_NET_TYPE_*`: the type half of a net plugin event's `pluginId`
/// (`(type << 16) | version`).
pub const NET_TYPE_IB: i64 = 1 << 16;
pub const NET_TYPE_SOCK: i64 = 2 << 16;

// ------------------------------------------------------------------ union members

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GroupApiDescr {
    pub graph_captured: bool,
    pub group_depth: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollApiDescr {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pApiDescr {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelLaunchDescr {
    pub stream: *mut c_void,
}

/// `coll` of v5/v6 (v4's lacks `parent_group`, [`CollDescrV4`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollDescrV4 {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// `p2p` of v5/v6 (v4's lacks `parent_group`, [`P2pDescrV4`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pDescr {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pDescrV4 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyOpDescr {
    pub pid: i32,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProxyStepDescr {
    pub step: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelChDescr {
    pub channel_id: u8,
    /// The GPU globaltimer (ns) when the channel started.
    pub p_timer: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPluginDescr {
    pub id: i64,
    pub data: *mut c_void,
}

/// v6 `ceColl`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CeCollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub sync_strategy: *const c_char,
    pub intra_batch_sync: bool,
    pub batch_size: u32,
    pub num_batches: u32,
    pub ce_seq_num: u32,
    pub stream: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CeCollSyncDescr {
    pub is_complete: bool,
    pub n_ranks: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CeCollBatchDescr {
    pub num_ops: c_int,
    pub total_bytes: usize,
    pub use_intra_sync: bool,
}

/// v7 `collApi`: v6's and the user tag.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollApiDescrV7 {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: bool,
    /// The caller's per-call profiler tag (`ncclConfig`'s collective config); 0 when untagged.
    pub user_tag: u64,
}

/// v7 `p2pApi`: v6's and the user tag.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pApiDescrV7 {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graph_captured: bool,
    pub user_tag: u64,
}

/// v7 `coll`: v6's, the kernel variant and symmetric flag, and the user tag.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollDescrV7 {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    /// For a symmetric-memory collective NCCL puts the variant's suffix here (not one of
    /// `ncclAlgoToString`'s names) and an empty protocol.
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: *mut c_void,
    /// The symmetric kernel's name (e.g. "AGxLL_R"); NULL for the others.
    pub kernel_variant: *const c_char,
    pub is_sym_coll: bool,
    pub user_tag: u64,
}

/// v7 `p2p`: v6's and the user tag.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pDescrV7 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub parent_group: *mut c_void,
    pub user_tag: u64,
}

/// v7 `ceColl`: v6's and the user tag.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CeCollDescrV7 {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub sync_strategy: *const c_char,
    pub intra_batch_sync: bool,
    pub batch_size: u32,
    pub num_batches: u32,
    pub ce_seq_num: u32,
    pub stream: *mut c_void,
    pub user_tag: u64,
}

/// v7 `kernelPhase`: one barrier phase of a kernel on one channel.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelPhaseDescr {
    pub channel_id: u8,
    /// 0 initial sync, 1 compute, 2 final sync.
    pub phase_id: u8,
    pub phase_name: *const c_char,
    /// GPU globaltimer at the phase's start (ns).
    pub p_timer: u64,
}

// ------------------------------------------------------------------ descriptors

/// The union of `ncclProfilerEventDescr_v6_t` (v5's is the same without the `ce_*` members).
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnion {
    pub group_api: GroupApiDescr,
    pub coll_api: CollApiDescr,
    pub p2p_api: P2pApiDescr,
    pub kernel_launch: KernelLaunchDescr,
    pub coll: CollDescr,
    pub p2p: P2pDescr,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
    pub kernel_ch: KernelChDescr,
    pub net_plugin: NetPluginDescr,
    pub ce_coll: CeCollDescr,
    pub ce_coll_sync: CeCollSyncDescr,
    pub ce_coll_batch: CeCollBatchDescr,
}

/// `ncclProfilerEventDescr_v6_t`, which is also `ncclProfilerEventDescr_v5_t` (same layout;
/// v5 never names the `ce_*` members).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescr {
    pub type_: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnion,
}

/// `ncclProfilerEventDescr_v5_t`.
pub type EventDescrV5 = EventDescr;
/// `ncclProfilerEventDescr_v6_t`.
pub type EventDescrV6 = EventDescr;

/// The union of `ncclProfilerEventDescr_v7_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV7 {
    pub group_api: GroupApiDescr,
    pub coll_api: CollApiDescrV7,
    pub p2p_api: P2pApiDescrV7,
    pub kernel_launch: KernelLaunchDescr,
    pub coll: CollDescrV7,
    pub p2p: P2pDescrV7,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
    pub kernel_ch: KernelChDescr,
    pub net_plugin: NetPluginDescr,
    pub ce_coll: CeCollDescrV7,
    pub ce_coll_sync: CeCollSyncDescr,
    pub ce_coll_batch: CeCollBatchDescr,
    pub kernel_phase: KernelPhaseDescr,
}

/// `ncclProfilerEventDescr_v7_t`: v6's header over a larger union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV7 {
    pub type_: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnionV7,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrUnionV4 {
    pub coll: CollDescrV4,
    pub p2p: P2pDescrV4,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
    pub kernel_ch: KernelChDescr,
    pub net_plugin: NetPluginDescr,
}

/// `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV4 {
    pub type_: u8,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: DescrUnionV4,
}

/// `ncclProfilerEventStateArgs_v4_t` … `_v7_t` (the same 8-byte union; v7's KernelPhase stop
/// uses `kernelCh.pTimer`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union StateArgs {
    /// `proxyStep.transSize`.
    pub trans_size: usize,
    /// `proxyCtrl.appendedProxyOps`.
    pub appended_proxy_ops: c_int,
    /// `netPlugin.data`.
    pub net_data: *mut c_void,
    /// `kernelCh.pTimer`.
    pub p_timer: u64,
}

// ------------------------------------------------------------------ tables

pub type ProfilerInitV4Fn = Option<
    unsafe extern "C" fn(
        context: *mut *mut c_void,
        e_activation_mask: *mut c_int,
        comm_name: *const c_char,
        comm_hash: u64,
        n_nodes: c_int,
        nranks: c_int,
        rank: c_int,
        logfn: DebugLogger,
    ) -> NcclResult,
>;
pub type ProfilerInitV5Fn = Option<
    unsafe extern "C" fn(
        context: *mut *mut c_void,
        comm_id: u64,
        e_activation_mask: *mut c_int,
        comm_name: *const c_char,
        n_nodes: c_int,
        nranks: c_int,
        rank: c_int,
        logfn: DebugLogger,
    ) -> NcclResult,
>;
pub type StartEventV4Fn = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        e_handle: *mut *mut c_void,
        e_descr: *mut EventDescrV4,
    ) -> NcclResult,
>;
pub type StartEventFn = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        e_handle: *mut *mut c_void,
        e_descr: *mut EventDescr,
    ) -> NcclResult,
>;
pub type StartEventV7Fn = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        e_handle: *mut *mut c_void,
        e_descr: *mut EventDescrV7,
    ) -> NcclResult,
>;
pub type StopEventFn = Option<unsafe extern "C" fn(e_handle: *mut c_void) -> NcclResult>;
pub type RecordEventStateFn = Option<
    unsafe extern "C" fn(
        e_handle: *mut c_void,
        e_state: c_int,
        e_state_args: *mut StateArgs,
    ) -> NcclResult,
>;
pub type ProfilerFinalizeFn = Option<unsafe extern "C" fn(context: *mut c_void) -> NcclResult>;

/// `ncclProfiler_v4_t` (NCCL 2.27).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProfilerV4 {
    pub name: *const c_char,
    pub init: ProfilerInitV4Fn,
    pub start_event: StartEventV4Fn,
    pub stop_event: StopEventFn,
    pub record_event_state: RecordEventStateFn,
    pub finalize: ProfilerFinalizeFn,
}

/// `ncclProfiler_v5_t` (NCCL 2.28), and `ncclProfiler_v6_t` (2.29+, the same slots over the
/// v6 descriptor, which has v5's layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProfilerV5 {
    pub name: *const c_char,
    pub init: ProfilerInitV5Fn,
    pub start_event: StartEventFn,
    pub stop_event: StopEventFn,
    pub record_event_state: RecordEventStateFn,
    pub finalize: ProfilerFinalizeFn,
}

/// `ncclProfiler_v6_t`.
pub type ProfilerV6 = ProfilerV5;

/// `ncclProfiler_v7_t` (NCCL 2.31+): v6's slots over the v7 descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProfilerV7 {
    pub name: *const c_char,
    pub init: ProfilerInitV5Fn,
    pub start_event: StartEventV7Fn,
    pub stop_event: StopEventFn,
    pub record_event_state: RecordEventStateFn,
    pub finalize: ProfilerFinalizeFn,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn tables() {
        assert_eq!(size_of::<ProfilerV4>(), 48);
        assert_eq!(size_of::<ProfilerV5>(), 48);
        assert_eq!(offset_of!(ProfilerV5, init), 8);
        assert_eq!(offset_of!(ProfilerV5, start_event), 16);
        assert_eq!(offset_of!(ProfilerV5, stop_event), 24);
        assert_eq!(offset_of!(ProfilerV5, record_event_state), 32);
        assert_eq!(offset_of!(ProfilerV5, finalize), 40);
    }

    #[test]
    fn descriptors() {
        assert_eq!(size_of::<EventDescr>(), 112);
        assert_eq!(offset_of!(EventDescr, parent_obj), 8);
        assert_eq!(offset_of!(EventDescr, rank), 16);
        assert_eq!(offset_of!(EventDescr, u), 24);
        assert_eq!(size_of::<EventDescrV4>(), 104);
        assert_eq!(offset_of!(EventDescrV4, u), 24);
        assert_eq!(size_of::<StateArgs>(), 8);
    }

    #[test]
    fn union_members() {
        assert_eq!(size_of::<CollDescr>(), 88);
        assert_eq!(offset_of!(CollDescr, count), 32);
        assert_eq!(offset_of!(CollDescr, root), 40);
        assert_eq!(offset_of!(CollDescr, datatype), 48);
        assert_eq!(offset_of!(CollDescr, n_channels), 56);
        assert_eq!(offset_of!(CollDescr, n_warps), 57);
        assert_eq!(offset_of!(CollDescr, algo), 64);
        assert_eq!(offset_of!(CollDescr, proto), 72);
        assert_eq!(offset_of!(CollDescr, parent_group), 80);
        assert_eq!(size_of::<CollDescrV4>(), 80);
        assert_eq!(size_of::<P2pDescr>(), 48);
        assert_eq!(offset_of!(P2pDescr, peer), 32);
        assert_eq!(offset_of!(P2pDescr, n_channels), 36);
        assert_eq!(size_of::<P2pDescrV4>(), 40);
        assert_eq!(size_of::<ProxyOpDescr>(), 24);
        assert_eq!(offset_of!(ProxyOpDescr, channel_id), 4);
        assert_eq!(offset_of!(ProxyOpDescr, peer), 8);
        assert_eq!(offset_of!(ProxyOpDescr, is_send), 20);
        assert_eq!(size_of::<KernelChDescr>(), 16);
        assert_eq!(offset_of!(KernelChDescr, p_timer), 8);
        assert_eq!(size_of::<NetPluginDescr>(), 16);
        assert_eq!(size_of::<CollApiDescr>(), 48);
        assert_eq!(offset_of!(CollApiDescr, graph_captured), 40);
        assert_eq!(size_of::<CeCollDescr>(), 88);
        assert_eq!(offset_of!(CeCollDescr, intra_batch_sync), 64);
        assert_eq!(offset_of!(CeCollDescr, stream), 80);
        assert_eq!(size_of::<CeCollBatchDescr>(), 24);
        assert_eq!(size_of::<DescrUnion>(), 88);
        assert_eq!(size_of::<DescrUnionV4>(), 80);
    }

    /// Numbers from compiling NVIDIA/nccl commit 88980683 (2.31.2)
    /// `src/include/plugin/profiler/profiler_v7.h` with g++ (`sizeof`/`offsetof`, LP64).
    /// Offsets in the union are the compiled descriptor offsets minus the 24-byte header.
    #[test]
    fn v7_layout() {
        assert_eq!(size_of::<ProfilerV7>(), 48);
        assert_eq!(offset_of!(ProfilerV7, start_event), 16);
        assert_eq!(offset_of!(ProfilerV7, finalize), 40);
        assert_eq!(size_of::<EventDescrV7>(), 136);
        assert_eq!(offset_of!(EventDescrV7, parent_obj), 8);
        assert_eq!(offset_of!(EventDescrV7, rank), 16);
        assert_eq!(offset_of!(EventDescrV7, u), 24);
        assert_eq!(size_of::<DescrUnionV7>(), 112);
        assert_eq!(size_of::<CollApiDescrV7>(), 56);
        assert_eq!(offset_of!(CollApiDescrV7, graph_captured), 64 - 24);
        assert_eq!(offset_of!(CollApiDescrV7, user_tag), 72 - 24);
        assert_eq!(size_of::<P2pApiDescrV7>(), 48);
        assert_eq!(offset_of!(P2pApiDescrV7, graph_captured), 56 - 24);
        assert_eq!(offset_of!(P2pApiDescrV7, user_tag), 64 - 24);
        assert_eq!(size_of::<CollDescrV7>(), 112);
        assert_eq!(offset_of!(CollDescrV7, parent_group), 104 - 24);
        assert_eq!(offset_of!(CollDescrV7, kernel_variant), 112 - 24);
        assert_eq!(offset_of!(CollDescrV7, is_sym_coll), 120 - 24);
        assert_eq!(offset_of!(CollDescrV7, user_tag), 128 - 24);
        assert_eq!(size_of::<P2pDescrV7>(), 56);
        assert_eq!(offset_of!(P2pDescrV7, parent_group), 64 - 24);
        assert_eq!(offset_of!(P2pDescrV7, user_tag), 72 - 24);
        assert_eq!(size_of::<CeCollDescrV7>(), 96);
        assert_eq!(offset_of!(CeCollDescrV7, stream), 104 - 24);
        assert_eq!(offset_of!(CeCollDescrV7, user_tag), 112 - 24);
        assert_eq!(size_of::<KernelPhaseDescr>(), 24);
        assert_eq!(offset_of!(KernelPhaseDescr, phase_id), 25 - 24);
        assert_eq!(offset_of!(KernelPhaseDescr, phase_name), 32 - 24);
        assert_eq!(offset_of!(KernelPhaseDescr, p_timer), 40 - 24);
        // The fields v7 kept from v6 stay where they were: an adapter may read them alike.
        assert_eq!(offset_of!(CollDescrV7, algo), offset_of!(CollDescr, algo));
        assert_eq!(offset_of!(P2pDescrV7, peer), offset_of!(P2pDescr, peer));
        assert_eq!(event::KERNEL_PHASE, 1 << 15);
        assert_eq!(state::KERNEL_PHASE_STOP, 31);
    }

    #[test]
    fn event_bits() {
        assert_eq!(event::KERNEL_CH, 64);
        assert_eq!(event::NET_PLUGIN, 128);
        assert_eq!(event::CE_BATCH, 1 << 14);
        assert_eq!(event::ALL, 0x7fff);
    }
}
