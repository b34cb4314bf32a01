//! `ncclTunerPlugin_v2` … `v6`. The plugin library links this crate, so NCCL finds the tuner
//! in the same `.so` as the net plugin (through `NCCL_TUNER_PLUGIN`, or the net library
//! fallback of NCCL >= 2.21), and both see the same maps.
//!
//! A tuner must not fail a collective: `getCollInfo` returns success, catches panics, and
//! leaves NCCL's cost table alone when it has no (usable) answer. The one exception is a
//! context whose agreement with the other ranks timed out (`crate::agree`): guessing could make
//! this rank choose differently from the others, which hangs the job without a word, so that
//! context fails its collectives with `ncclInternalError` and a log line instead.
//!
//! # Safety
//!
//! Every `pub unsafe extern "C" fn` here is an adapter for the plugin library's exported tables
//! (`plugin/src`): it must be called only as NCCL calls it, with the pointers NCCL's ABI defines
//! for that slot (`ncclnet-headers`). Each one checks its pointers for NULL and catches panics.
#![allow(clippy::missing_safety_doc)]

use crate::agree::{self, Agreement};
use crate::decide::{self, Collective, Decision};
use crate::owner::{BiasedLock, Guard};
use crate::policy;
use crate::sequence::Sequence;
use crate::stage;
use crate::{chunk, constants};
use ncclnet_headers::tuner::*;
use ncclnet_headers::{DebugLogger, NcclFunc, NcclResult};
use policy_runtime::{LoadedProgram, ProgramSlot, SlotHandle, TunerCtx};
use shared_maps::Registry;
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

type Vp = *mut c_void;

/// One communicator's tuner state.
///
/// `getCollInfo` runs on every collective, so its path takes no lock and allocates nothing:
/// the policy handle is guarded by an atomic flag (see [`Policy`]) and the decision counts are
/// atomics in the context's published record ([`Sequence::count`]).
pub struct TunerContext {
    comm_id: u64,
    nranks: u32,
    nnodes: u32,
    /// `None` without a (loaded) policy: NCCL keeps its choices and nothing is counted.
    policy: Option<Policy>,
    /// The decisions' sequence numbers and digest, published in `ncclbpf_decisions` (see
    /// [`crate::sequence`]); written by the holder of the policy's try-lock only.
    sequence: Arc<Sequence>,
    /// Shows the context to staged swaps (`crate::stage`) while it lives.
    _watch: Option<Arc<stage::Watch>>,
    /// What the plugin changed or refused of the policies' answers (chunk sizes, channel
    /// counts), for the summary.
    adjusted: Adjustments,
    /// Whether per-decision TRACE lines are wanted (read once per process).
    trace: bool,
}

/// The context's handle onto the process's policy slot.
///
/// `SlotHandle::call` needs `&mut` (it caches the slot's generation and program and refreshes
/// them after a swap). NCCL calls `getCollInfo` for one communicator from one thread at a time
/// (the thread enqueuing its collectives), but the tuner ABI does not promise it. So the
/// handle sits behind `lock`, a [`BiasedLock`]: a try-lock that the thread calling the context
/// over and over gets to enter with no locked instruction at all (the locked compare-and-swap
/// alone was about 4 ns of the call, `perf annotate`), and that any other thread revokes with
/// one `membarrier`. A caller that finds the context taken, which only a second thread calling
/// the same context at the same moment can, never waits: it runs the slot's current program
/// through a handle of its own (`ProgramSlot::handle`: the slot's lock and two `Arc` clones, no
/// allocation), under the same version rules as any other caller.
///
/// The holder of `lock` is also the single writer of the context's [`Sequence`]: it numbers
/// the decision, counts it and folds it into the digest before it lets go. A caller that found
/// the context taken is decided and counted as every other, but not sequenced (its order
/// against the holder's is not defined); the sequence counts it apart
/// (`Sequence::unsequenced`, `Sequence::count_stray`).
///
/// Staged swaps ([`crate::stage`]): the holder of `lock` also checks, before each decision,
/// whether the process's history of tuner programs changed or the decision's number reached
/// the next switch point, and if so moves its handle onto the program that makes that
/// decision. `slot` always names the program the handle is on, for the fallback path.
struct Policy {
    /// The program the process started with.
    base: &'static ProgramSlot,
    /// The staged programs ([`stage::HISTORY`], or a test's own).
    history: &'static stage::History,
    /// The program `state`'s handle is on (`base` or a staged one).
    slot: AtomicPtr<ProgramSlot>,
    lock: BiasedLock,
    state: UnsafeCell<Switching>,
    /// Whether the context runs the agreement: then a second caller waits for `lock` instead
    /// of deciding outside the sequence (which would skip the agreed view).
    agreed: bool,
    /// Set when the agreement failed (a wait timed out): every call fails from then on.
    failed: AtomicBool,
    /// The policy needs the agreement and cannot have it: no opinion, ever.
    mute: bool,
}

/// What the holder of `lock` keeps.
struct Switching {
    handle: SlotHandle,
    /// The history's generation when the handle was last placed.
    generation: u64,
    /// The decision number at which the next staged program takes over or the next epoch
    /// ends (`u64::MAX`: none).
    next_switch: u64,
    agreement: Option<Box<Agreement>>,
}

// SAFETY: `state` is only reached through `Policy::call`, which holds `lock` for the whole
// access (a `BiasedLock`: mutual exclusion, and each holder sees the previous holder's writes,
// see crate::owner), so at most one thread uses it at a time; a `SlotHandle` may move between threads
// (asserted below). `slot` always points to a `ProgramSlot` that lives as long as the process
// (the one loaded at start, or a staged one, which `stage` leaks on purpose). Everything else
// in the context is immutable or atomic.
unsafe impl Sync for TunerContext {}

