//! Events from start to stop: NCCL's calls, made safe.
//!
//! Contexts (one per communicator and rank, from `init`) and events live in two
//! [`Table`]s of generation-tagged slots; NCCL holds only [`Handle`]s to them. Every call
//! looks its handle up first, and a handle that names nothing (unknown, stopped already, of a
//! finalized context) is ignored and counted ([`counters`]): never a crash, never an error
//! returned to NCCL. No lock is held across a call out of this crate: a table's shard is
//! locked only to look up, insert, update or remove one value; logging and policy programs
//! run after.
//!
//! Parents are followed only where the figures need them: a KernelCh event adds its GPU
//! times to its collective ([`Pending`]), and proxy ops, proxy steps and net events copy the
//! collective's function and sequence number from their parent when it is theirs. A parent of
//! another communicator is ignored and counted.
//!
//! `finalize` removes the context first (later calls with it are ignored), then every event
//! still open under it; an event started concurrently with the finalize sees its context gone
//! right after inserting itself and removes itself. So nothing of a finalized context stays
//! behind, whatever NCCL does after.

use crate::collective::{self, Pending};
use crate::counters::{Counter, Counters};
use crate::event::{Descr, Kind, Op, StateUpdate};
use crate::handles::{Freed, Handle, Miss, Table};
use crate::programs::{self, Programs};
use crate::stats::{self, Sample, Stats};
use ncclnet_headers::profiler::{event, state};
use policy_runtime::ProfilerCtx;
use shared_maps::Registry;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Instant;

/// Events followed at once, process-wide.
pub const MAX_EVENTS: usize = 1 << 20;
/// Contexts at once.
pub const MAX_CONTEXTS: usize = 1 << 16;
/// Operations of one context waiting for their GPU times; past this, those the host stopped
/// are reclaimed (a channel event that never came must not hold them forever).
pub const MAX_PENDING: usize = 8192;

/// A communicator as one rank's profiler sees it.
pub struct Ctx {
    pub comm_id: u64,
    pub rank: i32,
    pub nranks: u32,
    pub nnodes: u32,
    pub name: String,
    alive: AtomicBool,
    pub stats: Stats,
    pending: AtomicUsize,
    timed: AtomicU64,
    untimed: AtomicU64,
    /// With sampling: this context's operations in start order, for retiring those NCCL ran
    /// without channel events (see [`Sampling`]).
    order: Mutex<VecDeque<Handle>>,
}

/// Timing one collective in `every` (`NCCL_BPF_PROFILER_SAMPLE`): NCCL's own cost of channel
/// events (a profiler proxy operation per channel per collective, the kernel's timestamp
/// writes) is paid only for the sampled ones.
///
/// NCCL hands `init` a pointer to its process-wide mask and reads it again for every
/// collective it enqueues (`ncclProfilerEventMask`; NCCL's example profiler changes it the
/// same way; the adapter hands the tracker a writer for it, [`Tracker::set_mask_target`]).
/// After each collective or p2p start the tracker sets or clears KernelCh for the
/// next one: timed when its number is a multiple of `every`. It cannot see which mask NCCL
/// took for a given collective, so an operation is never retired on that guess: one whose host
/// stop came and no channel ever started is retired untimed when a later operation of its
/// context starts a channel (a communicator's kernels run in order), or at finalize.
pub struct Sampling {
    pub every: u64,
}

enum Body {
    Op(Pending),
    Channel {
        parent: Handle,
        channel: u8,
        start: u64,
        stop: u64,
        func: u8,
        seq: u64,
    },
    Proxy {
        kind: u32,
        func: u8,
        seq: u64,
        channel: u8,
        peer: i32,
        is_send: bool,
        step: i32,
        bytes: u64,
        state: i32,
    },
}

struct Ev {
    ctx: Arc<Ctx>,
    started: Instant,
    body: Body,
}

