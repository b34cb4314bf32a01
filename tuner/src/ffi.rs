//! `ncclTunerPlugin_v2` … `v6`. The plugin library links this crate, so NCCL finds the tuner
//! in the same `.so` as the net plugin (through `NCCL_TUNER_PLUGIN`, or the net library
//! fallback of NCCL >= 2.21), and both see the same maps.
//!
//! A tuner must never fail a collective: `getCollInfo` always returns success, catches panics,
//! and leaves NCCL's cost table alone when it has no (usable) answer.

use crate::decide::{self, Collective, Decision};
use crate::policy;
use ncclnet_headers::tuner::*;
use ncclnet_headers::{DebugLogger, Export, NcclFunc, NcclResult};
use policy_runtime::SlotHandle;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

type Vp = *mut c_void;

/// One communicator's tuner state.
pub struct TunerContext {
    comm_id: u64,
    nranks: u32,
    nnodes: u32,
    state: Mutex<State>,
}

struct State {
    handle: Option<SlotHandle>,
    /// Decisions by (algo, proto, applied), for the summary at finalize.
    counts: BTreeMap<(i32, i32, bool), u64>,
}

impl TunerContext {
    pub fn new(comm_id: u64, nranks: usize, nnodes: usize) -> TunerContext {
        let handle = policy::slot().map(|s| s.handle());
        TunerContext {
            comm_id,
            nranks: nranks.min(u32::MAX as usize) as u32,
            nnodes: nnodes.min(u32::MAX as usize) as u32,
            state: Mutex::new(State {
                handle,
                counts: BTreeMap::new(),
            }),
        }
    }

    /// Runs the policy for one collective and applies it to `table`; `None` without a policy.
    pub fn decide(
        &self,
        coll: NcclFunc,
        n_bytes: usize,
        num_pipe_ops: i32,
        reg_buff: i32,
        table: Option<(&mut [f32], usize, usize)>,
    ) -> Option<Decision> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let handle = st.handle.as_mut()?;
        let c = Collective {
            coll_type: coll.0,
            n_bytes,
            num_pipe_ops,
            reg_buff,
            comm_id: self.comm_id,
            nranks: self.nranks,
            nnodes: self.nnodes,
        };
        let ctx = decide::run_policy(handle, &c);
        let d = match table {
            Some((t, na, np)) => decide::apply(&ctx, t, na, np),
            None => Decision {
                algo: ctx.algo,
                proto: ctx.proto,
                nchannels: ctx.nchannels,
                applied: false,
            },
        };
        *st.counts.entry((d.algo, d.proto, d.applied)).or_default() += 1;
        if trace_decisions() {
            crate::tlog!(
                TRACE,
                TUNING,
                "coll {} {} B: algo {} proto {} channels {} ({})",
                coll.0,
                n_bytes,
                d.algo,
                d.proto,
                d.nchannels,
                if d.applied { "applied" } else { "not applied" }
            );
        }
        Some(d)
    }

    /// The decisions so far, as a log line.
    pub fn summary(&self) -> String {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let parts: Vec<String> = st
            .counts
            .iter()
            .map(|((a, p, ok), n)| {
                format!(
                    "algo {a} proto {p}{}: {n}",
                    if *ok { "" } else { " (not applied)" }
                )
            })
            .collect();
        format!(
            "comm {:#018x}: {}",
            self.comm_id,
            if parts.is_empty() {
                "no decisions".into()
            } else {
                parts.join(", ")
            }
        )
    }
}

/// Per-decision log lines cost a formatted string per collective, so they are built only when
/// NCCL would print them (`NCCL_DEBUG=TRACE`); the summary at finalize is always logged.
fn trace_decisions() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("NCCL_DEBUG").is_ok_and(|v| v.eq_ignore_ascii_case("TRACE")))
}

fn quiet(what: &str, f: impl FnOnce()) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        crate::tlog!(
            WARN,
            TUNING,
            "{what}: internal panic caught, NCCL keeps its choice: {msg}"
        );
    }
}

fn new_context(
    ctx: *mut Vp,
    comm_id: u64,
    nranks: usize,
    nnodes: usize,
    log: DebugLogger,
) -> NcclResult {
    ncclnet_headers::log::set_logger(log);
    if ctx.is_null() {
        return NcclResult::INTERNAL_ERROR;
    }
    let mut r = NcclResult::SUCCESS;
    quiet("init", || {
        let c = Box::new(TunerContext::new(comm_id, nranks, nnodes));
        // SAFETY: NCCL passes a valid out-pointer for the context.
        unsafe { ctx.write(Box::into_raw(c) as Vp) };
    });
    // SAFETY: checked non-null above.
    if unsafe { (*ctx).is_null() } {
        r = NcclResult::INTERNAL_ERROR;
    }
    r
}

fn context<'a>(ctx: Vp) -> Option<&'a TunerContext> {
    // SAFETY: contexts we hand out are Box<TunerContext>, alive until finalize.
    (!ctx.is_null()).then(|| unsafe { &*(ctx as *const TunerContext) })
}