const _: () = {
    const fn send<T: Send>() {}
    send::<SlotHandle>();
};

impl Policy {
    fn new(
        base: &'static ProgramSlot,
        history: &'static stage::History,
        agreement: Result<Option<Agreement>, String>,
    ) -> Policy {
        let mute = agreement.is_err();
        let agreement = agreement.ok().flatten().map(Box::new);
        Policy {
            base,
            history,
            slot: AtomicPtr::new(base as *const ProgramSlot as *mut ProgramSlot),
            lock: BiasedLock::new(),
            agreed: agreement.is_some() || mute,
            failed: AtomicBool::new(false),
            mute,
            state: UnsafeCell::new(Switching {
                handle: base.handle(),
                generation: 0,
                next_switch: 0,
                agreement,
            }),
        }
    }

    /// Runs on `ctx` the program that makes this decision. `Some` if this caller holds
    /// `lock`: it holds it until the returned guard is dropped, and may write the context's
    /// sequence meanwhile, as decision number `.1` (read inside the lock: the single writer's).
    #[inline(always)]
    fn call(
        &self,
        ctx: &mut TunerCtx,
        seq: &Sequence,
        comm_id: u64,
        prep: impl Fn(&LoadedProgram, &mut TunerCtx),
    ) -> Option<(Guard<'_>, u64)> {
        let held = match self.lock.try_enter() {
            Some(g) => Some(g),
            None if self.agreed => Some(self.enter_waiting()),
            None => None,
        };
        if let Some(guard) = held {
            let next = seq.seq().wrapping_add(1);
            // SAFETY: we are inside `lock`, so no other thread holds the state until `guard`
            // is dropped (see the `Sync` impl above).
            let s = unsafe { &mut *self.state.get() };
            let g = self.history.generation();
            if g != s.generation || next >= s.next_switch {
                self.place(s, g, next, comm_id, seq.digest());
            }
            match s.agreement.as_deref_mut() {
                None if self.mute => {}
                None => {
                    s.handle.call_prepared(ctx, prep);
                }
                Some(a) => {
                    a.count(ctx.msg_size);
                    if a.opinion() {
                        let _view = a.install();
                        s.handle.call_prepared(ctx, prep);
                    }
                }
            }
            Some((guard, next))
        } else {
            // SAFETY: `slot` points to a slot that lives as long as the process (see above).
            let slot = unsafe { &*self.slot.load(Ordering::Acquire) };
            slot.handle().call_prepared(ctx, prep);
            None
        }
    }

    /// Enters `lock`, waiting for another caller of this context to let go (contexts that run
    /// the agreement only).
    #[cold]
    fn enter_waiting(&self) -> Guard<'_> {
        self.lock.enter()
    }

    /// Puts the handle on the program that makes decision `next`.
    #[cold]
    fn place(&self, s: &mut Switching, generation: u64, next: u64, comm_id: u64, digest: u64) {
        let (staged, mut next_switch) = self.history.program_for(next);
        if let Some(a) = s.agreement.as_deref_mut() {
            // Config updates first, then the epoch boundary: a record posted at this
            // decision carries the configuration in force from it, the same on every rank.
            for (i, from, up) in self.history.configs_from(a.configs_seen()) {
                if from > next {
                    next_switch = next_switch.min(from);
                    break;
                }
                match a.apply_config(i, &up) {
                    Ok(()) => crate::tlog!(
                        INFO,
                        TUNING,
                        "comm {comm_id:#018x}: config {} from seq {next} on",
                        up.describe()
                    ),
                    Err(e) => crate::tlog!(
                        WARN,
                        TUNING,
                        "comm {comm_id:#018x}: staged config {} not applied at seq {next}: {e}",
                        up.describe()
                    ),
                }
            }
            if let agree::Boundary::Note(line) = a.boundary(next, digest) {
                if a.opinion() {
                    crate::tlog!(INFO, TUNING, "{line}");
                } else {
                    crate::tlog!(WARN, TUNING, "{line}");
                }
            }
            if a.failed() {
                self.failed.store(true, Ordering::Release);
            }
            next_switch = next_switch.min(a.next_boundary(next));
        }
        let slot = staged.unwrap_or(self.base);
        let now = self.slot.load(Ordering::Relaxed);
        if !std::ptr::eq(now, slot) {
            s.handle = slot.handle();
            self.slot.store(
                slot as *const ProgramSlot as *mut ProgramSlot,
                Ordering::Release,
            );
            let p = slot.current();
            crate::tlog!(
                INFO,
                TUNING,
                "comm {comm_id:#018x}: tuner program '{}' makes decisions from seq {next} on",
                p.name
            );
        }
        s.generation = generation;
        s.next_switch = next_switch;
    }
}

/// What the plugin did with answers it does not pass on as given: `getChunkSize` outcomes
/// (changed; refused, a value under the protocol's grain, the first logged at once) and channel
/// counts kept from NCCL (see [`decide::channels_allowed`]).
#[derive(Default)]
struct Adjustments {
    changed: AtomicU64,
    refused: AtomicU64,
    /// Channel counts not handed to NCCL (see [`decide::channels_allowed`]).
    channels_refused: AtomicU64,
}

impl Adjustments {
    #[cold]
    fn channels_refused(&self, n: u32, algo: Option<i32>) {
        if self.channels_refused.fetch_add(1, Ordering::Relaxed) == 0 {
            let algo = algo.map_or("an algorithm not known here".to_string(), |a| {
                format!("algorithm {a}")
            });
            crate::tlog!(
                WARN,
                TUNING,
                "channel count {n} not applied: NCCL runs this collective with {algo}, for which \
                 it uses a tuner's count unchecked (CollNet, NVLS across nodes), and the tuner is \
                 not told the communicator's channel count; NCCL's count kept (later ones counted \
                 at finalize)"
            );
        }
    }