/// One profiler: its contexts, events, mask and programs.
pub struct Tracker {
    ctxs: Table<Arc<Ctx>>,
    events: Table<Ev>,
    mask: u64,
    programs: &'static Programs,
    registry: Option<&'static Registry>,
    epoch: Instant,
    pub counters: Counters,
    sampling: OnceLock<Sampling>,
    /// Writes the mask NCCL reads (NCCL's pointer from `init`, through the adapter).
    mask_target: OnceLock<Box<dyn Fn(u64) + Send + Sync>>,
    /// Paused: NCCL's mask is 0 (no events) until resumed.
    paused: AtomicBool,
    /// Operations started, process-wide (the sampling's clock).
    ops_started: AtomicU64,
    /// The mask last written through the mask target.
    written: AtomicU64,
}

fn misuse_of(m: Miss) -> Counter {
    match m {
        Miss::Null => Counter::NullHandle,
        Miss::Unknown => Counter::UnknownHandle,
        Miss::Stale(Freed::Stopped) => Counter::StaleStopped,
        Miss::Stale(Freed::Finalized) => Counter::StaleFinalized,
        Miss::Stale(Freed::Reclaimed) => Counter::StaleReclaimed,
    }
}

impl Tracker {
    pub fn new(
        mask: u64,
        programs: &'static Programs,
        registry: Option<&'static Registry>,
    ) -> Tracker {
        Tracker {
            counters: registry.map_or_else(Counters::private, Counters::published),
            ctxs: Table::new(MAX_CONTEXTS, 1),
            events: Table::new(MAX_EVENTS, 2),
            mask,
            programs,
            registry,
            epoch: Instant::now(),
            sampling: OnceLock::new(),
            mask_target: OnceLock::new(),
            paused: AtomicBool::new(false),
            ops_started: AtomicU64::new(0),
            written: AtomicU64::new(mask),
        }
    }

    /// Where the mask NCCL reads is written (the first call wins: NCCL passes the same pointer
    /// to every `init`).
    pub fn set_mask_target(&self, write: Box<dyn Fn(u64) + Send + Sync>) -> bool {
        self.mask_target.set(write).is_ok()
    }

    fn write_mask(&self, m: u64) -> bool {
        let Some(w) = self.mask_target.get() else {
            return false;
        };
        if self.written.swap(m, Ordering::Relaxed) != m {
            w(m);
        }
        true
    }

    /// Samples one collective in `s.every` (from the next one on); refused (false) when the
    /// mask follows no channels, `every` is below 2, no mask target was set, or sampling was
    /// set already.
    pub fn set_sampling(&self, s: Sampling) -> bool {
        self.channels_followed()
            && s.every >= 2
            && self.mask_target.get().is_some()
            && self.sampling.set(s).is_ok()
    }

    fn sampling(&self) -> Option<&Sampling> {
        self.sampling.get()
    }

    /// Pauses the profiler: NCCL's mask becomes 0, so collectives enqueued from now on report
    /// no events (those already enqueued finish as they are). False before any `init`.
    pub fn pause(&self) -> bool {
        self.paused.store(true, Ordering::Relaxed);
        self.write_mask(0)
    }

    /// Resumes after [`Self::pause`]: the mask as before (with sampling, the next collective's).
    pub fn resume(&self) -> bool {
        self.paused.store(false, Ordering::Relaxed);
        let m = match self.sampling() {
            Some(s) if !(self.ops_started.load(Ordering::Relaxed) + 1).is_multiple_of(s.every) => {
                self.mask & !event::KERNEL_CH
            }
            _ => self.mask,
        };
        self.write_mask(m)
    }

    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// After an operation starts: the mask for the next one.
    fn sample_next(&self) {
        let Some(s) = self.sampling() else { return };
        let n = self.ops_started.fetch_add(1, Ordering::Relaxed) + 1;
        if self.paused() {
            return;
        }
        let want = if n.is_multiple_of(s.every) {
            self.mask
        } else {
            self.mask & !event::KERNEL_CH
        };
        self.write_mask(want);
    }

