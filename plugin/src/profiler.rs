//! `ncclProfiler_v4` (NCCL 2.27), `ncclProfiler_v5` (2.28), `ncclProfiler_v6` (2.29, 2.30) and
//! `ncclProfiler_v7` (2.31+): NCCL's profiler ABI, one table per version over
//! [`ncclbpf_profiler::tracker`].
//!
//! v7 adds the caller's per-call user tag and the symmetric-kernel flag to collectives and
//! p2p operations; both reach the per-collective figures (the tag as a bounded label) and the
//! `profiler/coll` and `profiler/p2p` programs. v7's KernelPhase event (a kernel's barrier
//! phases per channel) is ignored on purpose: the default mask never asks for it, and when a
//! user's `NCCL_PROFILE_EVENT_MASK` does, it is counted as ignored and given no handle. Three
//! phase events per channel per collective would triple the channel events NCCL writes from
//! the GPU for a split this profiler does not report; the collective's GPU time already spans
//! them.
//!
//! NCCL ≥ 2.28 finds the profiler in the net library when `NCCL_PROFILER_PLUGIN` names none;
//! `NCCL_PROFILER_PLUGIN=none` switches it off, and so does `NCCL_BPF_PROFILER=0` (no events).
//!
//! Each adapter copies what NCCL passed into our own types first (descriptors, strings, state
//! arguments), then calls the tracker; no pointer of NCCL's is kept. Every entry catches
//! panics; none returns an error for a bad handle (the tracker ignores and counts it), so a
//! misbehaving caller never changes what NCCL does.

use ncclbpf_profiler::event::{self as ev, Descr, Kind, Op, StateUpdate};
use ncclbpf_profiler::handles::Handle;
use ncclbpf_profiler::tracker;
use ncclnet_headers::profiler::*;
use ncclnet_headers::{DebugLogger, Export, NcclResult};
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

type Vp = *mut c_void;

fn guard(what: &str, f: impl FnOnce() -> NcclResult) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            ncclbpf_profiler::plog!(
                WARN,
                PROFILE,
                "{what}: internal error (panic caught); ignored"
            );
            NcclResult::INTERNAL_ERROR
        }
    }
}

/// At most 31 bytes of a C string NCCL passed (its names are short constants); empty for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the call.
unsafe fn name(p: *const c_char) -> ([u8; 32], usize) {
    let mut out = [0u8; 32];
    if p.is_null() {
        return (out, 0);
    }
    let mut n = 0;
    while n < out.len() - 1 {
        // SAFETY: within the string: we stop at its NUL.
        let c = unsafe { *p.add(n) } as u8;
        if c == 0 {
            break;
        }
        out[n] = c;
        n += 1;
    }
    (out, n)
}

macro_rules! named {
    ($f:ident, $p:expr) => {{
        // SAFETY: NCCL's descriptor strings are NULL or its own NUL-terminated constants.
        let (b, n) = unsafe { name($p) };
        ev::$f(&b[..n])
    }};
}

/// The fields every version's `coll` has.
///
/// # Safety
/// The string pointers are NULL or NUL-terminated, valid for the call.
#[allow(clippy::too_many_arguments)] // the fields of NCCL's `coll`
unsafe fn coll_op(
    seq: u64,
    func: *const c_char,
    count: usize,
    root: c_int,
    datatype: *const c_char,
    n_channels: u8,
    algo: *const c_char,
    proto: *const c_char,
) -> Op {
    Op {
        seq,
        func: named!(func_of, func),
        count: count as u64,
        type_size: named!(datatype_size, datatype),
        algo: named!(algo_of, algo),
        proto: named!(proto_of, proto),
        nchannels: n_channels,
        root_or_peer: root,
        user_tag: 0,
        sym: false,
    }
}

/// # Safety
/// As [`coll_op`].
unsafe fn p2p_op(
    func: *const c_char,
    count: usize,
    peer: c_int,
    datatype: *const c_char,
    n_channels: u8,
) -> Op {
    Op {
        seq: 0,
        func: named!(func_of, func),
        count: count as u64,
        type_size: named!(datatype_size, datatype),
        algo: -1,
        proto: -1,
        nchannels: n_channels,
        root_or_peer: peer,
        user_tag: 0,
        sym: false,
    }
}