    fn note(&self, o: &chunk::ChunkOutcome) {
        match *o {
            chunk::ChunkOutcome::Kept => {}
            chunk::ChunkOutcome::Changed { .. } => {
                self.changed.fetch_add(1, Ordering::Relaxed);
            }
            chunk::ChunkOutcome::Refused { value } => {
                if self.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    crate::tlog!(
                        WARN,
                        TUNING,
                        "tuner/chunk: chunk size {value} refused (below the protocol's grain), NCCL's kept; later refusals are counted at finalize"
                    );
                }
            }
        }
    }

    fn summary(&self) -> Option<String> {
        let (c, r) = (
            self.changed.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        );
        let ch = self.channels_refused.load(Ordering::Relaxed);
        let chunks = (c + r > 0).then(|| format!("; chunk sizes: {c} changed, {r} refused"));
        let channels =
            (ch > 0).then(|| format!("; channel counts not applied (unchecked by NCCL): {ch}"));
        match (chunks, channels) {
            (None, None) => None,
            (a, b) => Some(format!(
                "{}{}",
                a.unwrap_or_default(),
                b.unwrap_or_default()
            )),
        }
    }
}

impl TunerContext {
    pub fn new(comm_id: u64, nranks: usize, nnodes: usize) -> TunerContext {
        TunerContext::with_slot(
            comm_id,
            nranks,
            nnodes,
            policy::slot(),
            Some(Registry::global()),
            &stage::HISTORY,
            &agree::Setting::from_env(),
        )
    }

    /// A context of `slot`'s program with the agreement `setting` and staged changes from
    /// `history` (for tests and tools that drive contexts in-process): decisions not published.
    pub fn for_programs(
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        slot: &'static ProgramSlot,
        setting: &agree::Setting,
        history: &'static stage::History,
    ) -> TunerContext {
        TunerContext::with_slot(comm_id, nranks, nnodes, Some(slot), None, history, setting)
    }