    /// With sampling: retires, in start order, the operations of `ctx` before `upto` that the
    /// host stopped and that never started a channel (NCCL ran them without channel events);
    /// stops at the first that has channels or is still with the host.
    fn retire_unsampled(&self, ctx: &Arc<Ctx>, upto: Handle) {
        if self.sampling().is_none() {
            return;
        }
        let mut done = vec![];
        {
            let mut order = ctx.order.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(&h) = order.front() {
                if h == upto {
                    break;
                }
                let r = self
                    .events
                    .update_or_remove(h, Freed::Stopped, |ev| match &ev.body {
                        Body::Op(o) => (
                            o.host_stopped && o.started == 0,
                            o.host_stopped && o.started == 0,
                        ),
                        _ => (false, false),
                    });
                match r {
                    Ok((Some(ev), true)) => {
                        order.pop_front();
                        if let Body::Op(o) = ev.body {
                            done.push(o);
                        }
                    }
                    // Still with the host, or waiting for its channels: later ones wait too.
                    Ok(_) => break,
                    // Retired already (its channels ended), or finalized.
                    Err(_) => {
                        order.pop_front();
                    }
                }
            }
        }
        for o in done {
            self.complete(ctx, &o);
        }
    }

    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// Events open now (all contexts).
    pub fn open_events(&self) -> usize {
        self.events.len()
    }

    /// Contexts open now.
    pub fn open_contexts(&self) -> usize {
        self.ctxs.len()
    }

    /// Whether `h` names an open event.
    pub fn is_open(&self, h: Handle) -> bool {
        self.events.with(h, |_| ()).is_ok()
    }

    /// Open events counted shard by shard under their locks (what [`Self::open_events`] keeps
    /// without locks).
    pub fn count_open_locked(&self) -> usize {
        self.events.count_locked()
    }

    /// The words of an open context's entry for `bucket` in `ncclbpf_collectives`.
    pub fn entry_words(&self, ctx: Handle, bucket: u32) -> Option<[u64; crate::stats::WORDS]> {
        self.ctxs
            .with(ctx, |c| c.stats.words(bucket))
            .ok()
            .flatten()
    }

    fn gauges(&self) {
        self.counters
            .set(Counter::OpenEvents, self.events.len() as u64);
        self.counters
            .set(Counter::OpenContexts, self.ctxs.len() as u64);
    }

    fn channels_followed(&self) -> bool {
        self.mask & event::KERNEL_CH != 0
    }

    /// `init`: a context for one rank of a communicator.
    pub fn init(
        &self,
        comm_id: u64,
        name: &str,
        nnodes: i32,
        nranks: i32,
        rank: i32,
    ) -> Option<Handle> {
        let r = self.init_inner(comm_id, name, nnodes, nranks, rank);
        self.gauges();
        r
    }

    fn init_inner(
        &self,
        comm_id: u64,
        name: &str,
        nnodes: i32,
        nranks: i32,
        rank: i32,
    ) -> Option<Handle> {
        let nranks_u = nranks.max(1) as u32;
        let (stats, problem) = Stats::new(self.registry, comm_id, rank.max(0) as u32, nranks_u);
        if let Some(p) = problem {
            crate::plog!(
                WARN,
                PROFILE,
                "comm {comm_id:#018x} rank {rank}: {p}; collectives are not published"
            );
        }
        let ctx = Arc::new(Ctx {
            comm_id,
            rank,
            nranks: nranks_u,
            nnodes: nnodes.max(1) as u32,
            name: name.chars().take(128).collect(),
            alive: AtomicBool::new(true),
            stats,
            pending: AtomicUsize::new(0),
            timed: AtomicU64::new(0),
            untimed: AtomicU64::new(0),
            order: Mutex::new(VecDeque::new()),
        });
        match self.ctxs.insert(ctx) {
            Ok(h) => {
                self.counters.add(Counter::ContextsOpened, 1);
                Some(h)
            }
            Err(_) => {
                self.counters.misuse(Counter::TableFull, "init");
                None
            }
        }
    }

    fn context(&self, h: Handle, during: &str) -> Option<Arc<Ctx>> {
        match self.ctxs.with(h, |c| c.clone()) {
            Ok(c) => Some(c),
            Err(_) => {
                self.counters.misuse(Counter::UnknownContext, during);
                None
            }
        }
    }