unsafe extern "C" fn init_v2(
    n_ranks: usize,
    n_nodes: usize,
    log: DebugLogger,
    ctx: *mut Vp,
) -> NcclResult {
    new_context(ctx, 0, n_ranks, n_nodes, log)
}

unsafe extern "C" fn init_v5(
    ctx: *mut Vp,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: DebugLogger,
    _nvl: *mut NvlDomainInfoV5,
    _constants: *mut TunerConstantsV5,
) -> NcclResult {
    new_context(ctx, comm_id, n_ranks, n_nodes, log)
}

/// The cost table NCCL passes (a `float**` that really points at `float[numAlgo][numProto]`).
fn cost_table<'a>(
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
) -> Option<(&'a mut [f32], usize, usize)> {
    let (na, np) = (
        usize::try_from(num_algo).ok()?,
        usize::try_from(num_proto).ok()?,
    );
    if table.is_null() || na == 0 || np == 0 || na > 64 || np > 64 {
        return None;
    }
    // SAFETY: per the tuner ABI the pointer addresses a contiguous row-major float table of
    // numAlgo x numProto entries, writable for the duration of the call.
    Some((
        unsafe { std::slice::from_raw_parts_mut(table as *mut f32, na * np) },
        na,
        np,
    ))
}

fn set_channels(n_channels: *mut c_int, d: &Decision) {
    if d.nchannels > 0 && !n_channels.is_null() {
        // SAFETY: NCCL passes a valid pointer to its channel count.
        unsafe { *n_channels = d.nchannels.min(c_int::MAX as u32) as c_int };
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v4(
    ctx: Vp,
    coll: NcclFunc,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    quiet("getCollInfo", || {
        let Some(c) = context(ctx) else { return };
        if let Some(d) = c.decide(
            coll,
            n_bytes,
            num_pipe_ops,
            reg_buff,
            cost_table(table, num_algo, num_proto),
        ) {
            set_channels(n_channels, &d);
        }
    });
    NcclResult::SUCCESS
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v3(
    ctx: Vp,
    coll: NcclFunc,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    // SAFETY: same contract as v4 without regBuff.
    unsafe {
        get_coll_info_v4(
            ctx,
            coll,
            n_bytes,
            num_pipe_ops,
            table,
            num_algo,
            num_proto,
            0,
            n_channels,
        )
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_coll_info_v2(
    ctx: Vp,
    coll: NcclFunc,
    n_bytes: usize,
    _coll_net_support: c_int,
    _nvls_support: c_int,
    num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    quiet("getCollInfo", || {
        let Some(c) = context(ctx) else { return };
        let Some(d) = c.decide(coll, n_bytes, num_pipe_ops, 0, None) else {
            return;
        };
        // The v2 interface takes a full pair only; NCCL then forces that table entry.
        if (0..NUM_ALGORITHMS as i32).contains(&d.algo)
            && (0..NUM_PROTOCOLS as i32).contains(&d.proto)
            && !algorithm.is_null()
            && !protocol.is_null()
        {
            // SAFETY: NCCL passes valid out-pointers.
            unsafe {
                *algorithm = d.algo;
                *protocol = d.proto;
            }
        }
        set_channels(n_channels, &d);
    });
    NcclResult::SUCCESS
}

unsafe extern "C" fn finalize(ctx: Vp) -> NcclResult {
    quiet("finalize", || {
        if let Some(c) = context(ctx) {
            crate::tlog!(INFO, TUNING, "{}", c.summary());
            // SAFETY: NCCL finalizes each context once; it came from Box::into_raw.
            drop(unsafe { Box::from_raw(ctx as *mut TunerContext) });
        }
    });
    NcclResult::SUCCESS
}

const NAME: *const std::ffi::c_char = c"BPF".as_ptr();

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v6: Export<TunerV6> = Export(TunerV6 {
    name: NAME,
    init: Some(init_v5),
    get_coll_info: Some(get_coll_info_v4),
    finalize: Some(finalize),
    get_chunk_size: None,
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v5: Export<TunerV5> = Export(TunerV5 {
    name: NAME,
    init: Some(init_v5),
    get_coll_info: Some(get_coll_info_v4),
    finalize: Some(finalize),
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v4: Export<TunerV4> = Export(TunerV4 {
    name: NAME,
    init: Some(init_v2),
    get_coll_info: Some(get_coll_info_v4),
    destroy: Some(finalize),
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v3: Export<TunerV3> = Export(TunerV3 {
    name: NAME,
    init: Some(init_v2),
    get_coll_info: Some(get_coll_info_v3),
    destroy: Some(finalize),
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v2: Export<TunerV2> = Export(TunerV2 {
    name: NAME,
    init: Some(init_v2),
    get_coll_info: Some(get_coll_info_v2),
    destroy: Some(finalize),
});