    /// A context running the programs of `slot` (none: NCCL keeps its choices), its decisions'
    /// record published in `registry` (none: kept to itself).
    fn with_slot(
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        slot: Option<&'static ProgramSlot>,
        registry: Option<&Registry>,
        history: &'static stage::History,
        setting: &agree::Setting,
    ) -> TunerContext {
        let (nranks, nnodes) = (
            nranks.min(u32::MAX as usize) as u32,
            nnodes.min(u32::MAX as usize) as u32,
        );
        // The record first: an agreement publishes its words into it.
        let (sequence, problem) = Sequence::new(registry, comm_id, nranks, nnodes, slot.is_some());
        let sequence = Arc::new(sequence);
        let mut shown = None;
        let policy = slot.map(|s| {
            let a = setting.agreement_for(comm_id, nranks, nnodes, &s.current(), Some(&sequence));
            if let Ok(Some(a)) = &a {
                shown = Some(a.shown());
            }
            match &a {
                Err(why) => crate::tlog!(WARN, TUNING, "comm {comm_id:#018x}: {why}"),
                Ok(Some(a)) => crate::tlog!(
                    INFO,
                    TUNING,
                    "comm {comm_id:#018x}: agreement on (epochs of {} collectives, applied {} \
                     epochs later, configuration digest {:#018x}); no opinion until the first \
                     agreement",
                    a.params().epoch,
                    a.params().delay,
                    a.config()
                ),
                Ok(None) => {}
            }
            Policy::new(s, history, a)
        });
        // Contexts with a policy count their decisions, which staged swaps check.
        let watch = policy.as_ref().map(|p| {
            let seq = sequence.clone();
            history.watch(stage::Watch {
                comm_id,
                seq: Box::new(move || seq.seq()),
                views: p.agreed && !p.mute,
                agreement: shown.take(),
            })
        });
        if let Some(p) = problem {
            crate::tlog!(
                WARN,
                TUNING,
                "comm {comm_id:#018x}: decisions not published for `ncclbpf decisions --compare`: {p}"
            );
        }
        TunerContext {
            comm_id,
            nranks,
            nnodes,
            policy,
            sequence,
            _watch: watch,
            adjusted: Adjustments::default(),
            trace: trace_decisions(),
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
        self.decide_with(coll, n_bytes, num_pipe_ops, reg_buff, 0, table)
    }

    /// [`decide`](Self::decide), with the channel count NCCL passed (`max_channels`).
    ///
    /// Inlined into `getCollInfo`: returned through memory, the decision (assembled field by
    /// field on the stack, then copied out as 16 bytes) stalled on store forwarding, about 4 ns
    /// a call (`perf annotate`, scripts/tuner-bench.sh).
    #[inline(always)]
    pub fn decide_with(
        &self,
        coll: NcclFunc,
        n_bytes: usize,
        num_pipe_ops: i32,
        reg_buff: i32,
        max_channels: u32,
        table: Option<(&mut [f32], usize, usize)>,
    ) -> Option<Decision> {
        let policy = self.policy.as_ref()?;
        let mut ctx = decide::policy_ctx(&Collective {
            coll_type: coll.0,
            n_bytes,
            num_pipe_ops,
            reg_buff,
            comm_id: self.comm_id,
            nranks: self.nranks,
            nnodes: self.nnodes,
            max_channels,
        });
        let seen = table.as_ref().map(|(t, na, np)| (&**t, *na, *np));
        let prep = |p: &LoadedProgram, ctx: &mut TunerCtx| {
            let (at, len) = TunerCtx::TABLE_FIELDS;
            if let Some((t, na, np)) = seen
                && p.stats.reads_ctx(at, len)
            {
                decide::fill_table(ctx, t, na, np);
            }
        };
        let owner = policy.call(&mut ctx, &self.sequence, self.comm_id, prep);
        let d = match table {
            Some((t, na, np)) => decide::apply(&ctx, t, na, np),
            None => Decision {
                algo: ctx.algo,
                proto: ctx.proto,
                nchannels: ctx.nchannels,
                applied: false,
            },
        };
        // Counted and sequenced while `lock` is still held (the single writer), then let go.
        let seq = match owner {
            Some((_held, next)) => {
                self.sequence.count(coll.0, &d);
                Some(self.sequence.record_at(next, coll.0, n_bytes as u64, &d))
            }
            None => {
                self.sequence.count_stray(coll.0, &d);
                self.sequence.unsequenced();
                None
            }
        };
        if self.trace {
            self.trace_line(coll, n_bytes, &d, seq);
        }
        Some(d)
    }

    /// One decision in NCCL's log: `seq N: coll C B B: algo A proto P channels N (applied),
    /// digest 0x…` (the fields of the digest, which a tool can recompute from these lines).
    #[cold]
    fn trace_line(&self, coll: NcclFunc, n_bytes: usize, d: &Decision, seq: Option<(u64, u64)>) {
        let (at, digest) = match seq {
            Some((s, h)) => (s.to_string(), format!(", digest {h:#018x}")),
            None => (
                "-".into(),
                " (outside the sequence: another thread held the context)".into(),
            ),
        };
        crate::tlog!(
            TRACE,
            TUNING,
            "seq {at}: coll {} {} B: algo {} proto {} channels {} ({}){digest}",
            coll.0,
            n_bytes,
            d.algo,
            d.proto,
            d.nchannels,
            if d.applied { "applied" } else { "not applied" }
        );
    }

    /// Whether the agreement failed: every call then returns an error to NCCL.
    #[inline(always)]
    pub fn failed(&self) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|p| p.failed.load(Ordering::Relaxed))
    }

    /// The agreement's summary at finalize (`None` without one).
    pub fn agreement_summary(&self) -> Option<String> {
        let p = self.policy.as_ref()?;
        // SAFETY: finalize runs after NCCL's last call on the context: nobody holds `lock`.
        let s = unsafe { &*p.state.get() };
        s.agreement.as_ref().map(|a| a.summary())
    }

    /// The sequence of this context's decisions (`seq`, digest, calls outside it).
    pub fn sequence(&self) -> &Sequence {
        &self.sequence
    }

    /// The sequence at finalize, as a log line (`None` without a policy: nothing sequenced).
    /// Not `comm …:` first, which readers of the summary line look for.
    pub fn sequence_summary(&self) -> Option<String> {
        self.policy.as_ref()?;
        let s = &self.sequence;
        let outside = match s.unsequenced_calls() {
            0 => String::new(),
            n => format!(
                "; {n} call(s) outside the sequence (another thread held the context), so the \
                 digest may differ from other ranks' even where every decision agreed"
            ),
        };
        Some(format!(
            "decision digest of comm {:#018x}: seq {}, digest {:#018x}{}{outside}",
            self.comm_id,
            s.seq(),
            s.digest(),
            if s.published() {
                ""
            } else {
                " (not published)"
            }
        ))
    }

    /// The decisions so far, as a log line: the counts of the context's record
    /// ([`Sequence::count`]) summed over collectives, by (algo, proto, applied) in that order,
    /// then those with an algorithm or protocol out of NCCL's ranges (not applied, applied).
    pub fn summary(&self) -> String {
        let line = |what: String, ok: bool, n: u64| {
            format!("{what}{}: {n}", if ok { "" } else { " (not applied)" })
        };
        let mut known: std::collections::BTreeMap<(i32, i32, bool), u64> = Default::default();
        let mut other = [0u64; 2];
        for (i, n) in self.sequence.counts().enumerate().filter(|(_, n)| *n > 0) {
            let b = crate::sequence::Bucket::of(i);
            match (b.algo, b.proto) {
                (Some(a), Some(p)) => *known.entry((a, p, b.applied)).or_default() += n,
                _ => other[b.applied as usize] += n,
            }
        }
        let mut parts: Vec<String> = known
            .into_iter()
            .map(|((a, p, ok), n)| line(format!("algo {a} proto {p}"), ok, n))
            .collect();
        for (ok, n) in [(false, other[0]), (true, other[1])] {
            if n > 0 {
                parts.push(line("algo/proto out of range".into(), ok, n));
            }
        }
        format!(
            "comm {:#018x}: {}{}",
            self.comm_id,
            if parts.is_empty() {
                "no decisions".into()
            } else {
                parts.join(", ")
            },
            self.adjusted.summary().unwrap_or_default()
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
        crate::control::register();
        let c = Box::new(TunerContext::new(comm_id, nranks, nnodes));
        // SAFETY: NCCL passes a valid out-pointer for the context.
        unsafe { ctx.write(Box::into_raw(c) as Vp) };
        ncclbpf_host::acquire(ncclbpf_host::Part::Tuner);
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

pub unsafe extern "C" fn init_v2(
    n_ranks: usize,
    n_nodes: usize,
    log: DebugLogger,
    ctx: *mut Vp,
) -> NcclResult {
    new_context(ctx, 0, n_ranks, n_nodes, log)
}

pub unsafe extern "C" fn init_v5(
    ctx: *mut Vp,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: DebugLogger,
    nvl: *mut NvlDomainInfoV5,
    constants: *mut TunerConstantsV5,
) -> NcclResult {
    let r = new_context(ctx, comm_id, n_ranks, n_nodes, log);
    if r != NcclResult::SUCCESS || constants.is_null() {
        return r;
    }
    quiet("init (tuner/init)", || {
        let Some(prog) = policy::init_program() else {
            return;
        };
        let info = constants::InitInfo {
            comm_id,
            nranks: n_ranks.min(u32::MAX as usize) as u32,
            nnodes: n_nodes.min(u32::MAX as usize) as u32,
            nvl: None,
        }
        // SAFETY: NCCL passes its NVL domain info (or NULL) for the duration of init.
        .with_nvl(unsafe { nvl.as_ref() });
        // SAFETY: NCCL passes its constants, writable for the duration of init (checked
        // non-null above).
        let c = unsafe { &mut *constants };
        let out = constants::run_init(prog, &info, c);
        if out.refused.is_empty() {
            crate::tlog!(
                INFO,
                TUNING,
                "comm {comm_id:#018x}: tuner/init '{}': {}",
                prog.name,
                out.summary()
            );
        } else {
            crate::tlog!(
                WARN,
                TUNING,
                "comm {comm_id:#018x}: tuner/init '{}': {}",
                prog.name,
                out.summary()
            );
        }
    });
    r
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

/// What NCCL passed in `*nChannels` (0 in NCCL 2.28-2.30), for the policy's `max_channels`.
fn passed_channels(n_channels: *mut c_int) -> u32 {
    if n_channels.is_null() {
        return 0;
    }
    // SAFETY: NCCL passes a valid pointer to its channel count.
    u32::try_from(unsafe { *n_channels }).unwrap_or(0)
}

/// Hands NCCL channel count `n` (the decision's), unless NCCL would run the collective with an
/// algorithm (`algo`: as far as known) that takes the count unchecked
/// ([`decide::channels_allowed`]); such a refusal is counted, and logged the first time.
fn set_channels(
    c: &TunerContext,
    n_channels: *mut c_int,
    n: u32,
    algo: impl FnOnce() -> Option<i32>,
) {
    if n_channels.is_null() {
        return;
    }
    if n > 1 {
        let algo = algo();
        if !decide::channels_allowed(n, algo, c.nnodes) {
            c.adjusted.channels_refused(n, algo);
            return;
        }
    }
    // SAFETY: NCCL passes a valid pointer to its channel count.
    unsafe { *n_channels = n.min(c_int::MAX as u32) as c_int };
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn get_coll_info_v4(
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
    let mut rc = NcclResult::SUCCESS;
    quiet("getCollInfo", || {
        let Some(c) = context(ctx) else { return };
        let d = c.decide_with(
            coll,
            n_bytes,
            num_pipe_ops,
            reg_buff,
            passed_channels(n_channels),
            cost_table(table, num_algo, num_proto),
        );
        if c.failed() {
            rc = NcclResult::INTERNAL_ERROR;
            return;
        }
        if let Some(d) = d {
            // The algorithm NCCL will run: its pick from the table as the policy left it.
            if let Some(n) = d.channels() {
                set_channels(c, n_channels, n, || {
                    cost_table(table, num_algo, num_proto)
                        .and_then(|(t, na, np)| decide::nccl_pick(t, na, np))
                });
            }
        }
    });
    rc
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn get_coll_info_v3(
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
pub unsafe extern "C" fn get_coll_info_v2(
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
    let mut rc = NcclResult::SUCCESS;
    quiet("getCollInfo", || {
        let Some(c) = context(ctx) else { return };
        let d = c.decide_with(
            coll,
            n_bytes,
            num_pipe_ops,
            0,
            passed_channels(n_channels),
            None,
        );
        if c.failed() {
            rc = NcclResult::INTERNAL_ERROR;
            return;
        }
        let Some(mut d) = d else {
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
            d.applied = true;
        }
        // v2: NCCL runs the pair it was given; without one its pick is not known here.
        if let Some(n) = d.channels() {
            set_channels(c, n_channels, n, || d.applied.then_some(d.algo));
        }
    });
    rc
}

pub unsafe extern "C" fn finalize(ctx: Vp) -> NcclResult {
    quiet("finalize", || {
        if let Some(c) = context(ctx) {
            crate::tlog!(INFO, TUNING, "{}", c.summary());
            if let Some(line) = c.sequence_summary() {
                crate::tlog!(INFO, TUNING, "{line}");
            }
            if let Some(line) = c.agreement_summary() {
                crate::tlog!(INFO, TUNING, "{line}");
            }
            // SAFETY: NCCL finalizes each context once; it came from Box::into_raw.
            drop(unsafe { Box::from_raw(ctx as *mut TunerContext) });
            ncclbpf_host::release(ncclbpf_host::Part::Tuner);
        }
    });
    NcclResult::SUCCESS
}

/// `getChunkSize` (tuner v6, NCCL >= 2.30): the `tuner/chunk` program may change NCCL's chunk.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn get_chunk_size(
    ctx: Vp,
    coll: NcclFunc,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    chunk_size: *mut usize,
) -> NcclResult {
    quiet("getChunkSize", || {
        let (Some(c), Some(prog)) = (context(ctx), policy::chunk_program()) else {
            return;
        };
        if chunk_size.is_null() {
            return;
        }
        let q = chunk::ChunkQuery {
            comm_id: c.comm_id,
            coll_type: coll.0 as u32,
            n_bytes: n_bytes as u64,
            algo,
            proto,
            nchannels: n_channels.max(0) as u32,
            nranks: c.nranks,
            nnodes: c.nnodes,
        };
        // SAFETY: NCCL passes its chunk size, in/out, valid for the call (checked non-null).
        let chunk = unsafe { &mut *chunk_size };
        let outcome = chunk::run_chunk(prog, &q, chunk);
        c.adjusted.note(&outcome);
    });
    NcclResult::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy_runtime::LoadOptions;
    use shared_maps::Registry;
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicU32;

    /// A tuner program: messages over 4096 bytes get (ring, simple), others (NCCL's algo, LL);
    /// nchannels is `version` either way.
    fn program(version: u32) -> LoadedProgram {
        let text = format!(
            "ldxdw %r2, [%r1+0]
             stw [%r1+48], {version}
             jgt %r2, 4096, big
             stw [%r1+44], 0
             ja done
             big:
             stw [%r1+40], 1
             stw [%r1+44], 2
             done:
             mov %r0, 0
             exit"
        );
        let obj = policy_object::Object {
            programs: vec![policy_object::Program {
                name: format!("v{version}"),
                section: "tuner".into(),
                insns: policy_object::asm::assemble(&text).unwrap(),
                lines: vec![],
            }],
            maps: vec![],
        };
        let reg = Registry::new(
            std::env::temp_dir().join(format!("ncclbpf-tuner-test-{}", std::process::id())),
        );
        LoadedProgram::load(&obj, None, &reg, &LoadOptions::default()).unwrap()
    }

    /// The summary as the `BTreeMap` of (algo, proto, applied) counts used to write it.
    fn reference_summary(comm_id: u64, decisions: &[Decision]) -> String {
        let mut counts: BTreeMap<(i32, i32, bool), u64> = BTreeMap::new();
        for d in decisions {
            *counts.entry((d.algo, d.proto, d.applied)).or_default() += 1;
        }
        let parts: Vec<String> = counts
            .iter()
            .map(|((a, p, ok), n)| {
                format!(
                    "algo {a} proto {p}{}: {n}",
                    if *ok { "" } else { " (not applied)" }
                )
            })
            .collect();
        format!(
            "comm {comm_id:#018x}: {}",
            if parts.is_empty() {
                "no decisions".into()
            } else {
                parts.join(", ")
            }
        )
    }

    fn d(algo: i32, proto: i32, applied: bool) -> Decision {
        Decision {
            algo,
            proto,
            nchannels: 0,
            applied,
        }
    }

    #[test]
    fn summary_keeps_its_format() {
        let c = TunerContext::with_slot(
            0xabc,
            8,
            2,
            None,
            None,
            &stage::HISTORY,
            &agree::Setting::OFF,
        );
        assert_eq!(c.summary(), "comm 0x0000000000000abc: no decisions");
        let mut all = vec![];
        for a in -1..NUM_ALGORITHMS as i32 {
            for p in -1..NUM_PROTOCOLS as i32 {
                for ok in [true, false] {
                    for _ in 0..(a + 2) * (p + 3) + ok as i32 {
                        all.push(d(a, p, ok));
                    }
                }
            }
        }
        // Out of order on purpose: the summary sorts as the map did. Spread over collectives,
        // NCCL's and others (-1, 8, 9): the summary sums over them.
        all.reverse();
        for (i, x) in all.iter().enumerate() {
            c.sequence.count((i % 11) as i32 - 1, x);
        }
        assert_eq!(c.summary(), reference_summary(0xabc, &all));

        let c = TunerContext::with_slot(1, 8, 2, None, None, &stage::HISTORY, &agree::Setting::OFF);
        for (coll, x) in [(4, d(1, 2, true)), (0, d(-1, 0, true)), (2, d(1, 2, true))] {
            c.sequence.count(coll, &x);
        }
        assert_eq!(
            c.summary(),
            "comm 0x0000000000000001: algo -1 proto 0: 1, algo 1 proto 2: 2"
        );
        // Values outside NCCL's ranges are counted together, after the others.
        for x in [
            d(7, 0, false),
            d(-2, 0, false),
            d(0, 3, false),
            d(9, 9, true),
        ] {
            c.sequence.count(NcclFunc::ALL_REDUCE.0, &x);
        }
        assert_eq!(
            c.summary(),
            "comm 0x0000000000000001: algo -1 proto 0: 1, algo 1 proto 2: 2, \
             algo/proto out of range (not applied): 3, algo/proto out of range: 1"
        );
    }

    #[test]
    fn no_policy_decides_nothing_and_counts_nothing() {
        let c = TunerContext::with_slot(2, 8, 2, None, None, &stage::HISTORY, &agree::Setting::OFF);
        let mut t = vec![1.0f32; 21];
        assert_eq!(
            c.decide(NcclFunc::ALL_REDUCE, 1 << 20, 1, 0, Some((&mut t, 7, 3))),
            None
        );
        assert_eq!(t, vec![1.0f32; 21]);
        assert_eq!(c.summary(), "comm 0x0000000000000002: no decisions");
        assert_eq!(c.sequence().seq(), 0, "nothing sequenced");
        assert_eq!(c.sequence_summary(), None);
    }

    /// Several threads on one context while the program is swapped under them: every call
    /// decides as the program says, runs one whole version, and is counted exactly once.
    #[test]
    fn concurrent_calls_on_one_context_are_all_decided_and_counted() {
        const THREADS: usize = 4;
        const CALLS: usize = 100_000;
        let slot: &'static ProgramSlot = Box::leak(Box::new(ProgramSlot::new(program(1))));
        let ctx = TunerContext::with_slot(
            0xc0ffee,
            8,
            2,
            Some(slot),
            None,
            &stage::HISTORY,
            &agree::Setting::OFF,
        );
        let installed = AtomicU32::new(1);
        let done = AtomicU32::new(0);
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut v = 1;
                while done.load(Ordering::Acquire) < THREADS as u32 && v < 200 {
                    v += 1;
                    let p = program(v);
                    // Announced before it can run, so callers never see a newer version.
                    installed.store(v, Ordering::Release);
                    slot.install(p).unwrap();
                    std::thread::yield_now();
                }
            });
            for t in 0..THREADS {
                let (ctx, installed, done, start) = (&ctx, &installed, &done, &start);
                s.spawn(move || {
                    start.wait();
                    for i in 0..CALLS {
                        let big = (i + t) % 3 == 0;
                        let n = if big { 1 << 20 } else { 64 };
                        let mut table = [5.0f32, 4.0, 3.0, 1.0, 2.0, 6.0];
                        let d = ctx
                            .decide(NcclFunc::ALL_REDUCE, n, 1, 0, Some((&mut table, 2, 3)))
                            .expect("a policy is loaded");
                        let v = d.nchannels;
                        assert!(v >= 1 && v <= installed.load(Ordering::Acquire), "{v}");
                        if big {
                            assert_eq!((d.algo, d.proto, d.applied), (1, 2, true));
                            assert_eq!(table, [5.0, 4.0, 3.0, 1.0, 2.0, 0.0]);
                        } else {
                            assert_eq!((d.algo, d.proto, d.applied), (-1, 0, true));
                            assert_eq!(table, [5.0, 4.0, 3.0, 0.0, 2.0, 6.0]);
                        }
                    }
                    done.fetch_add(1, Ordering::Release);
                });
            }
        });
        let big = (0..THREADS)
            .map(|t| (0..CALLS).filter(|i| (i + t) % 3 == 0).count())
            .sum::<usize>();
        let small = THREADS * CALLS - big;
        assert_eq!(
            ctx.summary(),
            format!("comm 0x0000000000c0ffee: algo -1 proto 0: {small}, algo 1 proto 2: {big}")
        );
        assert!(!ctx.policy.as_ref().unwrap().lock.taken());
        // Every call is in the sequence or counted outside it, none in both.
        let s = ctx.sequence();
        assert_eq!(
            s.seq() + s.unsequenced_calls(),
            (THREADS * CALLS) as u64,
            "{} sequenced, {} outside",
            s.seq(),
            s.unsequenced_calls()
        );
    }

    /// A program that reads the cost-table fields sees them filled from the table NCCL passed:
    /// here one that answers NCCL's own pick (nccl_algo, nccl_proto), through the v4 ABI. One
    /// that decides from `usable` is refused at load: only the pick is the same on every rank.
    #[test]
    fn programs_that_read_the_table_fields_see_nccls_table() {
        let object = |text: &str| policy_object::Object {
            programs: vec![policy_object::Program {
                name: "echo".into(),
                section: "tuner".into(),
                insns: policy_object::asm::assemble(text).unwrap(),
                lines: vec![],
            }],
            maps: vec![],
        };
        let reg = Registry::new(
            std::env::temp_dir().join(format!("ncclbpf-tuner-tbl-{}", std::process::id())),
        );
        let from_usable = object(
            "ldxw %r4, [%r1+52]
             stxw [%r1+48], %r4
             mov %r0, 0
             exit",
        );
        let e = LoadedProgram::load(&from_usable, None, &reg, &LoadOptions::default())
            .expect_err("a channel count from usable");
        assert!(e.to_string().contains("usable"), "{e}");
        let pick = object(
            "ldxw %r2, [%r1+56]
             ldxw %r3, [%r1+60]
             stxw [%r1+40], %r2
             stxw [%r1+44], %r3
             mov %r0, 0
             exit",
        );
        let p = LoadedProgram::load(&pick, None, &reg, &LoadOptions::default()).unwrap();
        assert!(p.stats.reads_ctx(56, 8) && !p.stats.reads_ctx(52, 4));
        let slot: &'static ProgramSlot = Box::leak(Box::new(ProgramSlot::new(p)));
        let c = TunerContext::with_slot(
            9,
            2,
            1,
            Some(slot),
            None,
            &stage::HISTORY,
            &agree::Setting::OFF,
        );
        // Usable: Tree/Simple (2), Ring/LL (3), Ring/Simple (5); Ring/LL is the cheapest, and
        // Ring/Simple ties with it later in NCCL's order (the first one wins).
        let mut table = [-1.0f32; 21];
        (table[2], table[3], table[5]) = (7.0, 2.0, 2.0);
        let d = c
            .decide_with(
                NcclFunc::ALL_REDUCE,
                1 << 16,
                1,
                0,
                0,
                Some((&mut table, 7, 3)),
            )
            .unwrap();
        assert_eq!((d.algo, d.proto), (1, 0), "NCCL's pick, Ring/LL");
        assert!(d.applied && table[3] == 0.0);
        // Without a table (ABI v2) they read as not known.
        let d = c
            .decide_with(NcclFunc::ALL_REDUCE, 1 << 16, 1, 0, 0, None)
            .unwrap();
        assert_eq!((d.algo, d.proto), (-1, -1));
    }

    /// A channel count is not handed to NCCL where NCCL would take it unchecked: CollNet, or
    /// NVLS across nodes, as NCCL's pick from the table the policy left.
    #[test]
    fn channel_counts_stay_out_of_algorithms_that_do_not_clamp_them() {
        let obj = policy_object::Object {
            programs: vec![policy_object::Program {
                name: "eight".into(),
                section: "tuner".into(),
                insns: policy_object::asm::assemble("stw [%r1+48], 8\nmov %r0, 0\nexit").unwrap(),
                lines: vec![],
            }],
            maps: vec![],
        };
        let reg = Registry::new(
            std::env::temp_dir().join(format!("ncclbpf-tuner-ch-{}", std::process::id())),
        );
        let p = LoadedProgram::load(&obj, None, &reg, &LoadOptions::default()).unwrap();
        let slot: &'static ProgramSlot = Box::leak(Box::new(ProgramSlot::new(p)));
        let call = |nnodes: usize, cheapest: usize| -> i32 {
            let ctx = Box::into_raw(Box::new(TunerContext::with_slot(
                9,
                8,
                nnodes,
                Some(slot),
                None,
                &stage::HISTORY,
                &agree::Setting::OFF,
            )));
            let mut table = [10.0f32; 21];
            table[cheapest * 3 + 2] = 1.0;
            let mut n = 0;
            // SAFETY: a live context, a 7 x 3 table and an out-pointer, as NCCL passes them.
            let r = unsafe {
                get_coll_info_v4(
                    ctx as Vp,
                    NcclFunc::ALL_REDUCE,
                    1 << 20,
                    1,
                    // NCCL passes its float[7][3] as `float**`.
                    table.as_mut_ptr() as *mut *mut f32,
                    7,
                    3,
                    0,
                    &mut n,
                )
            };
            assert_eq!(r, NcclResult::SUCCESS);
            // SAFETY: made above, used no more.
            let c = unsafe { Box::from_raw(ctx) };
            let refused = c.adjusted.channels_refused.load(Ordering::Relaxed);
            assert_eq!(refused, u64::from(n == 0), "{}", c.summary());
            n
        };
        assert_eq!(call(1, 1), 8, "ring: NCCL clamps it");
        assert_eq!(call(1, 0), 8, "tree");
        assert_eq!(call(1, 2), 0, "collnet direct: unchecked");
        assert_eq!(call(1, 3), 0, "collnet chain: unchecked");
        assert_eq!(call(1, 4), 8, "nvls on one node: clamped");
        assert_eq!(call(2, 4), 0, "nvls across nodes: unchecked");
        assert_eq!(call(2, 5), 0, "nvls tree across nodes");
    }

    /// A staged program makes every decision from its start on, in a context that was live
    /// when it was staged and in one created later alike; the decisions before it stay the
    /// old program's.
    #[test]
    fn a_staged_program_takes_over_at_its_sequence_number() {
        let history: &'static stage::History = Box::leak(Box::new(stage::History::new()));
        let slot: &'static ProgramSlot = Box::leak(Box::new(ProgramSlot::new(program(1))));
        let channels = |ctx: &TunerContext, n: usize| -> Vec<u32> {
            (0..n)
                .map(|_| {
                    let mut table = [5.0f32, 4.0, 3.0, 1.0, 2.0, 6.0];
                    let d = ctx.decide(
                        NcclFunc::ALL_REDUCE,
                        1 << 20,
                        1,
                        0,
                        Some((&mut table, 2, 3)),
                    );
                    d.unwrap().nchannels
                })
                .collect()
        };
        let early =
            TunerContext::with_slot(1, 8, 2, Some(slot), None, history, &agree::Setting::OFF);
        assert_eq!(channels(&early, 10), [1; 10]);
        history
            .stage(100, ProgramSlot::new(program(2)), "v2", "/v2.o")
            .unwrap();
        let got = channels(&early, 150);
        assert_eq!(early.sequence().seq(), 160);
        assert!(
            got[..89].iter().all(|&c| c == 1),
            "decisions 11..99: {got:?}"
        );
        assert!(
            got[89..].iter().all(|&c| c == 2),
            "decisions 100..160: {got:?}"
        );
        let late =
            TunerContext::with_slot(2, 8, 2, Some(slot), None, history, &agree::Setting::OFF);
        let got = channels(&late, 120);
        assert!(got[..99].iter().all(|&c| c == 1) && got[99..].iter().all(|&c| c == 2));
        // Too late for a stage at 150 now: the early context is past it.
        assert!(matches!(
            history.stage(200, ProgramSlot::new(program(3)), "v3", "/v3.o"),
            Err(stage::Refusal::TooLate { .. })
        ));
        // Unstaging is refused once a context runs the stage.
        assert!(history.unstage().is_err());
    }

    /// A call that finds the handle taken (another thread inside it) still decides, through
    /// the slot's current program, and is counted.
    #[test]
    fn a_busy_handle_falls_back_to_the_slot() {
        let slot: &'static ProgramSlot = Box::leak(Box::new(ProgramSlot::new(program(1))));
        let ctx = TunerContext::with_slot(
            3,
            8,
            2,
            Some(slot),
            None,
            &stage::HISTORY,
            &agree::Setting::OFF,
        );
        let p = ctx.policy.as_ref().unwrap();
        let held = p.lock.hold();
        slot.install(program(2)).unwrap();
        let mut table = [5.0f32, 4.0, 3.0, 1.0, 2.0, 6.0];
        let d = ctx.decide(
            NcclFunc::ALL_REDUCE,
            1 << 20,
            1,
            0,
            Some((&mut table, 2, 3)),
        );
        assert_eq!(
            d,
            Some(Decision {
                algo: 1,
                proto: 2,
                nchannels: 2,
                applied: true
            })
        );
        assert!(p.lock.taken(), "the holder's lock is left alone");
        let s = ctx.sequence();
        assert_eq!(
            (s.seq(), s.unsequenced_calls()),
            (0, 1),
            "outside the sequence"
        );
        drop(held);
        let d = ctx.decide(NcclFunc::ALL_REDUCE, 64, 1, 0, None).unwrap();
        assert_eq!((d.algo, d.proto, d.nchannels, d.applied), (-1, 0, 2, false));
        assert!(!p.lock.taken());
        assert_eq!((s.seq(), s.unsequenced_calls()), (1, 1));
        assert_eq!(s.digest(), crate::digest::fold(0, 1, 4, 64, &d));
        assert_eq!(
            ctx.sequence_summary().unwrap(),
            format!(
                "decision digest of comm 0x0000000000000003: seq 1, digest {:#018x} (not \
                 published); 1 call(s) outside the sequence (another thread held the context), \
                 so the digest may differ from other ranks' even where every decision agreed",
                s.digest()
            )
        );
        assert_eq!(
            ctx.summary(),
            "comm 0x0000000000000003: algo -1 proto 0 (not applied): 1, algo 1 proto 2: 1"
        );
    }
}