    /// What a parent handle names, for a child of `ctx`: the collective's function and
    /// sequence number, and for proxy steps and net events the proxy op's channel, peer and
    /// direction. `None` when it names nothing of ours (counted when it names another
    /// communicator's event).
    fn parent_info(&self, ctx: &Arc<Ctx>, parent: Handle) -> Option<(u8, u64, u8, i32, bool)> {
        if parent.0 == 0 {
            return None;
        }
        let r = self.events.with(parent, |p| {
            if !Arc::ptr_eq(&p.ctx, ctx) {
                return Err(());
            }
            Ok(match &p.body {
                Body::Op(o) => (o.op.func, o.op.seq, 0, o.op.root_or_peer, false),
                Body::Channel {
                    func, seq, channel, ..
                } => (*func, *seq, *channel, -1, false),
                Body::Proxy {
                    func,
                    seq,
                    channel,
                    peer,
                    is_send,
                    ..
                } => (*func, *seq, *channel, *peer, *is_send),
            })
        });
        match r {
            Ok(Ok(info)) => Some(info),
            Ok(Err(())) => {
                self.counters.misuse(Counter::ForeignParent, "startEvent");
                None
            }
            Err(_) => None,
        }
    }

    /// `startEvent`: the handle to give NCCL (0 for an event not followed).
    pub fn start(&self, ctx_h: Handle, d: &Descr) -> Handle {
        let r = self.start_inner(ctx_h, d);
        self.gauges();
        r
    }

    fn start_inner(&self, ctx_h: Handle, d: &Descr) -> Handle {
        let Some(ctx) = self.context(ctx_h, "startEvent") else {
            return Handle(0);
        };
        let body = match d.kind {
            Kind::Coll(op) | Kind::P2p(op) => {
                if ctx.pending.load(Ordering::Relaxed) >= MAX_PENDING {
                    self.reclaim_pending(&ctx);
                }
                ctx.pending.fetch_add(1, Ordering::Relaxed);
                Body::Op(Pending::new(op, matches!(d.kind, Kind::P2p(_))))
            }
            Kind::KernelCh { channel, start } => {
                let joined = self.events.with(d.parent, |p| {
                    if !Arc::ptr_eq(&p.ctx, &ctx) {
                        return Err(Counter::ForeignParent);
                    }
                    match &mut p.body {
                        Body::Op(o) => {
                            o.channel_started(start);
                            Ok((o.op.func, o.op.seq))
                        }
                        _ => Err(Counter::Orphans),
                    }
                });
                match joined {
                    Ok(Ok((func, seq))) => Body::Channel {
                        parent: d.parent,
                        channel,
                        start,
                        stop: 0,
                        func,
                        seq,
                    },
                    Ok(Err(Counter::ForeignParent)) => {
                        self.counters.misuse(Counter::ForeignParent, "startEvent");
                        return Handle(0);
                    }
                    Ok(Err(c)) => {
                        self.counters.add(c, 1);
                        return Handle(0);
                    }
                    Err(_) => {
                        self.counters.add(Counter::Orphans, 1);
                        return Handle(0);
                    }
                }
            }
            Kind::ProxyOp {
                channel,
                peer,
                nsteps,
                chunk_size,
                is_send,
            } => {
                let mut b = self.proxy_child(&ctx, d.parent, programs::PROF_PROXY_OP, -1);
                if let Body::Proxy {
                    channel: c,
                    peer: p,
                    is_send: s,
                    bytes,
                    ..
                } = &mut b
                {
                    // A proxy op's own channel, peer and direction (its parent is the
                    // collective, which has none).
                    (*c, *p, *s) = (channel, peer, is_send);
                    *bytes = (nsteps.max(0) as u64).saturating_mul(chunk_size.max(0) as u64);
                }
                b
            }
            Kind::ProxyStep { step } => {
                self.proxy_child(&ctx, d.parent, programs::PROF_PROXY_STEP, step)
            }
            Kind::NetPlugin { .. } => self.proxy_child(&ctx, d.parent, programs::PROF_NET, -1),
            Kind::Other(_) => {
                self.counters.add(Counter::EventsIgnored, 1);
                return Handle(0);
            }
        };
        let is_op = matches!(body, Body::Op(_));
        let channel_of = match &body {
            Body::Channel { parent, .. } => Some(*parent),
            _ => None,
        };
        match self.events.insert(Ev {
            ctx: ctx.clone(),
            started: Instant::now(),
            body,
        }) {
            Ok(h) => {
                if !ctx.alive.load(Ordering::SeqCst) {
                    // Finalized while we inserted: the finalize may have swept before us.
                    if self.events.remove(h, Freed::Finalized).is_ok() && is_op {
                        ctx.pending.fetch_sub(1, Ordering::Relaxed);
                    }
                    self.counters.misuse(Counter::UnknownContext, "startEvent");
                    return Handle(0);
                }
                self.counters.add(Counter::EventsFollowed, 1);
                if self.sampling().is_some() {
                    if is_op {
                        ctx.order
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push_back(h);
                        self.sample_next();
                    } else if let Some(parent) = channel_of {
                        self.retire_unsampled(&ctx, parent);
                    }
                }
                h
            }
            Err(ev) => {
                if is_op {
                    ctx.pending.fetch_sub(1, Ordering::Relaxed);
                }
                // A channel already counted into its collective: take it back out, or the
                // collective would wait for it forever.
                if let Body::Channel { parent, .. } = ev.body {
                    let _ = self.events.with(parent, |p| {
                        if let Body::Op(o) = &mut p.body {
                            o.started = o.started.saturating_sub(1);
                        }
                    });
                }
                self.counters.misuse(Counter::TableFull, "startEvent");
                Handle(0)
            }
        }
    }