/// The kinds every version shares, from the event type and the union member it names (each
/// closure reads one member; only the one the type names is called).
fn common_kind(
    type_: u64,
    proxy_op: impl Fn() -> ProxyOpDescr,
    step: impl Fn() -> c_int,
    kernel: impl Fn() -> KernelChDescr,
    net: impl Fn() -> NetPluginDescr,
) -> Option<Kind> {
    Some(match type_ {
        event::PROXY_OP => {
            let p = proxy_op();
            Kind::ProxyOp {
                channel: p.channel_id,
                peer: p.peer,
                nsteps: p.n_steps,
                chunk_size: p.chunk_size,
                is_send: p.is_send != 0,
            }
        }
        event::PROXY_STEP => Kind::ProxyStep { step: step() },
        event::KERNEL_CH => {
            let k = kernel();
            Kind::KernelCh {
                channel: k.channel_id,
                start: k.p_timer,
            }
        }
        event::NET_PLUGIN => Kind::NetPlugin { id: net().id },
        _ => return None,
    })
}

/// A descriptor of any version, copied: v4's and v5/v6's differ in the header's `type` width and
/// in the union's `coll`/`p2p` (v4's lack `parentGroup`), not in the fields read here.
macro_rules! copy_descr {
    ($d:expr) => {{
        let d = $d;
        let t = u64::from(d.type_);
        let kind = match t {
            event::COLL => {
                // SAFETY: NCCL fills the union member its `type` names: `coll` here.
                let c = unsafe { d.u.coll };
                // SAFETY: NCCL's strings.
                Kind::Coll(unsafe {
                    coll_op(
                        c.seq_number,
                        c.func,
                        c.count,
                        c.root,
                        c.datatype,
                        c.n_channels,
                        c.algo,
                        c.proto,
                    )
                })
            }
            event::P2P => {
                // SAFETY: as above, `p2p`.
                let p = unsafe { d.u.p2p };
                // SAFETY: NCCL's strings.
                Kind::P2p(unsafe { p2p_op(p.func, p.count, p.peer, p.datatype, p.n_channels) })
            }
            // `common_kind` calls only the closure whose member `type` names, which NCCL
            // filled.
            _ => common_kind(
                t,
                // SAFETY: called only for a proxy-op event (see above).
                || unsafe { d.u.proxy_op },
                // SAFETY: called only for a proxy-step event.
                || unsafe { d.u.proxy_step.step },
                // SAFETY: called only for a kernel-channel event.
                || unsafe { d.u.kernel_ch },
                // SAFETY: called only for a net-plugin event.
                || unsafe { d.u.net_plugin },
            )
            .unwrap_or(Kind::Other(t)),
        };
        Descr {
            kind,
            parent: Handle::from_ptr(d.parent_obj),
            rank: d.rank,
        }
    }};
}

/// A v5/v6 descriptor, copied.
///
/// # Safety
/// `d` is a descriptor valid for the call, as NCCL passes it.
unsafe fn descr_v5(d: &EventDescr) -> Descr {
    copy_descr!(d)
}

/// A v7 descriptor, copied: v6's fields where they were, plus the user tag and the symmetric
/// flag of a collective or p2p operation. A KernelPhase event (v7) falls to `Kind::Other`:
/// counted as ignored, no handle (see the module's documentation).
///
/// # Safety
/// As [`descr_v5`].
unsafe fn descr_v7(d: &EventDescrV7) -> Descr {
    let mut out = copy_descr!(d);
    match &mut out.kind {
        Kind::Coll(op) => {
            // SAFETY: NCCL filled `coll`, the member its type names (read above as well).
            let c = unsafe { d.u.coll };
            op.user_tag = c.user_tag;
            op.sym = c.is_sym_coll;
        }
        // SAFETY: as above, `p2p`.
        Kind::P2p(op) => op.user_tag = unsafe { d.u.p2p.user_tag },
        _ => {}
    }
    out
}

/// A v4 descriptor, copied.
///
/// # Safety
/// As [`descr_v5`].
unsafe fn descr_v4(d: &EventDescrV4) -> Descr {
    copy_descr!(d)
}

