//! The tracker as NCCL drives it, and as a careless or hostile caller would.

use ncclbpf_profiler::collective::size_bucket;
use ncclbpf_profiler::counters::Counter;
use ncclbpf_profiler::event::{Descr, Kind, Op, StateUpdate};
use ncclbpf_profiler::handles::Handle;
use ncclbpf_profiler::programs::Programs;
use ncclbpf_profiler::stats;
use ncclbpf_profiler::tracker::Tracker;
use ncclnet_headers::profiler::{event, state};
use proptest::prelude::*;
use shared_maps::Registry;
use std::collections::HashSet;

fn tracker(mask: u64) -> Tracker {
    let programs: &'static Programs = Box::leak(Box::default());
    let dir = std::env::temp_dir().join(format!(
        "ncclbpf-tracker-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let reg: &'static Registry = Box::leak(Box::new(Registry::new(dir)));
    let mut t = Tracker::new(mask, programs, Some(reg));
    // Counters of its own: tests run in parallel.
    t.counters = ncclbpf_profiler::counters::Counters::private();
    t
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn all_reduce(seq: u64, count: u64, nch: u8) -> Descr {
    Descr {
        kind: Kind::Coll(Op {
            seq,
            func: 4,
            count,
            type_size: 4,
            algo: 1,
            proto: 2,
            nchannels: nch,
            root_or_peer: 0,
            ..Op::default()
        }),
        parent: Handle(0),
        rank: 0,
    }
}

fn channel(parent: Handle, ch: u8, start: u64) -> Descr {
    Descr {
        kind: Kind::KernelCh { channel: ch, start },
        parent,
        rank: 0,
    }
}

const MASK: u64 = event::COLL | event::P2P | event::KERNEL_CH;

#[test]
fn a_collective_is_timed_from_its_first_channel_start_to_its_last_channel_end() {
    let t = tracker(MASK);
    let ctx = t.init(0x1234, "test", 1, 4, 1).unwrap();
    let c = t.start(ctx, &all_reduce(7, 1 << 20, 2));
    assert_ne!(c.0, 0);
    t.stop(c); // host stop: before the GPU ran it
    let k0 = t.start(ctx, &channel(c, 0, 10_000));
    let k1 = t.start(ctx, &channel(c, 1, 10_500));
    assert!(k0.0 != 0 && k1.0 != 0);
    t.record(
        k1,
        StateUpdate {
            state: state::KERNEL_CH_STOP,
            arg: 60_000,
        },
    );
    t.stop(k1);
    assert_eq!(
        t.counters.get(Counter::OpsTimed),
        0,
        "one channel still running"
    );
    t.record(
        k0,
        StateUpdate {
            state: state::KERNEL_CH_STOP,
            arg: 58_000,
        },
    );
    t.stop(k0);
    assert_eq!(t.counters.get(Counter::OpsTimed), 1);
    assert_eq!(t.open_events(), 0);
    // 4 MiB all_reduce on 4 ranks, RING/SIMPLE: 50 µs from 10.0 to 60.0, bus bytes 6 MiB.
    let b = stats::bucket(4, size_bucket(4 << 20), 1, 2);
    let w = t.entry_words(ctx, b).expect("an entry");
    assert_eq!(&w[1..7], &[1, 50_000, 4 << 20, 6 << 20, 50_000, 50_000]);
    assert!(t.finalize(ctx));
    assert_eq!(t.counters.get(Counter::ReclaimedPending), 0);
}

#[test]
fn the_figures_land_in_the_shared_map() {
    let t = tracker(MASK);
    let ctx = t.init(0xfeed, "", 1, 2, 0).unwrap();
    for (seq, dur) in [(1u64, 20_000u64), (2, 40_000)] {
        let c = t.start(ctx, &all_reduce(seq, 1 << 18, 1));
        let k = t.start(ctx, &channel(c, 0, 1_000_000 * seq));
        t.stop(c);
        t.record(
            k,
            StateUpdate {
                state: state::KERNEL_CH_STOP,
                arg: 1_000_000 * seq + dur,
            },
        );
        t.stop(k);
    }
    let b = stats::bucket(4, size_bucket(1 << 20), 1, 2);
    let reg_words = t.entry_words(ctx, b).expect("an entry for the bucket");
    assert_eq!(reg_words[1], 2, "two timed");
    assert_eq!(reg_words[2], 60_000, "time summed");
    assert_eq!(reg_words[3], 2 << 20, "bytes summed");
    assert_eq!(reg_words[4], 2 << 20, "bus bytes: 2·(2-1)/2 = 1 per byte");
    assert_eq!((reg_words[5], reg_words[6]), (20_000, 40_000));
    t.finalize(ctx);
}

#[test]
fn without_kernel_channels_a_collective_counts_at_its_host_stop_untimed() {
    let t = tracker(event::COLL);
    let ctx = t.init(1, "", 1, 2, 0).unwrap();
    let c = t.start(ctx, &all_reduce(1, 8, 1));
    t.stop(c);
    assert_eq!(t.counters.get(Counter::OpsUntimed), 1);
    assert_eq!(t.open_events(), 0);
    t.finalize(ctx);
}

#[test]
fn every_misuse_is_ignored_and_counted() {
    let t = tracker(MASK);
    let a = t.init(1, "a", 1, 2, 0).unwrap();
    let b = t.init(2, "b", 1, 2, 0).unwrap();
    let c = t.start(a, &all_reduce(1, 8, 1));
    let k = t.start(a, &channel(c, 0, 5));
    t.stop(k);
    t.stop(k);
    assert_eq!(t.counters.get(Counter::StaleStopped), 1, "stopped twice");
    t.record(
        k,
        StateUpdate {
            state: state::KERNEL_CH_STOP,
            arg: 9,
        },
    );
    assert_eq!(
        t.counters.get(Counter::StaleStopped),
        2,
        "a state after the stop"
    );
    t.stop(Handle(0xdead_beef));
    t.stop(Handle(u64::MAX));
    assert_eq!(t.counters.get(Counter::UnknownHandle), 2);
    t.stop(Handle(0));
    assert_eq!(t.counters.get(Counter::NullHandle), 1);
    // A channel of b whose parent is a's collective.
    assert_eq!(t.start(b, &channel(c, 0, 5)).0, 0);
    assert_eq!(t.counters.get(Counter::ForeignParent), 1);
    // A context handle that is not one, or an event handle used as one.
    assert_eq!(t.start(Handle(42), &all_reduce(1, 8, 1)).0, 0);
    assert_eq!(t.start(c, &all_reduce(1, 8, 1)).0, 0);
    assert_eq!(t.counters.get(Counter::UnknownContext), 2);
    // Finalize with the collective still waiting: reclaimed; its handle is stale after.
    assert!(t.finalize(a));
    assert_eq!(t.counters.get(Counter::ReclaimedPending), 1);
    t.stop(c);
    assert_eq!(t.counters.get(Counter::StaleFinalized), 1);
    assert_eq!(t.start(a, &all_reduce(2, 8, 1)).0, 0, "a finalized context");
    assert!(!t.finalize(a), "finalized twice");
    assert_eq!(t.counters.get(Counter::StaleFinalized), 2);
    assert!(t.finalize(b));
    assert_eq!(t.open_events(), 0);
    assert_eq!(t.open_contexts(), 0);
    // Events of types not followed get no handle.
    let d = t.init(3, "", 1, 1, 0).unwrap();
    let g = Descr {
        kind: Kind::Other(event::GROUP),
        parent: Handle(0),
        rank: 0,
    };
    assert_eq!(t.start(d, &g).0, 0);
    assert_eq!(t.counters.get(Counter::EventsIgnored), 1);
    t.finalize(d);
}

#[derive(Clone, Debug)]
enum Step {
    Init,
    StartColl(usize, u8),
    StartChannel(usize, usize, u64),
    RecordStop(usize, u64),
    Stop(usize),
    StopForged(u64),
    Finalize(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => Just(Step::Init),
        4 => (any::<usize>(), 1u8..4).prop_map(|(c, n)| Step::StartColl(c, n)),
        4 => (any::<usize>(), any::<usize>(), 1u64..1_000_000).prop_map(|(c, p, s)| Step::StartChannel(c, p, s)),
        3 => (any::<usize>(), 1u64..2_000_000).prop_map(|(h, s)| Step::RecordStop(h, s)),
        5 => any::<usize>().prop_map(Step::Stop),
        1 => any::<u64>().prop_map(Step::StopForged),
        1 => any::<usize>().prop_map(Step::Finalize),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every call either acts on an open event or context, or is counted exactly once as a
    /// misuse; and once every context is finalized nothing is left open.
    #[test]
    fn any_sequence_is_accounted_for(steps in proptest::collection::vec(step(), 1..200)) {
        let t = tracker(MASK);
        let mut ctxs: Vec<Handle> = vec![];
        let mut live_ctx: HashSet<u64> = HashSet::new();
        let mut handles: Vec<Handle> = vec![];
        let mut colls: HashSet<u64> = HashSet::new();
        let mut host_stopped: HashSet<u64> = HashSet::new();
        let misuses = |t: &Tracker| {
            [Counter::NullHandle, Counter::UnknownHandle, Counter::StaleStopped, Counter::StaleFinalized,
             Counter::StaleReclaimed, Counter::UnknownContext]
                .iter().map(|c| t.counters.get(*c)).sum::<u64>()
        };
        for s in steps {
            let before = misuses(&t);
            match s {
                Step::Init => {
                    let h = t.init(ctxs.len() as u64, "", 1, 2, 0).unwrap();
                    live_ctx.insert(h.0);
                    ctxs.push(h);
                }
                Step::StartColl(c, n) if !ctxs.is_empty() => {
                    let ctx = ctxs[c % ctxs.len()];
                    let h = t.start(ctx, &all_reduce(1, 64, n));
                    prop_assert_eq!(h.0 != 0, live_ctx.contains(&ctx.0));
                    if h.0 != 0 { handles.push(h); colls.insert(h.0); }
                    prop_assert_eq!(misuses(&t) - before, u64::from(!live_ctx.contains(&ctx.0)));
                }
                Step::StartChannel(c, p, start) if !ctxs.is_empty() && !handles.is_empty() => {
                    let ctx = ctxs[c % ctxs.len()];
                    let parent = handles[p % handles.len()];
                    let h = t.start(ctx, &channel(parent, 0, start));
                    if h.0 != 0 {
                        prop_assert!(t.is_open(parent) && colls.contains(&parent.0));
                        handles.push(h);
                    }
                    prop_assert_eq!(misuses(&t) - before, u64::from(!live_ctx.contains(&ctx.0)));
                }
                Step::RecordStop(i, v) if !handles.is_empty() => {
                    let h = handles[i % handles.len()];
                    let was_open = t.is_open(h);
                    t.record(h, StateUpdate { state: state::KERNEL_CH_STOP, arg: v });
                    prop_assert_eq!(misuses(&t) - before, u64::from(!was_open));
                }
                Step::Stop(i) if !handles.is_empty() => {
                    let h = handles[i % handles.len()];
                    let was_open = t.is_open(h);
                    let again = host_stopped.contains(&h.0);
                    t.stop(h);
                    prop_assert_eq!(misuses(&t) - before, u64::from(!was_open || again));
                    if was_open && colls.contains(&h.0) { host_stopped.insert(h.0); }
                    prop_assert!(!t.is_open(h) || colls.contains(&h.0), "only a collective outlives its stop");
                }
                Step::StopForged(v)
                    if !ctxs.iter().any(|c| c.0 == v) && !handles.iter().any(|h| h.0 == v) =>
                {
                    t.stop(Handle(v));
                    prop_assert_eq!(misuses(&t) - before, 1);
                }
                Step::Finalize(c) if !ctxs.is_empty() => {
                    let ctx = ctxs[c % ctxs.len()];
                    let was = live_ctx.remove(&ctx.0);
                    prop_assert_eq!(t.finalize(ctx), was);
                    prop_assert_eq!(misuses(&t) - before, u64::from(!was));
                }
                _ => {}
            }
            prop_assert_eq!(t.open_events(), t.count_open_locked());
        }
        for c in &ctxs { t.finalize(*c); }
        prop_assert_eq!(t.open_events(), 0);
        prop_assert_eq!(t.open_contexts(), 0);
        prop_assert_eq!(t.count_open_locked(), 0);
    }
}

#[test]
fn many_threads_with_finalize_mid_stream_leave_nothing_behind() {
    stress(tracker(MASK | event::PROXY_OP));
}

#[test]
fn many_threads_with_sampling_leave_nothing_behind() {
    let t = tracker(MASK);
    t.set_mask_target(Box::new(|_| {}));
    assert!(t.set_sampling(ncclbpf_profiler::tracker::Sampling { every: 3 }));
    stress(t);
}

fn stress(t: Tracker) {
    let t = std::sync::Arc::new(t);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let threads: Vec<_> = (0..8u64)
        .map(|k| {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ k;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut ctx = t.init(k % 3, "", 1, 4, k as i32).unwrap();
                let mut mine: Vec<Handle> = vec![];
                for _ in 0..20_000 {
                    match next() % 10 {
                        0..=2 => {
                            mine.push(t.start(ctx, &all_reduce(1, 1024, 1 + (next() % 3) as u8)))
                        }
                        3 | 4 if !mine.is_empty() => {
                            let p = mine[(next() as usize) % mine.len()];
                            mine.push(t.start(ctx, &channel(p, 0, next() % 1000 + 1)));
                        }
                        5 | 6 if !mine.is_empty() => t.stop(mine[(next() as usize) % mine.len()]),
                        7 if !mine.is_empty() => t.record(
                            mine[(next() as usize) % mine.len()],
                            StateUpdate {
                                state: state::KERNEL_CH_STOP,
                                arg: next() % 5000,
                            },
                        ),
                        8 => t.stop(Handle(next())),
                        9 if next() % 50 == 0 => {
                            t.finalize(ctx);
                            ctx = t.init(k, "", 1, 4, k as i32).unwrap();
                        }
                        _ => {}
                    }
                    if mine.len() > 256 {
                        mine.drain(..128);
                    }
                }
                t.finalize(ctx);
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert!(
        std::time::Instant::now() < deadline,
        "took over a minute: something waited"
    );
    assert_eq!(t.open_events(), 0);
    assert_eq!(t.count_open_locked(), 0);
    assert_eq!(t.open_contexts(), 0);
    assert!(t.counters.get(Counter::EventsFollowed) > 10_000);
}

/// With sampling, NCCL (played here) takes the mask we last wrote for each collective it
/// enqueues: only those get channel events. Every operation is still counted, timed or not,
/// and none waits forever.
#[test]
fn sampling_times_one_in_n_and_counts_the_rest_untimed() {
    use ncclbpf_profiler::tracker::Sampling;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let t = tracker(MASK);
    let nccl_mask = Arc::new(AtomicU64::new(MASK));
    let m = nccl_mask.clone();
    assert!(t.set_mask_target(Box::new(move |v| m.store(v, Ordering::Relaxed))));
    assert!(t.set_sampling(Sampling { every: 4 }));
    let ctx = t.init(0x5a, "", 1, 2, 0).unwrap();
    let mut with_channels = 0;
    for i in 0..10u64 {
        // NCCL reads the mask when it enqueues the collective, before its Coll event.
        let kernel = nccl_mask.load(Ordering::Relaxed) & event::KERNEL_CH != 0;
        let c = t.start(ctx, &all_reduce(i, 1024, 1));
        t.stop(c);
        if kernel {
            with_channels += 1;
            let k = t.start(ctx, &channel(c, 0, 1000 * (i + 1)));
            t.record(
                k,
                StateUpdate {
                    state: state::KERNEL_CH_STOP,
                    arg: 1000 * (i + 1) + 500,
                },
            );
            t.stop(k);
        }
    }
    // Collectives 0, 4 and 8 are timed (0: the mask init returned).
    assert_eq!(with_channels, 3);
    assert_eq!(t.counters.get(Counter::OpsTimed), 3);
    // 1-3 and 5-7 were retired when 4 and 8 started their channels; 9 waits for finalize.
    assert_eq!(t.counters.get(Counter::OpsUntimed), 6);
    assert!(t.finalize(ctx));
    assert_eq!(t.counters.get(Counter::OpsUntimed), 7);
    assert_eq!(t.counters.get(Counter::ReclaimedPending), 0);
    assert_eq!(t.open_events(), 0);
}

#[test]
fn sampling_needs_channels_and_two_or_more() {
    use ncclbpf_profiler::tracker::Sampling;
    let w = || Box::new(|_: u64| {}) as Box<dyn Fn(u64) + Send + Sync>;
    let t = tracker(event::COLL);
    t.set_mask_target(w());
    assert!(
        !t.set_sampling(Sampling { every: 4 }),
        "no channels to sample"
    );
    let t = tracker(MASK);
    assert!(!t.set_sampling(Sampling { every: 4 }), "no mask target");
    t.set_mask_target(w());
    assert!(!t.set_sampling(Sampling { every: 1 }));
    assert!(t.set_sampling(Sampling { every: 2 }));
    assert!(!t.set_sampling(Sampling { every: 3 }), "once");
}

#[test]
fn proxy_ops_steps_and_net_events_follow_their_parents_and_end_at_their_stop() {
    let t = tracker(MASK | event::PROXY_OP | event::PROXY_STEP | event::NET_PLUGIN);
    let ctx = t.init(0x77, "", 1, 2, 0).unwrap();
    let c = t.start(ctx, &all_reduce(3, 1024, 1));
    let op = t.start(
        ctx,
        &Descr {
            kind: Kind::ProxyOp {
                channel: 1,
                peer: 1,
                nsteps: 4,
                chunk_size: 1 << 16,
                is_send: true,
            },
            parent: c,
            rank: 0,
        },
    );
    let step = t.start(
        ctx,
        &Descr {
            kind: Kind::ProxyStep { step: 0 },
            parent: op,
            rank: 0,
        },
    );
    let net = t.start(
        ctx,
        &Descr {
            kind: Kind::NetPlugin { id: 3 << 16 | 1 },
            parent: step,
            rank: 0,
        },
    );
    assert!(op.0 != 0 && step.0 != 0 && net.0 != 0);
    t.record(
        step,
        StateUpdate {
            state: state::PROXY_STEP_SEND_WAIT,
            arg: 65536,
        },
    );
    for h in [net, step, op] {
        t.stop(h);
        assert!(!t.is_open(h), "a proxy event ends at its stop");
    }
    assert!(t.is_open(c), "the collective still waits for its channel");
    // A proxy op whose parent is another communicator's collective: followed, parent ignored.
    let other = t.init(0x78, "", 1, 2, 0).unwrap();
    let foreign = t.start(
        other,
        &Descr {
            kind: Kind::ProxyOp {
                channel: 0,
                peer: 0,
                nsteps: 1,
                chunk_size: 1,
                is_send: false,
            },
            parent: c,
            rank: 0,
        },
    );
    assert_ne!(foreign.0, 0);
    assert_eq!(t.counters.get(Counter::ForeignParent), 1);
    t.stop(foreign);
    t.finalize(ctx);
    t.finalize(other);
    assert_eq!(t.open_events(), 0);
    assert_eq!(t.counters.get(Counter::EventsFollowed), 5);
}

#[test]
fn pause_writes_zero_and_resume_restores_the_mask_sampling_included() {
    use ncclbpf_profiler::tracker::Sampling;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let t = tracker(MASK);
    assert!(!t.pause(), "nothing to write before init gave a target");
    t.resume();
    let nccl = Arc::new(AtomicU64::new(MASK));
    let m = nccl.clone();
    t.set_mask_target(Box::new(move |v| m.store(v, Ordering::Relaxed)));
    assert!(t.pause());
    assert_eq!(nccl.load(Ordering::Relaxed), 0);
    assert!(t.resume());
    assert_eq!(nccl.load(Ordering::Relaxed), MASK);
    assert!(t.set_sampling(Sampling { every: 2 }));
    let ctx = t.init(1, "", 1, 2, 0).unwrap();
    assert!(t.pause());
    // A collective started while paused (enqueued before the pause) leaves the mask at 0.
    let c = t.start(ctx, &all_reduce(1, 8, 1));
    assert_eq!(nccl.load(Ordering::Relaxed), 0);
    t.stop(c);
    assert!(t.resume());
    // One operation started: the next is the 2nd, a multiple of 2, so it is timed.
    assert_eq!(nccl.load(Ordering::Relaxed), MASK);
    t.finalize(ctx);
    assert_eq!(t.open_events(), 0);
}