    fn proxy_child(&self, ctx: &Arc<Ctx>, parent: Handle, kind: u32, step: i32) -> Body {
        let (func, seq, channel, peer, is_send) =
            self.parent_info(ctx, parent)
                .unwrap_or((crate::event::FUNC_OTHER, 0, 0, -1, false));
        Body::Proxy {
            kind,
            func,
            seq,
            channel,
            peer,
            is_send,
            step,
            bytes: 0,
            state: -1,
        }
    }

    /// `recordEventState`.
    pub fn record(&self, h: Handle, u: StateUpdate) {
        let r = self.events.with(h, |ev| match &mut ev.body {
            Body::Channel { stop, .. } if u.state == state::KERNEL_CH_STOP => *stop = u.arg,
            Body::Proxy {
                state: s,
                bytes,
                kind,
                ..
            } => {
                *s = u.state;
                if *kind == programs::PROF_PROXY_STEP && u.arg != 0 {
                    *bytes = u.arg;
                }
            }
            _ => {}
        });
        if let Err(m) = r {
            self.counters.misuse(misuse_of(m), "recordEventState");
        }
    }

    /// `stopEvent`.
    pub fn stop(&self, h: Handle) {
        self.stop_inner(h);
        self.gauges();
    }

    fn stop_inner(&self, h: Handle) {
        // A collective stays until its channels are done; everything else ends here.
        let channels = self.channels_followed();
        let r = self
            .events
            .update_or_remove(h, Freed::Stopped, |ev| match &mut ev.body {
                Body::Op(o) => {
                    if o.host_stopped {
                        return (false, Err(Counter::StaleStopped));
                    }
                    o.host_stopped = true;
                    (o.done(channels), Ok(()))
                }
                _ => (true, Ok(())),
            });
        let ev = match r {
            Ok((_, Err(c))) => return self.counters.misuse(c, "stopEvent"),
            Ok((None, Ok(()))) => return,
            Ok((Some(ev), Ok(()))) => ev,
            Err(m) => return self.counters.misuse(misuse_of(m), "stopEvent"),
        };
        match ev.body {
            Body::Op(p) => self.complete(&ev.ctx, &p),
            Body::Channel {
                parent,
                channel,
                start,
                stop,
                func,
                seq,
            } => {
                let mut pc = self.base(&ev.ctx, programs::PROF_KERNEL_CH);
                pc.coll = func.into();
                pc.seq = seq;
                pc.channel = channel.into();
                pc.start_ns = start;
                pc.timed = u32::from(stop > start && start != 0);
                pc.duration_ns = if pc.timed == 1 { stop - start } else { 0 };
                self.run(&mut pc);
                let done =
                    self.events
                        .update_or_remove(parent, Freed::Stopped, |p| match &mut p.body {
                            Body::Op(o) => {
                                o.channel_stopped(stop);
                                (o.done(channels), ())
                            }
                            _ => (false, ()),
                        });
                match done {
                    Ok((Some(p), ())) => {
                        if let Body::Op(o) = p.body {
                            self.complete(&p.ctx, &o);
                        }
                    }
                    Ok((None, ())) => {}
                    Err(_) => self.counters.add(Counter::Orphans, 1),
                }
            }
            Body::Proxy {
                kind,
                func,
                seq,
                channel,
                peer,
                is_send,
                step,
                bytes,
                state,
            } => {
                let mut pc = self.base(&ev.ctx, kind);
                pc.coll = func.into();
                pc.seq = if kind == programs::PROF_PROXY_STEP {
                    step.max(0) as u64
                } else {
                    seq
                };
                pc.channel = channel.into();
                pc.peer = peer;
                pc.is_send = is_send.into();
                pc.bytes = bytes;
                pc.state = state;
                pc.start_ns = ev.started.duration_since(self.epoch).as_nanos() as u64;
                pc.duration_ns = ev.started.elapsed().as_nanos() as u64;
                pc.timed = 1;
                self.run(&mut pc);
            }
        }
    }