#[allow(clippy::too_many_arguments)] // NCCL's init arguments
fn init_common(
    context: *mut Vp,
    mask: *mut c_int,
    comm_id: u64,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: DebugLogger,
) -> NcclResult {
    ncclnet_headers::log::set_logger(logfn);
    if context.is_null() || mask.is_null() {
        ncclbpf_profiler::plog!(WARN, PROFILE, "init: NULL context or mask pointer");
        return NcclResult::INVALID_ARGUMENT;
    }
    let t = tracker::global();
    let name = if comm_name.is_null() {
        String::new()
    } else {
        // SAFETY: NCCL's communicator name: NUL-terminated, valid for the call.
        unsafe { std::ffi::CStr::from_ptr(comm_name) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: both checked non-NULL; NCCL's out-parameters.
    unsafe {
        *mask = if t.paused() { 0 } else { t.mask() as c_int };
        *context = std::ptr::null_mut();
    }
    let (every, problem) = ncclbpf_profiler::mask::sample_every(&|k| std::env::var(k).ok());
    if let Some(p) = problem {
        ncclbpf_profiler::plog!(WARN, PROFILE, "{p}");
    }
    // NCCL's process-wide mask, which it reads again for every collective it enqueues.
    let at = mask as usize;
    t.set_mask_target(Box::new(move |m: u64| {
        // SAFETY: `at` is NCCL's `ncclProfilerEventMask`, an int that lives as long as NCCL,
        // which reads it with atomic loads; this store is atomic too.
        unsafe { std::sync::atomic::AtomicI32::from_ptr(at as *mut i32) }
            .store(m as i32, std::sync::atomic::Ordering::Relaxed)
    }));
    if every >= 2 && t.set_sampling(tracker::Sampling { every }) {
        ncclbpf_profiler::plog!(
            INFO,
            PROFILE,
            "profiler: one collective in {every} timed (NCCL_BPF_PROFILER_SAMPLE), the others counted untimed"
        );
    }
    match t.init(comm_id, &name, n_nodes, nranks, rank) {
        Some(h) => {
            // SAFETY: checked non-NULL above.
            unsafe { *context = h.as_ptr() };
            // Released by `finalize` of this context.
            ncclbpf_host::acquire(ncclbpf_host::Part::Profiler);
            NcclResult::SUCCESS
        }
        None => NcclResult::INTERNAL_ERROR,
    }
}

unsafe extern "C" fn init_v4(
    context: *mut Vp,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: DebugLogger,
) -> NcclResult {
    guard("init", || {
        init_common(
            context, mask, comm_hash, comm_name, n_nodes, nranks, rank, logfn,
        )
    })
}

unsafe extern "C" fn init_v5(
    context: *mut Vp,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: DebugLogger,
) -> NcclResult {
    guard("init", || {
        init_common(
            context, mask, comm_id, comm_name, n_nodes, nranks, rank, logfn,
        )
    })
}

fn start_common(
    context: Vp,
    e_handle: *mut Vp,
    read: impl FnOnce() -> Option<Descr>,
) -> NcclResult {
    if e_handle.is_null() {
        ncclbpf_profiler::plog!(WARN, PROFILE, "startEvent: NULL handle pointer; ignored");
        return NcclResult::SUCCESS;
    }
    // SAFETY: NCCL's out-parameter, checked non-NULL. Written first, so that a panic below
    // leaves NCCL with "no event".
    unsafe { *e_handle = std::ptr::null_mut() };
    let Some(d) = read() else {
        return NcclResult::SUCCESS;
    };
    let h = tracker::global().start(Handle::from_ptr(context), &d);
    // SAFETY: as above.
    unsafe { *e_handle = h.as_ptr() };
    NcclResult::SUCCESS
}

unsafe extern "C" fn start_event_v4(
    context: Vp,
    e_handle: *mut Vp,
    e_descr: *mut EventDescrV4,
) -> NcclResult {
    guard("startEvent", || {
        start_common(context, e_handle, || {
            // SAFETY: NCCL's descriptor, valid for the call, when non-NULL.
            unsafe { e_descr.as_ref().map(|d| descr_v4(d)) }
        })
    })
}

unsafe extern "C" fn start_event_v5(
    context: Vp,
    e_handle: *mut Vp,
    e_descr: *mut EventDescr,
) -> NcclResult {
    guard("startEvent", || {
        start_common(context, e_handle, || {
            // SAFETY: NCCL's descriptor, valid for the call, when non-NULL.
            unsafe { e_descr.as_ref().map(|d| descr_v5(d)) }
        })
    })
}

unsafe extern "C" fn start_event_v7(
    context: Vp,
    e_handle: *mut Vp,
    e_descr: *mut EventDescrV7,
) -> NcclResult {
    guard("startEvent", || {
        start_common(context, e_handle, || {
            // SAFETY: NCCL's descriptor, valid for the call, when non-NULL.
            unsafe { e_descr.as_ref().map(|d| descr_v7(d)) }
        })
    })
}

unsafe extern "C" fn stop_event(e_handle: Vp) -> NcclResult {
    guard("stopEvent", || {
        tracker::global().stop(Handle::from_ptr(e_handle));
        NcclResult::SUCCESS
    })
}

unsafe extern "C" fn record_event_state(
    e_handle: Vp,
    e_state: c_int,
    args: *mut StateArgs,
) -> NcclResult {
    guard("recordEventState", || {
        // SAFETY: NCCL's 8-byte argument union, valid for the call, when non-NULL; which
        // member is meant follows from the state.
        let a = unsafe { args.as_ref() };
        let arg = match (e_state, a) {
            // SAFETY: NCCL passes `kernelCh.pTimer` with KernelChStop.
            (state::KERNEL_CH_STOP, Some(a)) => unsafe { a.p_timer },
            (
                state::PROXY_STEP_SEND_GPU_WAIT..=state::PROXY_STEP_RECV_GPU_WAIT
                | state::PROXY_STEP_SEND_PEER_WAIT_V4,
                Some(a),
                // SAFETY: NCCL passes `proxyStep.transSize` with proxy-step states.
            ) => (unsafe { a.trans_size }) as u64,
            _ => 0,
        };
        tracker::global().record(
            Handle::from_ptr(e_handle),
            StateUpdate {
                state: e_state,
                arg,
            },
        );
        NcclResult::SUCCESS
    })
}

unsafe extern "C" fn finalize(context: Vp) -> NcclResult {
    guard("finalize", || {
        // Only a live context's finalize releases its hold (a stale or repeated one is a
        // misuse the tracker counts, and must not end another context's hold).
        if tracker::global().finalize(Handle::from_ptr(context)) {
            ncclbpf_host::release(ncclbpf_host::Part::Profiler);
        }
        NcclResult::SUCCESS
    })
}

/// `int ncclBpfProfilerPause(void)`: for the application (through `dlsym`, like NCCL's example
/// profiler's start/stop): NCCL's mask becomes 0, so collectives enqueued from now on report no
/// events; those already enqueued finish as they are. 0, or -1 before NCCL initialised the
/// profiler.
#[unsafe(no_mangle)]
pub extern "C" fn ncclBpfProfilerPause() -> c_int {
    let r = catch_unwind(|| tracker::global().pause());
    if matches!(r, Ok(true)) { 0 } else { -1 }
}

/// `int ncclBpfProfilerResume(void)`: the mask as before the pause. 0, or -1 before NCCL
/// initialised the profiler.
#[unsafe(no_mangle)]
pub extern "C" fn ncclBpfProfilerResume() -> c_int {
    let r = catch_unwind(|| tracker::global().resume());
    if matches!(r, Ok(true)) { 0 } else { -1 }
}

const NAME: *const c_char = c"BPF".as_ptr();

/// v5's and v6's table: the same slots over the same descriptor layout (v6 adds members NCCL
/// fills only for copy-engine events, which this profiler counts and does not follow).
const TABLE_V5: ProfilerV5 = ProfilerV5 {
    name: NAME,
    init: Some(init_v5),
    start_event: Some(start_event_v5),
    stop_event: Some(stop_event),
    record_event_state: Some(record_event_state),
    finalize: Some(finalize),
};

/// v7: v6's slots over the larger v7 descriptor.
#[unsafe(no_mangle)]
pub static ncclProfiler_v7: Export<ProfilerV7> = Export(ProfilerV7 {
    name: NAME,
    init: Some(init_v5),
    start_event: Some(start_event_v7),
    stop_event: Some(stop_event),
    record_event_state: Some(record_event_state),
    finalize: Some(finalize),
});

#[unsafe(no_mangle)]
pub static ncclProfiler_v6: Export<ProfilerV6> = Export(TABLE_V5);

#[unsafe(no_mangle)]
pub static ncclProfiler_v5: Export<ProfilerV5> = Export(TABLE_V5);

#[unsafe(no_mangle)]
pub static ncclProfiler_v4: Export<ProfilerV4> = Export(ProfilerV4 {
    name: NAME,
    init: Some(init_v4),
    start_event: Some(start_event_v4),
    stop_event: Some(stop_event),
    record_event_state: Some(record_event_state),
    finalize: Some(finalize),
});