    fn base(&self, ctx: &Ctx, kind: u32) -> ProfilerCtx {
        ProfilerCtx {
            comm_id: ctx.comm_id,
            event: kind,
            rank: ctx.rank.max(0) as u32,
            nranks: ctx.nranks,
            state: -1,
            peer: -1,
            algo: -1,
            proto: -1,
            coll: crate::event::FUNC_OTHER.into(),
            ..ProfilerCtx::default()
        }
    }

    fn run(&self, pc: &mut ProfilerCtx) {
        if self.programs.run(pc) {
            self.counters.add(Counter::PolicyRuns, 1);
        }
    }

    /// A collective or p2p operation retired: its figures and its program.
    fn complete(&self, ctx: &Ctx, p: &Pending) {
        ctx.pending.fetch_sub(1, Ordering::Relaxed);
        let op: &Op = &p.op;
        let duration = p.duration_ns();
        let bytes = collective::op_bytes(op, ctx.nranks);
        let sample = Sample {
            bucket: stats::with_tag(
                stats::bucket(op.func, collective::size_bucket(bytes), op.algo, op.proto),
                stats::tag_slot(op.user_tag),
            ),
            user_tag: op.user_tag,
            duration_ns: duration,
            bytes,
            bus_bytes: collective::bus_bytes(op, ctx.nranks),
        };
        if duration.is_some() {
            ctx.timed.fetch_add(1, Ordering::Relaxed);
            self.counters.add(Counter::OpsTimed, 1);
        } else {
            ctx.untimed.fetch_add(1, Ordering::Relaxed);
            self.counters.add(Counter::OpsUntimed, 1);
        }
        if !ctx.stats.add(&sample) && ctx.stats.published() {
            self.counters
                .misuse(Counter::StatsDropped, "a collective's figures");
        }
        let mut pc = self.base(
            ctx,
            if p.p2p {
                programs::PROF_P2P
            } else {
                programs::PROF_COLL
            },
        );
        pc.coll = op.func.into();
        pc.seq = op.seq;
        pc.bytes = bytes;
        pc.algo = op.algo.into();
        pc.proto = op.proto.into();
        pc.nchannels = op.nchannels.into();
        pc.peer = op.root_or_peer;
        pc.start_ns = p.first;
        pc.duration_ns = duration.unwrap_or(0);
        pc.timed = duration.is_some().into();
        pc.user_tag = op.user_tag;
        pc.symmetric = op.sym.into();
        self.run(&mut pc);
    }

    fn reclaim_pending(&self, ctx: &Arc<Ctx>) {
        let gone = self.events.drain_where(Freed::Reclaimed, |ev| {
            Arc::ptr_eq(&ev.ctx, ctx) && matches!(&ev.body, Body::Op(o) if o.host_stopped)
        });
        if !gone.is_empty() {
            ctx.pending.fetch_sub(gone.len(), Ordering::Relaxed);
            self.counters
                .add(Counter::ReclaimedPending, gone.len() as u64);
            crate::plog!(
                WARN,
                PROFILE,
                "comm {:#018x} rank {}: {} operations waited for GPU times that never came; reclaimed",
                ctx.comm_id,
                ctx.rank,
                gone.len()
            );
        }
    }

    /// `finalize`: false when the handle names no open context.
    pub fn finalize(&self, ctx_h: Handle) -> bool {
        let r = self.finalize_inner(ctx_h);
        self.gauges();
        r
    }

    fn finalize_inner(&self, ctx_h: Handle) -> bool {
        let ctx = match self.ctxs.remove(ctx_h, Freed::Finalized) {
            Ok(c) => c,
            Err(m) => {
                self.counters.misuse(
                    if matches!(m, Miss::Null | Miss::Unknown) {
                        Counter::UnknownContext
                    } else {
                        misuse_of(m)
                    },
                    "finalize",
                );
                return false;
            }
        };
        ctx.alive.store(false, Ordering::SeqCst);
        let gone = self
            .events
            .drain_where(Freed::Finalized, |ev| Arc::ptr_eq(&ev.ctx, &ctx));
        // With sampling, an operation the host stopped and that never started a channel was
        // run without channel events: untimed, not lost.
        let mut pending = 0;
        for e in &gone {
            match &e.body {
                Body::Op(o) if self.sampling().is_some() && o.host_stopped && o.started == 0 => {
                    ctx.pending.fetch_add(1, Ordering::Relaxed);
                    self.complete(&ctx, o);
                }
                Body::Op(_) => pending += 1,
                _ => {}
            }
        }
        let others = gone
            .iter()
            .filter(|e| !matches!(e.body, Body::Op(_)))
            .count();
        self.counters.add(Counter::ReclaimedPending, pending as u64);
        self.counters.add(Counter::OpenAtFinalize, others as u64);
        ctx.pending.store(0, Ordering::Relaxed);
        ctx.order.lock().unwrap_or_else(|p| p.into_inner()).clear();
        ctx.stats.finalize();
        self.counters.add(Counter::ContextsFinalized, 1);
        crate::plog!(
            INFO,
            PROFILE,
            "comm {:#018x} rank {}/{}{}: {} operations timed, {} untimed, {} still waiting and {} other events open at finalize",
            ctx.comm_id,
            ctx.rank,
            ctx.nranks,
            if ctx.name.is_empty() {
                String::new()
            } else {
                format!(" ({})", ctx.name)
            },
            ctx.timed.load(Ordering::Relaxed),
            ctx.untimed.load(Ordering::Relaxed),
            pending,
            others
        );
        true
    }
}

impl Ctx {
    pub fn timed(&self) -> u64 {
        self.timed.load(Ordering::Relaxed)
    }

    pub fn untimed(&self) -> u64 {
        self.untimed.load(Ordering::Relaxed)
    }
}

/// The process's profiler, made on first use: the mask from the settings and the programs.
pub fn global() -> &'static Tracker {
    static T: LazyLock<Tracker> = LazyLock::new(|| {
        let programs = programs::programs();
        let (mask, problem) = crate::mask::choose(&|k| std::env::var(k).ok(), programs.mask());
        if let Some(p) = problem {
            crate::plog!(WARN, PROFILE, "{p}");
        }
        crate::plog!(
            INFO,
            PROFILE,
            "profiler: event mask 0x{mask:x} ({})",
            (0..15)
                .map(|b| 1u64 << b)
                .filter(|b| mask & b != 0)
                .map(crate::event::bit_name)
                .collect::<Vec<_>>()
                .join(",")
        );
        Tracker::new(mask, programs, Some(Registry::global()))
    });
    &T
}
