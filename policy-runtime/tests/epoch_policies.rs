//! The closed-loop policies (policies/src/net_autotune.c, slo_enforcer.c) run through epochs
//! the way the agreement runs them: every K decisions an epoch ends and its record (the change
//! of each epoch source's words) is kept; D epochs later the record fills the agreed maps
//! (combined over `nranks` identical ranks with each map's reduction), the `tuner/epoch` program
//! runs on it, and its state is copied into the state map the tuner program reads. Durations
//! come from a cost per decision the test chooses: deterministic, no clock.

mod common;
use common::*;
use policy_object::{MapKind, Reduce, SOURCE_STATE, Scope};
use policy_runtime::{
    LoadOptions, LoadedProgram, NetCtx, ProfilerCtx, Tier, TunerCtx, TunerEpochCtx,
};
use shared_maps::{Map, Registry};
use std::collections::VecDeque;
use std::sync::Arc;

const K: u32 = 64;
const D: u64 = 2;
const NRANKS: u32 = 2;
const MIB: u64 = 1 << 20;

const TREE: i32 = 0;
const RING: i32 = 1;
const LL: i32 = 0;
const LL128: i32 = 1;
const SIMPLE: i32 = 2;

fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bytes(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An array map's entries, concatenated.
fn contents(m: &Map) -> Vec<u8> {
    (0..m.spec().max_entries)
        .flat_map(|k| m.get(&k.to_le_bytes()).unwrap())
        .collect()
}

fn fill(m: &Map, data: &[u8]) {
    let vs = m.spec().value_size as usize;
    for (k, v) in data.chunks(vs).enumerate() {
        let mut v = v.to_vec();
        v.resize(vs, 0);
        m.update(&(k as u32).to_le_bytes(), &v, 0).unwrap();
    }
}

struct Record {
    epoch: u64,
    /// (source, change of its words over the epoch)
    deltas: Vec<(u32, Vec<u64>)>,
    duration: u64,
    /// The net's busy time (0: some rank has none).
    busy: u64,
    bytes: u64,
}

/// ns of GPU time per decision, as the profiler would report it (`None`: not timed).
type GpuCost = Box<dyn Fn(&TunerCtx) -> Option<u64>>;

/// One rank of a communicator whose every rank decides, counts and measures alike.
struct Sim {
    _reg: Registry,
    tuner: LoadedProgram,
    epoch: LoadedProgram,
    net: Option<LoadedProgram>,
    /// The `profiler/coll` program and the GPU time it is told per decision, when set.
    prof: Option<(LoadedProgram, GpuCost)>,
    /// Epoch sources: (number, map, contents at the end of the previous epoch).
    sources: Vec<(u32, Arc<Map>, Vec<u8>)>,
    agreed: Vec<(u32, Reduce, Arc<Map>)>,
    state_map: Arc<Map>,
    state: [u64; 32],
    pending: VecDeque<Record>,
    next_epoch: u64,
    /// Named maps of the object (config maps, for the test to set).
    maps: Vec<Arc<Map>>,
    /// What NCCL's cost table says, as every decision's context shows it: (usable, NCCL's
    /// algorithm, its protocol); (0, -1, -1) is "no table".
    table: (u32, i32, i32),
    /// Whether the ranks' records carry the net's busy time (the cost of each decision; the
    /// wall time adds `host`'s time between collectives).
    net_busy: bool,
    /// The host's time after each decision's collective (in the wall time, not the busy time).
    host: Option<HostCost>,
}

/// ns of host time after a decision's collective.
type HostCost = Box<dyn Fn(&TunerCtx) -> u64>;

impl Sim {
    fn new(obj: &str, tuner: &str, epoch: &str, net: Option<&str>, tier: Tier) -> Sim {
        let (_, o) = object(obj);
        let reg = registry();
        let opts = LoadOptions {
            tier,
            ..LoadOptions::default()
        };
        let load = |n: &str| LoadedProgram::load(&o, Some(n), &reg, &opts).unwrap();
        let (tuner, epoch, net) = (load(tuner), load(epoch), net.map(load));
        // The roles of the maps, as the runtime reads them.
        let (mut sources, mut agreed, mut state_map) = (vec![], vec![], None);
        for (m, d) in epoch.maps().iter().zip(epoch.map_defs()) {
            match (d.scope, d.source) {
                (Scope::Local, Some(n)) => sources.push((n, m.clone(), contents(m))),
                (Scope::Agreed, Some(SOURCE_STATE)) => state_map = Some(m.clone()),
                (Scope::Agreed, Some(n)) => agreed.push((n, d.reduce, m.clone())),
                _ => {}
            }
            if d.source.is_some() {
                assert_eq!(d.kind, MapKind::Array, "{}", d.name);
            }
        }
        let maps = epoch.maps().to_vec();
        Sim {
            _reg: reg,
            tuner,
            epoch,
            net,
            prof: None,
            sources,
            agreed,
            state_map: state_map.expect("a state map"),
            state: [0; 32],
            pending: VecDeque::new(),
            next_epoch: 0,
            maps,
            table: (0, -1, -1),
            net_busy: false,
            host: None,
        }
    }

    /// Runs `program` (a `profiler/coll` program of the object) after every decision, with the
    /// GPU time `gpu` says.
    fn with_profiler(mut self, obj: &str, program: &str, gpu: GpuCost) -> Sim {
        let (_, o) = object(obj);
        let p =
            LoadedProgram::load(&o, Some(program), &self._reg, &LoadOptions::default()).unwrap();
        self.prof = Some((p, gpu));
        self
    }

    fn map(&self, name: &str) -> Arc<Map> {
        self.maps
            .iter()
            .find(|m| m.spec().name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no map {name}"))
    }

    /// Epoch `e - D` is applied at collective `e * K`, before it is decided.
    fn apply(&mut self) {
        let Some(r) = self
            .pending
            .front()
            .filter(|r| r.epoch + D == self.next_epoch)
        else {
            return;
        };
        for (n, op, m) in &self.agreed {
            let (_, d) = r.deltas.iter().find(|(s, _)| s == n).unwrap();
            let combined: Vec<u64> = d
                .iter()
                .map(|&w| (1..NRANKS).fold(w, |acc, _| op.combine(acc, w)))
                .collect();
            fill(m, &bytes(&combined));
        }
        let mut ctx = TunerEpochCtx {
            comm_id: 7,
            epoch: r.epoch,
            nranks: NRANKS,
            colls: K,
            duration_max_ns: r.duration,
            duration_min_ns: r.duration,
            bytes: r.bytes,
            state: self.state,
            net_busy_max_ns: r.busy,
            net_busy_min_ns: r.busy,
        };
        self.epoch.run(&mut ctx);
        self.state = ctx.state;
        fill(&self.state_map, &ctx.state_bytes());
        self.pending.pop_front();
    }

    /// Runs one epoch: K decisions of `size(i)` bytes, each taking `cost(decision)` ns.
    fn run_epoch(
        &mut self,
        size: &dyn Fn(u32) -> u64,
        cost: &dyn Fn(&TunerCtx) -> u64,
    ) -> Vec<TunerCtx> {
        self.apply();
        let (mut duration, mut busy, mut total) = (0, 0, 0);
        let mut decided = vec![];
        for i in 0..K {
            let mut c = TunerCtx {
                msg_size: size(i),
                comm_id: 7,
                nranks: NRANKS,
                nnodes: NRANKS,
                num_pipe_ops: 1,
                algo: -1,
                proto: -1,
                usable: self.table.0,
                nccl_algo: self.table.1,
                nccl_proto: self.table.2,
                ..Default::default()
            };
            self.tuner.run(&mut c);
            let ns = cost(&c);
            duration += ns + self.host.as_ref().map_or(0, |h| h(&c));
            busy += ns;
            total += c.msg_size;
            if let Some(net) = &self.net {
                for op in [5, 6] {
                    net.run(&mut NetCtx {
                        bytes: c.msg_size,
                        op,
                        latency_ns: ns,
                        ..Default::default()
                    });
                }
                // A failed completion counts nothing.
                net.run(&mut NetCtx {
                    bytes: 1 << 40,
                    op: 5,
                    status: 3,
                    ..Default::default()
                });
            }
            if let Some((p, gpu)) = &self.prof
                && let Some(ns) = gpu(&c)
            {
                p.run(&mut ProfilerCtx {
                    event: 1,
                    coll: 4,
                    bytes: c.msg_size,
                    duration_ns: ns,
                    timed: 1,
                    ..Default::default()
                });
            }
            decided.push(c);
        }
        let deltas = self
            .sources
            .iter_mut()
            .map(|(n, m, prev)| {
                let now = contents(m);
                let d = words(&now)
                    .iter()
                    .zip(words(prev))
                    .map(|(a, b)| a.wrapping_sub(b))
                    .collect();
                *prev = now;
                (*n, d)
            })
            .collect();
        self.pending.push_back(Record {
            epoch: self.next_epoch,
            deltas,
            duration,
            busy: if self.net_busy { busy } else { 0 },
            bytes: total,
        });
        self.next_epoch += 1;
        decided
    }

    /// Class `c`'s four state words.
    fn class(&self, c: usize) -> [u64; 4] {
        self.state[4 * c..4 * c + 4].try_into().unwrap()
    }
}

fn decision(c: &TunerCtx) -> (i32, i32, u32) {
    (c.algo, c.proto, c.nchannels)
}

/// All decisions of an epoch, when they are the same.
fn one(d: &[TunerCtx]) -> (i32, i32, u32) {
    let first = decision(&d[0]);
    assert!(
        d.iter().all(|c| decision(c) == first),
        "one decision per epoch"
    );
    first
}

// ---------------------------------------------------------------- net_autotune

const AUTOTUNE: &str = "src/net_autotune.o";
const CLASS_1M: usize = 5; // [1 MiB, 4 MiB)
const EXPLORING: u64 = 1;
const SETTLED: u64 = 2;
const DUEL: u64 = 4;
/// Comparisons (two adjacent epochs of the two sides) won ahead that end a duel (so the
/// comparisons of a duel with one side winning every one).
const DUEL_MARGIN: usize = 6;
/// Comparisons a duel has at most.
const DUEL_MAX: usize = 31;
/// Epochs of a duel's comparisons at most (each epoch after the first adds one).
const DUEL_SPAN: usize = DUEL_MAX + 1;
/// Epochs a duel lasts at most, counted from its first, comparisons or not.
const DUEL_EPOCHS: usize = 64;
/// Epochs within which a new class settles: every candidate explored, each of the 7 after slot 0
/// in a duel (DUEL_SPAN + D epochs at most).
const SETTLE_MAX: usize = 8 * (3 + D as usize) + 1 + 7 * (DUEL_SPAN + D as usize);

fn autotune(tier: Tier) -> Sim {
    Sim::new(
        AUTOTUNE,
        "net_autotune",
        "net_autotune_epoch",
        Some("net_autotune_complete"),
        tier,
    )
}

/// ns per collective of each built-in candidate; Ring/LL128 (candidate 3) is the fastest.
fn autotune_cost(c: &TunerCtx) -> u64 {
    match decision(c) {
        (-1, -1, 0) => 100_000,
        (RING, SIMPLE, 0) => 90_000,
        (RING, LL, 0) => 120_000,
        (RING, LL128, 0) => 50_000,
        (TREE, SIMPLE, 0) => 80_000,
        (TREE, LL, 0) => 130_000,
        (TREE, LL128, 0) => 70_000,
        (RING, SIMPLE, 2) => 95_000,
        d => panic!("not a candidate: {d:?}"),
    }
}

fn phase(s: &Sim) -> u64 {
    s.class(CLASS_1M)[1] & 0xff
}

/// Sets net_autotune's autotune_timing (0: wall time, 1: GPU time where timed).
fn set_timing(s: &Sim, v: u64) {
    s.map("autotune_timing")
        .update(&0u32.to_le_bytes(), &v.to_le_bytes(), 0)
        .unwrap();
}

/// A settled class's reference time (the low half of its time word).
fn reference(time: u64) -> u64 {
    time & 0xffff_ffff
}

/// A settled class's recent time (the high half of its time word).
fn recent(time: u64) -> u64 {
    time >> 32
}

fn rounds(s: &Sim) -> u64 {
    (s.class(CLASS_1M)[1] >> 40) & 0xff
}

/// Runs epochs of 1 MiB collectives at `factor` times the costs until `done`; returns the
/// epochs it took and every decision seen.
fn autotune_until(
    s: &mut Sim,
    factor: u64,
    max: usize,
    done: &dyn Fn(&Sim) -> bool,
) -> (usize, Vec<(i32, i32, u32)>) {
    run_until(s, &|c| autotune_cost(c) * factor, max, done)
}

/// Runs epochs of 1 MiB collectives at `cost` until `done` (at most `max`).
fn run_until(
    s: &mut Sim,
    cost: &dyn Fn(&TunerCtx) -> u64,
    max: usize,
    done: &dyn Fn(&Sim) -> bool,
) -> (usize, Vec<(i32, i32, u32)>) {
    let mut seen = vec![];
    for n in 1..=max {
        let d = s.run_epoch(&|_| MIB, cost);
        seen.push(one(&d));
        if done(s) {
            return (n, seen);
        }
    }
    panic!(
        "not done after {max} epochs: class state {:?}",
        s.class(CLASS_1M)
    );
}

#[test]
fn autotune_explores_every_candidate_and_keeps_the_fastest() {
    let mut states = vec![];
    for tier in [Tier::Jit, Tier::Interpreter] {
        let mut s = autotune(tier);
        let settled = |s: &Sim| phase(s) == SETTLED;
        let (n, seen) = autotune_until(&mut s, 1, SETTLE_MAX, &settled);
        // Each candidate ran for the four epochs it was learnt from (one discarded, three
        // measured) and D - 1 more while the last one's figures were agreed; Ring/Simple
        // (90 us) came within 1/4 of NCCL's choice (100 us), the best then: one duel.
        assert!(
            n <= 8 * (3 + D as usize) + 1 + DUEL_SPAN + D as usize,
            "settled after {n} epochs"
        );
        let alternations = seen
            .windows(3)
            .filter(|w| w[0] == w[2] && w[0] != w[1])
            .count();
        assert!(alternations >= DUEL_MARGIN - 1, "one duel: {seen:?}");
        for c in [
            (-1, -1, 0),
            (RING, SIMPLE, 0),
            (RING, LL, 0),
            (RING, LL128, 0),
            (TREE, SIMPLE, 0),
            (TREE, LL, 0),
            (TREE, LL128, 0),
            (RING, SIMPLE, 2),
        ] {
            assert!(seen.contains(&c), "{c:?} never tried: {seen:?}");
        }
        let [apply, _, time, net_bytes] = s.class(CLASS_1M);
        assert_eq!(apply, 3, "Ring/LL128 is the fastest");
        assert_eq!(
            (reference(time), recent(time)),
            (50_000, 50_000),
            "its time per collective is the reference, and the recent time starts there"
        );
        // Sends and receives of every rank, summed (failed completions count nothing).
        assert_eq!(net_bytes, u64::from(NRANKS) * 2 * u64::from(K) * MIB);
        assert_eq!(rounds(&s), 1);
        // The epoch program ran at this epoch's first collective: its decisions already
        // applied candidate 3.
        assert_eq!(seen.last(), Some(&(RING, LL128, 0)));
        let d = s.run_epoch(&|_| MIB, &autotune_cost);
        assert_eq!(one(&d), (RING, LL128, 0));
        // Other classes were never dominant: no opinion there.
        let small = s.run_epoch(&|_| 1024, &autotune_cost);
        assert_eq!(one(&small), (-1, -1, 0));
        states.push(s.state);
    }
    assert_eq!(states[0], states[1], "JIT and interpreter agree");
}

/// By default the net's busy time ranks the candidates where every rank's record has one: the
/// host's time between collectives (here it runs the other way round, so that the wall time
/// ranks Tree/LL first) is not counted, and Ring/LL128, the fastest on the wire, is kept, its
/// busy time the reference. Without busy times (some rank on net v7–v10), or with
/// autotune_timing 2, the wall time decides.
#[test]
fn autotune_times_epochs_by_the_nets_busy_time_where_every_rank_has_one() {
    for (net_busy, timing, kept, reference) in [
        (true, 0, 3, 50_000),
        (false, 0, 5, 170_000),
        (true, 2, 5, 170_000),
    ] {
        let mut s = autotune(Tier::Jit);
        s.net_busy = net_busy;
        // wall = cost + host = 300 us - cost
        s.host = Some(Box::new(|c: &TunerCtx| 300_000 - 2 * autotune_cost(c)));
        set_timing(&s, timing);
        let settled = |s: &Sim| phase(s) == SETTLED;
        run_until(&mut s, &autotune_cost, SETTLE_MAX, &settled);
        let [apply, _, time, _] = s.class(CLASS_1M);
        assert_eq!(
            (apply, self::reference(time)),
            (kept, reference),
            "net busy {net_busy}, timing {timing}"
        );
    }
}

/// With autotune_timing 1, where the profiler times the collectives, the GPU's time ranks the
/// candidates, not the wall time (which holds what the host does between collectives): here
/// the host's time runs the other way round, and Ring/LL128, the fastest on the GPU, is kept
/// all the same. Timed for only one collective in 16 (NCCL_BPF_PROFILER_SAMPLE=16), or with
/// autotune_timing 0 (the default) and no net busy times, the wall time decides.
#[test]
fn autotune_times_epochs_by_the_gpu_where_the_profiler_times_them() {
    let wall = |c: &TunerCtx| 300_000 - autotune_cost(c);
    for (timing, every, kept, reference) in
        [(1, 1, 3, 50_000), (1, 16, 5, 170_000), (0, 1, 5, 170_000)]
    {
        let seq = std::cell::Cell::new(0u64);
        let gpu: GpuCost = Box::new(move |c: &TunerCtx| {
            seq.set(seq.get() + 1);
            seq.get().is_multiple_of(every).then(|| autotune_cost(c))
        });
        let mut s = autotune(Tier::Jit).with_profiler(AUTOTUNE, "net_autotune_coll", gpu);
        set_timing(&s, timing);
        let settled = |s: &Sim| phase(s) == SETTLED;
        run_until(&mut s, &wall, SETTLE_MAX, &settled);
        let [apply, _, time, _] = s.class(CLASS_1M);
        assert_eq!(
            (apply, self::reference(time)),
            (kept, reference),
            "timing {timing}, timed 1 in {every}"
        );
    }
    // Collectives of another class timed in the epoch do not count for the dominant one.
    let gpu: GpuCost = Box::new(|c: &TunerCtx| {
        Some(if c.msg_size == MIB {
            autotune_cost(c)
        } else {
            1
        })
    });
    let mut s = autotune(Tier::Jit).with_profiler(AUTOTUNE, "net_autotune_coll", gpu);
    set_timing(&s, 1);
    let settled = |s: &Sim| phase(s) == SETTLED;
    for _ in 0..SETTLE_MAX {
        s.run_epoch(&|i| if i % 16 == 0 { 1024 } else { MIB }, &wall);
        if settled(&s) {
            break;
        }
    }
    assert_eq!(s.class(CLASS_1M)[0], 3, "{:?}", s.class(CLASS_1M));
}

/// A candidate is scored by the median of its three measured epochs: one stalled epoch does not
/// lose it and one lucky epoch does not win it. Ring/LL128 (50 us) stalls to 500 us in its
/// second measured epoch (the mean of two, as before, would have made it 275 and lost it to
/// Tree/Simple's 80); Tree/LL128 runs 20 us once and 150 us otherwise (the fastest epoch would
/// have won).
#[test]
fn autotune_scores_a_candidate_by_the_median_of_its_measured_epochs() {
    let mut s = autotune(Tier::Jit);
    // Epochs each decision has run so far: 0 is the discarded one, 1-3 the measured ones.
    let ran: std::cell::RefCell<std::collections::HashMap<(i32, i32, u32), u64>> =
        Default::default();
    let mut settled = false;
    for _ in 0..80 {
        let d = s.run_epoch(&|_| MIB, &|c| {
            let j = ran.borrow().get(&decision(c)).copied().unwrap_or(0);
            match (decision(c), j) {
                ((RING, LL128, 0), 2) => 500_000,
                ((TREE, LL128, 0), 1) => 20_000,
                ((TREE, LL128, 0), _) => 150_000,
                _ => autotune_cost(c),
            }
        });
        *ran.borrow_mut().entry(one(&d)).or_default() += 1;
        if phase(&s) == SETTLED {
            settled = true;
            break;
        }
    }
    assert!(settled, "class state {:?}", s.class(CLASS_1M));
    let [apply, _, time, _] = s.class(CLASS_1M);
    assert_eq!(
        apply, 3,
        "Ring/LL128 keeps its place despite one stalled epoch"
    );
    assert_eq!(reference(time), 50_000, "its median is the reference");
}

/// Candidates that run as NCCL's own choice are skipped from their first epoch: here NCCL can
/// use no LL128 (Ring/LL128 and Tree/LL128 are not usable) and picks Ring/Simple itself, so
/// slots 1, 3 and 6 would measure NCCL's choice again. They run D epochs each (until the first
/// one's figures are agreed) instead of D + 3, are never scored, and the class settles on the
/// fastest of the others.
#[test]
fn autotune_skips_candidates_that_run_as_nccls_choice() {
    let bit = |a: i32, p: i32| 1u32 << (a * 3 + p);
    let mut states = vec![];
    for tier in [Tier::Jit, Tier::Interpreter] {
        let mut s = autotune(tier);
        s.table = (
            bit(TREE, LL) | bit(TREE, SIMPLE) | bit(RING, LL) | bit(RING, SIMPLE),
            RING,
            SIMPLE,
        );
        // What runs: a choice NCCL cannot use leaves NCCL's, Ring/Simple (90 us).
        let cost = |c: &TunerCtx| match decision(c) {
            (_, LL128, _) | (-1, -1, 0) => 90_000,
            _ => autotune_cost(c),
        };
        let (mut seen, mut duels, mut last) = (vec![], 0, 0);
        while phase(&s) != SETTLED {
            assert!(
                seen.len() < SETTLE_MAX,
                "class state {:?}",
                s.class(CLASS_1M)
            );
            seen.push(one(&s.run_epoch(&|_| MIB, &cost)));
            duels += usize::from(phase(&s) == DUEL && last != DUEL);
            last = phase(&s);
        }
        // The last epoch ran on the settled state already.
        assert_eq!(seen.last(), Some(&(TREE, SIMPLE, 0)));
        let explored = &seen[..seen.len() - 1];
        let runs = |c: (i32, i32, u32)| explored.iter().filter(|&&d| d == c).count();
        for c in [(RING, SIMPLE, 0), (RING, LL128, 0), (TREE, LL128, 0)] {
            assert_eq!(runs(c), D as usize, "{c:?}: {seen:?}");
        }
        for c in [(RING, LL, 0), (TREE, LL, 0)] {
            assert_eq!(runs(c), 3 + D as usize, "{c:?}: {seen:?}");
        }
        // Tree/Simple (80 us) came within 1/4 of NCCL's choice (90 us), the best then, and
        // Ring/Simple on 2 channels (95 us) within 1/4 of Tree/Simple: two duels, each one
        // epoch per two comparisons more on those two.
        assert_eq!(duels, 2, "{seen:?}");
        for c in [(TREE, SIMPLE, 0), (RING, SIMPLE, 2)] {
            assert!(
                runs(c) >= 3 + D as usize + DUEL_MARGIN / 2,
                "{c:?}: {seen:?}"
            );
        }
        let n = seen.len();
        let bound = 5 * (3 + D as usize) + 3 * D as usize + 1 + 2 * (DUEL_SPAN + D as usize);
        assert!(n <= bound, "{n} epochs: {seen:?}");
        let [apply, ctl, time, _] = s.class(CLASS_1M);
        assert_eq!((apply, reference(time)), (4, 80_000), "Tree/Simple");
        assert_eq!(
            (ctl >> 8) & 0xff,
            0,
            "NCCL's choice, within 1/8, is the runner-up"
        );
        states.push(s.state);
    }
    assert_eq!(states[0], states[1], "JIT and interpreter agree");
}

#[test]
fn autotune_explores_again_when_the_kept_choice_slows_down() {
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &|s| phase(s) == SETTLED);
    // Stable times keep it settled.
    for _ in 0..10 {
        s.run_epoch(&|_| MIB, &autotune_cost);
        assert_eq!((phase(&s), s.class(CLASS_1M)[0]), (SETTLED, 3));
    }
    // Everything takes twice as long (contention): the recent time (1.5, 1.75, 1.875, 1.94
    // times the reference after 1-4 such epochs) over 3/2 of it in three epochs in a row starts
    // a new exploration, applied D epochs after the fourth (the third where the recent time
    // was a little above the reference before).
    let (n, _) = autotune_until(&mut s, 2, 10, &|s| phase(s) == EXPLORING);
    assert!(n <= 4 + D as usize, "explored again after {n} epochs");
    assert_eq!((rounds(&s), s.class(CLASS_1M)[0]), (2, 0));
    // It settles again, on the fastest at the new times.
    autotune_until(&mut s, 2, SETTLE_MAX, &|s| phase(s) == SETTLED);
    assert_eq!(
        (s.class(CLASS_1M)[0], reference(s.class(CLASS_1M)[2])),
        (3, 100_000)
    );
    // One or two slow epochs in a row (a stalled collective in each) are not drift.
    let before = s.class(CLASS_1M);
    for slow in [1, 2] {
        for _ in 0..slow {
            s.run_epoch(&|_| MIB, &|c| autotune_cost(c) * 4);
        }
        for _ in 0..D + 2 {
            s.run_epoch(&|_| MIB, &|c| autotune_cost(c) * 2);
        }
        assert_eq!(phase(&s), SETTLED, "{slow} slow epoch(s)");
        assert_eq!(s.class(CLASS_1M)[0], before[0]);
    }
}

/// A lasting slowdown seen through noise: epochs alternately 1.9 and 1.4 times the kept
/// choice's cost (1.65 on average; every other one under 3/2, so never three in a row over it)
/// start a new exploration within a few epochs; a single stalled epoch (20 times the cost)
/// between normal ones moves nothing.
#[test]
fn autotune_catches_a_noisy_lasting_slowdown_and_not_a_stall() {
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &|s| phase(s) == SETTLED);
    let kept = s.class(CLASS_1M)[0];
    for i in 0..40u64 {
        let stalled = i % 8 == 3;
        s.run_epoch(&|_| MIB, &|c| {
            autotune_cost(c) * if stalled { 20 } else { 1 }
        });
        assert_eq!(
            (phase(&s), s.class(CLASS_1M)[0]),
            (SETTLED, kept),
            "epoch {i}"
        );
    }
    let n = (1..=20u64)
        .find(|e| {
            let tenths = if e % 2 == 1 { 19 } else { 14 };
            s.run_epoch(&|_| MIB, &|c| autotune_cost(c) * tenths / 10);
            phase(&s) == EXPLORING
        })
        .expect("explored again");
    assert!(n <= 8 + D, "explored again after {n} epochs");
    assert_eq!(rounds(&s), 2);
}

/// The policy's epochs between pinned ones (as in bench/gpu/autotune.sh's alternating blocks):
/// the first epoch of the kept choice after a pin is not measured, so a slow first epoch after
/// every switch (here 2.5 times the cost, with one-epoch blocks between two pinned epochs:
/// every one of the policy's epochs is such a first) is neither drift nor part of the
/// reference; the same cost in every epoch is.
#[test]
fn autotune_does_not_measure_the_first_epoch_after_a_pin() {
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &|s| phase(s) == SETTLED);
    let kept = s.class(CLASS_1M)[0];
    let reference_before = reference(s.class(CLASS_1M)[2]);
    let pin = s.map("autotune_pin");
    let set = |v: u64| {
        pin.update(&(CLASS_1M as u32).to_le_bytes(), &v.to_le_bytes(), 0)
            .unwrap()
    };
    let slow = |c: &TunerCtx| autotune_cost(c) * 5 / 2;
    for _ in 0..12 {
        set(1); // NCCL's choice
        for _ in 0..2 {
            s.run_epoch(&|_| MIB, &autotune_cost);
        }
        set(0);
        s.run_epoch(&|_| MIB, &slow);
    }
    for _ in 0..D {
        s.run_epoch(&|_| MIB, &autotune_cost);
    }
    assert_eq!(
        (phase(&s), s.class(CLASS_1M)[0], rounds(&s)),
        (SETTLED, kept, 1)
    );
    assert_eq!(reference(s.class(CLASS_1M)[2]), reference_before);
    // The same slow epoch as the second of two-epoch blocks is measured: drift, and an
    // exploration within a few blocks.
    let mut explored = None;
    for b in 0..12 {
        set(1);
        for _ in 0..2 {
            s.run_epoch(&|_| MIB, &autotune_cost);
        }
        set(0);
        s.run_epoch(&|_| MIB, &autotune_cost);
        s.run_epoch(&|_| MIB, &slow);
        if rounds(&s) == 2 {
            explored = Some(b);
            break;
        }
    }
    assert!(
        explored.is_some_and(|b| b <= 6),
        "explored in block {explored:?}"
    );
}

/// Without pins, the same 2.5-times cost in every epoch is drift.
#[test]
fn autotune_explores_when_every_epoch_is_slow() {
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &|s| phase(s) == SETTLED);
    let slow = |c: &TunerCtx| autotune_cost(c) * 5 / 2;
    let (n, _) = run_until(&mut s, &slow, 10, &|s| phase(s) == EXPLORING);
    assert!(n <= 4 + D as usize, "explored after {n} epochs");
}

const PROBING: u64 = 3;
const PROBE_EVERY: usize = 32;

/// The kept choice's slot and the class's home slot (0xff: none).
fn kept_and_home(s: &Sim) -> (u64, u64) {
    let ctl = s.class(CLASS_1M)[1];
    ((ctl >> 24) & 0xff, (ctl >> 48) & 0xff)
}

/// Costs while contention slows Ring/LL128 fourfold (200 us), the rest as before.
fn contended(c: &TunerCtx) -> u64 {
    match decision(c) {
        (RING, LL128, 0) => 200_000,
        _ => autotune_cost(c),
    }
}

/// Runs contended epochs until the class has explored again and settled.
fn settle_under_contention(s: &mut Sim) {
    run_until(s, &contended, SETTLE_MAX, &|s| {
        phase(s) == SETTLED && rounds(s) == 2
    });
}

/// Contention that slows the kept Ring/LL128 fourfold starts an exploration that settles on
/// Tree/Simple and remembers Ring/LL128 as home; a probe of home every PROBE_EVERY settled
/// epochs finds it slow while the contention lasts and fast once it is over, and the class
/// goes back to it without another exploration.
#[test]
fn autotune_comes_back_home_when_contention_ends() {
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &|s| phase(s) == SETTLED);
    assert_eq!(kept_and_home(&s), (3, 0xff));
    settle_under_contention(&mut s);
    assert_eq!(
        kept_and_home(&s),
        (6, 3),
        "Tree/LL128 kept, Ring/LL128 home"
    );
    // While the contention lasts, probes of home find it slow: Tree/LL128 stays.
    let mut probes = 0;
    for _ in 0..3 * PROBE_EVERY {
        let d = one(&s.run_epoch(&|_| MIB, &contended));
        probes += usize::from(phase(&s) == PROBING && d == (RING, LL128, 0));
        assert_ne!(phase(&s), EXPLORING);
    }
    assert!(probes > 0, "home was probed");
    assert_eq!(kept_and_home(&s), (6, 3));
    // Over: back home within a probe period and a probe (a duel).
    let back = PROBE_EVERY + DUEL_SPAN + 2 * D as usize + 2;
    let (n, _) = autotune_until(&mut s, 1, back, &|s| {
        kept_and_home(s) == (3, 0xff) && phase(s) == SETTLED
    });
    assert!(n <= back, "{n} epochs");
    assert_eq!(rounds(&s), 2, "no third exploration");
    // The reference was Tree/LL128's; the EWMA (1/32) follows Ring/LL128 (50 us) from there.
    for _ in 0..200 {
        s.run_epoch(&|_| MIB, &autotune_cost);
    }
    let r = reference(s.class(CLASS_1M)[2]);
    assert!((50_000..50_500).contains(&r), "reference {r}");
}

/// A runner-up that came within 1/8 of the kept choice is probed now and then and takes over
/// when it turns out faster; one further behind is never probed.
#[test]
fn autotune_probes_a_close_runner_up_and_only_that() {
    let settled = |s: &Sim| phase(s) == SETTLED;
    // Default costs: Ring/LL128 (50 us) wins, Tree/LL128 is second at 70: not close, so
    // nothing is probed in 3 probe periods.
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &settled);
    assert_eq!(
        (s.class(CLASS_1M)[1] >> 8) & 0xff,
        0xff,
        "no runner-up kept"
    );
    for _ in 0..3 * PROBE_EVERY {
        assert_eq!(
            one(&s.run_epoch(&|_| MIB, &autotune_cost)),
            (RING, LL128, 0)
        );
    }
    // Tree/Simple 80 us wins; Ring/Simple at 85 us is within 1/8, the runner-up.
    let close = |c: &TunerCtx| match decision(c) {
        (RING, LL128, 0) | (TREE, LL128, 0) => 200_000,
        (RING, SIMPLE, 0) => 85_000,
        _ => autotune_cost(c),
    };
    let mut s = autotune(Tier::Jit);
    run_until(&mut s, &close, SETTLE_MAX, &settled);
    assert_eq!(kept_and_home(&s).0, 4, "Tree/Simple");
    assert_eq!(
        (s.class(CLASS_1M)[1] >> 8) & 0xff,
        1,
        "Ring/Simple is the runner-up"
    );
    // Still slower when probed: Tree/Simple stays, and is kept between probes.
    let (_, seen) = run_until(&mut s, &close, PROBE_EVERY + 3 + D as usize, &|s| {
        phase(s) == PROBING
    });
    assert!(
        seen[..seen.len() - 1]
            .iter()
            .all(|&d| d == (TREE, SIMPLE, 0))
    );
    // The probe is a duel: the two alternate, epoch for epoch.
    let (_, duel) = run_until(&mut s, &close, DUEL_SPAN + D as usize + 1, &settled);
    assert!(duel.contains(&(RING, SIMPLE, 0)) && duel.contains(&(TREE, SIMPLE, 0)));
    assert_eq!(kept_and_home(&s).0, 4);
    assert_eq!((s.class(CLASS_1M)[1] >> 8) & 0xff, 1, "still the runner-up");
    // Ring/Simple becomes faster (74 us against 80): the next probe finds it and keeps it;
    // Tree/Simple lost every pair of that duel, so it is no runner-up (nothing to probe).
    let faster = |c: &TunerCtx| match decision(c) {
        (RING, SIMPLE, 0) => 74_000,
        _ => close(c),
    };
    let bound = PROBE_EVERY + DUEL_SPAN + 2 * D as usize + 2;
    let (n, _) = run_until(&mut s, &faster, bound, &|s| {
        settled(s) && kept_and_home(s).0 == 1
    });
    assert!(n <= bound);
    assert_eq!((s.class(CLASS_1M)[1] >> 8) & 0xff, 0xff);
    assert_eq!(rounds(&s), 1, "no exploration");
}

/// A probe changes the kept choice only by a clear lead: the probed runner-up (Ring/Simple)
/// alternates between 75 and 95 us (Tree/Simple, the kept one, runs 80), so it wins both
/// comparisons of every other epoch it runs, starting with the first: a majority of the
/// comparisons that never leads by DUEL_MARGIN, and Tree/Simple stays. (Going by the majority,
/// two near-equal choices would swap back and forth at every probe.)
#[test]
fn autotune_probe_keeps_the_kept_choice_on_a_close_majority() {
    use std::cell::Cell;
    let (probing, ring_epochs) = (Cell::new(false), Cell::new(0u64));
    let cost = |c: &TunerCtx| match decision(c) {
        (RING, LL128, 0) | (TREE, LL128, 0) => 200_000,
        (RING, SIMPLE, 0) if probing.get() => {
            if ring_epochs.get() % 2 == 0 {
                75_000
            } else {
                95_000
            }
        }
        (RING, SIMPLE, 0) => 85_000,
        _ => autotune_cost(c),
    };
    let settled = |s: &Sim| phase(s) == SETTLED;
    let mut s = autotune(Tier::Jit);
    run_until(&mut s, &cost, SETTLE_MAX, &settled);
    assert_eq!(kept_and_home(&s).0, 4, "Tree/Simple");
    assert_eq!(
        (s.class(CLASS_1M)[1] >> 8) & 0xff,
        1,
        "Ring/Simple is the runner-up"
    );
    run_until(&mut s, &cost, PROBE_EVERY + 3 + D as usize, &|s| {
        phase(s) == PROBING
    });
    probing.set(true);
    let mut probe = vec![];
    while phase(&s) == PROBING {
        assert!(probe.len() <= DUEL_SPAN + D as usize + 1, "{probe:?}");
        let d = one(&s.run_epoch(&|_| MIB, &cost));
        ring_epochs.set(ring_epochs.get() + u64::from(d == (RING, SIMPLE, 0)));
        probe.push(d);
    }
    assert!(
        ring_epochs.get() >= DUEL_MAX as u64 / 2,
        "a full duel: {probe:?}"
    );
    assert_eq!(phase(&s), SETTLED);
    assert_eq!(kept_and_home(&s).0, 4, "Tree/Simple stays: {probe:?}");
    let d = s.run_epoch(&|_| MIB, &cost);
    assert_eq!(one(&d), (TREE, SIMPLE, 0));
}

/// Costs on a machine that slows down by 1% per epoch: Tree/Simple (80 us) is truly faster
/// than Ring/Simple (85 us), but explored 15 epochs later it measures slower; the rest are far
/// behind. `stalled` is the duel epoch (counted from 0) of Tree/Simple that stalls tenfold.
fn drifting(
    epoch: &std::cell::Cell<u64>,
    stalled: Option<u64>,
    duel_epochs: &std::cell::Cell<u64>,
) -> impl Fn(&TunerCtx) -> u64 {
    move |c: &TunerCtx| {
        let base = match decision(c) {
            (TREE, SIMPLE, 0) => 80_000,
            (RING, SIMPLE, 0) => 85_000,
            _ => 200_000,
        };
        let stall = decision(c) == (TREE, SIMPLE, 0) && stalled == Some(duel_epochs.get());
        base * (100 + epoch.get()) / 100 * if stall { 10 } else { 1 }
    }
}

/// Exploration measures candidates one after another, so a machine that drifts ranks them by
/// when they ran: Ring/Simple explores faster than the truly faster Tree/Simple. The two came
/// within 1/4, so they duel, epoch for epoch: Tree/Simple wins every pair and keeps the class
/// with Ring/Simple as its runner-up, and one stalled epoch of Tree/Simple in the duel (one
/// pair lost) does not change that.
#[test]
fn autotune_duel_decides_between_two_close_candidates_epoch_for_epoch() {
    use std::cell::Cell;
    for stalled in [None, Some(3)] {
        let (epoch, duel_epochs) = (Cell::new(0), Cell::new(0));
        let cost = drifting(&epoch, stalled, &duel_epochs);
        let mut s = autotune(Tier::Jit);
        let mut explored = vec![];
        while phase(&s) != DUEL {
            assert!(epoch.get() < 60, "no duel: {:?}", s.class(CLASS_1M));
            explored.push(one(&s.run_epoch(&|_| MIB, &cost)));
            epoch.set(epoch.get() + 1);
        }
        // Ring/Simple explored first and measured faster: it is the fastest of the duel.
        let [_, ctl, time, _] = s.class(CLASS_1M);
        assert_eq!(
            ((ctl >> 24) & 0xff, (ctl >> 8) & 0xff),
            (1, 4),
            "{explored:?}"
        );
        assert!(
            time & 0xffff_ffff < time >> 32,
            "Ring/Simple measured faster"
        );
        let mut duel = vec![];
        while phase(&s) == DUEL {
            assert!(duel.len() <= DUEL_SPAN + D as usize, "{duel:?}");
            let d = one(&s.run_epoch(&|_| MIB, &cost));
            duel_epochs.set(duel_epochs.get() + u64::from(d == (TREE, SIMPLE, 0)));
            duel.push(d);
            epoch.set(epoch.get() + 1);
        }
        // Exploration goes on with the rest (far behind), then settles.
        assert_eq!(phase(&s), EXPLORING);
        assert_eq!(
            kept_and_home(&s).0,
            4,
            "Tree/Simple won the duel ({stalled:?}): {duel:?}"
        );
        while phase(&s) != SETTLED {
            assert!(epoch.get() < SETTLE_MAX as u64, "{:?}", s.class(CLASS_1M));
            s.run_epoch(&|_| MIB, &cost);
            epoch.set(epoch.get() + 1);
        }
        let [apply, ctl, time, _] = s.class(CLASS_1M);
        assert_eq!(apply, 4, "Tree/Simple kept");
        assert_eq!(
            (ctl >> 8) & 0xff,
            1,
            "Ring/Simple, within 1/8, is the runner-up"
        );
        assert!(
            time > 80_000,
            "the reference is Tree/Simple's explored median: {time}"
        );
        let d = s.run_epoch(&|_| MIB, &cost);
        assert_eq!(one(&d), (TREE, SIMPLE, 0));
    }
}

/// A challenger that loses the duel leaves the best in place: Tree/Simple, 1/16 slower than
/// Ring/Simple at every moment, wins no comparison.
#[test]
fn autotune_duel_keeps_the_best_against_a_slower_challenger() {
    let cost = |c: &TunerCtx| match decision(c) {
        (TREE, SIMPLE, 0) => 90_000,
        (RING, SIMPLE, 0) => 85_000,
        _ => 200_000,
    };
    let mut s = autotune(Tier::Jit);
    run_until(&mut s, &cost, SETTLE_MAX, &|s| phase(s) == DUEL);
    let ctl = s.class(CLASS_1M)[1];
    assert_eq!(
        ((ctl >> 24) & 0xff, (ctl >> 8) & 0xff),
        (1, 4),
        "Ring/Simple against Tree/Simple"
    );
    let (n, duel) = run_until(&mut s, &cost, DUEL_SPAN + D as usize + 1, &|s| {
        phase(s) != DUEL
    });
    // Every comparison to the best: over once it leads by DUEL_MARGIN (plus the D epochs still
    // running the explored candidate), long before DUEL_MAX.
    assert!(
        n >= DUEL_MARGIN && n <= DUEL_MARGIN + D as usize + 1,
        "{n}: {duel:?}"
    );
    assert_eq!(kept_and_home(&s).0, 1, "Ring/Simple stays the best");
    assert_eq!(
        (s.class(CLASS_1M)[1] >> 32) & 0xff,
        0,
        "the duel's count is cleared"
    );
    run_until(&mut s, &cost, SETTLE_MAX, &|s| phase(s) == SETTLED);
    assert_eq!(s.class(CLASS_1M)[0], 1);
    assert_eq!(
        reference(s.class(CLASS_1M)[2]),
        85_000,
        "its explored median is the reference"
    );
    assert_eq!(
        (s.class(CLASS_1M)[1] >> 8) & 0xff,
        4,
        "Tree/Simple, within 1/8, is the runner-up"
    );
}

/// A close duel goes on: Tree/Simple, the challenger, alternates between 95 and 75 us in the
/// duel (Ring/Simple, the best, runs 85), so it loses both comparisons of one epoch it runs
/// and wins both of the next, and neither side ever leads by DUEL_MARGIN; after DUEL_MAX
/// comparisons the majority goes to the side that led (by one): here the best.
#[test]
fn autotune_duel_goes_on_while_close_and_the_majority_decides() {
    use std::cell::Cell;
    let (in_duel, tree_epochs) = (Cell::new(false), Cell::new(0u64));
    let cost = |c: &TunerCtx| match decision(c) {
        (TREE, SIMPLE, 0) if in_duel.get() => {
            if tree_epochs.get() % 2 == 0 {
                95_000
            } else {
                75_000
            }
        }
        (TREE, SIMPLE, 0) => 90_000,
        (RING, SIMPLE, 0) => 85_000,
        _ => 200_000,
    };
    let mut s = autotune(Tier::Jit);
    run_until(&mut s, &cost, SETTLE_MAX, &|s| phase(s) == DUEL);
    assert_eq!(kept_and_home(&s).0, 1);
    in_duel.set(true);
    let mut duel = vec![];
    while phase(&s) == DUEL {
        assert!(duel.len() <= DUEL_SPAN + D as usize, "{duel:?}");
        let d = one(&s.run_epoch(&|_| MIB, &cost));
        if d == (TREE, SIMPLE, 0) {
            tree_epochs.set(tree_epochs.get() + 1);
        }
        duel.push(d);
    }
    assert!(duel.len() >= DUEL_SPAN, "{} epochs: {duel:?}", duel.len());
    assert_eq!(
        kept_and_home(&s).0,
        1,
        "the majority keeps Ring/Simple: {duel:?}"
    );
}

#[test]
fn autotune_learns_nothing_without_a_dominant_class() {
    let mut s = autotune(Tier::Jit);
    for _ in 0..20 {
        // Half the collectives of 1 KiB, half of 1 MiB.
        let d = s.run_epoch(&|i| if i % 2 == 0 { 1024 } else { MIB }, &autotune_cost);
        assert!(d.iter().all(|c| decision(c) == (-1, -1, 0)));
    }
    assert_eq!(s.state, [0; 32]);
    // 89% is not enough either.
    for _ in 0..10 {
        s.run_epoch(&|i| if i < 57 { MIB } else { 1024 }, &autotune_cost);
    }
    assert_eq!(s.state, [0; 32]);
}

#[test]
fn autotune_candidates_come_from_the_config_map() {
    let mut s = autotune(Tier::Jit);
    // Slot 3 removed; slot 7 replaced by Tree/Simple on 4 channels, faster than all.
    let cand = |algo: i32, proto: i32, nch: u32, valid: u32| {
        [
            algo.to_le_bytes(),
            proto.to_le_bytes(),
            nch.to_le_bytes(),
            valid.to_le_bytes(),
        ]
        .concat()
    };
    let m = s.map("autotune_candidates");
    m.update(&3u32.to_le_bytes(), &cand(0, 0, 0, 2), 0).unwrap();
    m.update(&7u32.to_le_bytes(), &cand(TREE, SIMPLE, 4, 1), 0)
        .unwrap();
    // Slot 0 is NCCL's choice whatever its entry says.
    m.update(&0u32.to_le_bytes(), &cand(TREE, LL128, 3, 1), 0)
        .unwrap();
    let cost = |c: &TunerCtx| match decision(c) {
        (TREE, SIMPLE, 4) => 40_000,
        (RING, LL128, 0) => panic!("a removed candidate ran"),
        _ => autotune_cost(c),
    };
    let mut seen = vec![];
    for _ in 0..SETTLE_MAX {
        let d = s.run_epoch(&|_| MIB, &cost);
        seen.push(one(&d));
        if phase(&s) == SETTLED {
            break;
        }
    }
    assert_eq!(phase(&s), SETTLED);
    assert_eq!(s.class(CLASS_1M)[0], 7);
    assert!(seen.contains(&(-1, -1, 0)) && !seen.contains(&(TREE, LL128, 3)));
    assert_eq!(one(&s.run_epoch(&|_| MIB, &cost)), (TREE, SIMPLE, 4));
    // A staged update that removes the kept candidate: explored again, and meanwhile the
    // tuner program applies no opinion rather than a removed candidate.
    m.update(&7u32.to_le_bytes(), &cand(0, 0, 0, 2), 0).unwrap();
    let d = s.run_epoch(&|_| MIB, &autotune_cost);
    assert_eq!(one(&d), (-1, -1, 0));
    s.run_epoch(&|_| MIB, &autotune_cost);
    s.run_epoch(&|_| MIB, &autotune_cost);
    assert_eq!(phase(&s), EXPLORING);
}

#[test]
fn autotune_pins_apply_a_candidate_and_leave_the_state_alone() {
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &|s| phase(s) == SETTLED);
    assert_eq!(s.class(CLASS_1M)[0], 3, "Ring/LL128 kept");
    let pin = s.map("autotune_pin");
    let set = |class: usize, v: u64| {
        pin.update(&(class as u32).to_le_bytes(), &v.to_le_bytes(), 0)
            .unwrap()
    };
    // Pinned to Tree/LL (candidate 5), ten times slower than its normal cost: applied from the
    // next decision, every decision of the class, and never learnt from (no drift, no new
    // exploration, no changed reference).
    set(CLASS_1M, 5 + 1);
    let slow = |c: &TunerCtx| autotune_cost(c) * 10;
    let mut state = s.state;
    for e in 0..24 {
        let d = s.run_epoch(&|_| MIB, &slow);
        assert_eq!(one(&d), (TREE, LL, 0));
        // The epochs before the pin still reach the epoch program, D epochs late.
        if e == D {
            state = s.state;
        }
    }
    assert_eq!(s.state, state, "pinned epochs change nothing");
    // Another class is not pinned: 64 KiB collectives keep being decided by the policy (a new
    // class, so no opinion yet).
    let d = s.run_epoch(&|_| 64 << 10, &autotune_cost);
    assert_eq!(one(&d), (-1, -1, 0));
    // Pinned to NCCL's choice (value 1), then to a slot without a candidate (NCCL's choice).
    set(CLASS_1M, 1);
    assert_eq!(one(&s.run_epoch(&|_| MIB, &slow)), (-1, -1, 0));
    s.map("autotune_candidates")
        .update(
            &2u32.to_le_bytes(),
            &[0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0],
            0,
        )
        .unwrap();
    set(CLASS_1M, 2 + 1);
    assert_eq!(one(&s.run_epoch(&|_| MIB, &slow)), (-1, -1, 0));
    // Pinned to the kept candidate itself, ten times slower: still nothing learnt (the pin,
    // not the policy, decided those epochs), so no drift and no exploration.
    set(CLASS_1M, 3 + 1);
    for _ in 0..D + 1 {
        s.run_epoch(&|_| MIB, &slow);
    }
    let state = s.state;
    for _ in 0..8 {
        assert_eq!(one(&s.run_epoch(&|_| MIB, &slow)), (RING, LL128, 0));
    }
    assert_eq!(
        s.state, state,
        "epochs pinned to the kept candidate change nothing"
    );
    // Unpinned: the kept candidate again, and the state it left behind goes on from there.
    set(CLASS_1M, 0);
    for _ in 0..D + 2 {
        assert_eq!(
            one(&s.run_epoch(&|_| MIB, &autotune_cost)),
            (RING, LL128, 0)
        );
    }
    assert_eq!(phase(&s), SETTLED);
    assert_eq!(s.class(CLASS_1M)[0], 3);
    assert_eq!(rounds(&s), 1, "no exploration");
}

// ---------------------------------------------------------------- slo_enforcer

const SLO: &str = "src/slo_enforcer.o";
const BUDGET: u64 = 100_000;

fn slo() -> Sim {
    let s = Sim::new(SLO, "slo_enforcer", "slo_enforcer_epoch", None, Tier::Jit);
    s.map("slo_budget_ns")
        .update(&(CLASS_1M as u32).to_le_bytes(), &BUDGET.to_le_bytes(), 0)
        .unwrap();
    s
}

/// ns per collective at each level: `l0` for NCCL's choice, `l1` for LL, `l2` for LL on 2
/// channels.
fn slo_cost(l0: u64, l1: u64, l2: u64) -> impl Fn(&TunerCtx) -> u64 {
    move |c| match decision(c) {
        (-1, -1, 0) => l0,
        (-1, LL, 0) => l1,
        (-1, LL, 2) => l2,
        d => panic!("not a level: {d:?}"),
    }
}

fn level(s: &Sim) -> u64 {
    s.class(CLASS_1M)[0]
}

/// The decision each level applies.
fn applied(level: u64) -> (i32, i32, u32) {
    match level {
        0 => (-1, -1, 0),
        1 => (-1, LL, 0),
        2 => (-1, LL, 2),
        l => panic!("level {l}"),
    }
}

/// The level after each of `n` epochs; every epoch's decisions are the ones of the level the
/// state held when it began (the epoch program runs at its first collective).
fn slo_run(s: &mut Sim, n: usize, cost: &dyn Fn(&TunerCtx) -> u64) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let d = s.run_epoch(&|_| MIB, cost);
            assert_eq!(one(&d), applied(level(s)));
            level(s)
        })
        .collect()
}

/// `levels` with repeats removed.
fn changes(levels: &[u64]) -> Vec<u64> {
    let mut v: Vec<u64> = levels.to_vec();
    v.dedup();
    v
}

#[test]
fn slo_moves_to_ll_over_budget_and_probes_back() {
    let mut s = slo();
    // Congested: NCCL's choice takes 150 µs, LL 70 µs (under 4/5 of the budget).
    let congested = slo_cost(150_000, 70_000, 60_000);
    let levels = slo_run(&mut s, 40, &congested);
    // Over twice: LL; under for 4 measured epochs: probe NCCL's choice, over again: LL again.
    assert_eq!(changes(&levels)[..4], [0, 1, 0, 1], "{levels:?}");
    // The first two epochs are measured at once, and their state applies D epochs later.
    assert_eq!(
        levels.iter().position(|&l| l == 1),
        Some(D as usize + 1),
        "{levels:?}"
    );
    // Exactly: 2 epochs over, then D epochs still at level 0 (decided before the change,
    // not measured), then 4 under at level 1, D more, then the probe.
    let up = levels
        .iter()
        .skip(D as usize + 1)
        .position(|&l| l == 0)
        .unwrap();
    assert_eq!(up, 4 + D as usize - 1, "{levels:?}");
    let [_, over, under, last] = s.class(CLASS_1M);
    assert!(over <= 1 && under <= 3, "{:?}", s.class(CLASS_1M));
    assert!(last == 70_000 || last == 150_000);
    // The congestion ends: the next probe stays at NCCL's choice.
    let clear = slo_cost(50_000, 70_000, 60_000);
    let levels = slo_run(&mut s, 40, &clear);
    assert!(
        levels[levels.len() - 20..].iter().all(|&l| l == 0),
        "{levels:?}"
    );
    assert_eq!(s.class(CLASS_1M)[3], 50_000);
}

#[test]
fn slo_uses_fewer_channels_when_ll_is_not_enough() {
    let mut s = slo();
    // LL alone is still over budget: level 2, LL on 2 channels (60 µs).
    let cost = slo_cost(150_000, 120_000, 60_000);
    let levels = slo_run(&mut s, 30, &cost);
    assert_eq!(changes(&levels)[..3], [0, 1, 2], "{levels:?}");
    // Level 2 is the last: a probe goes back to 1, which is over budget again.
    assert!(levels.iter().all(|&l| l <= 2));
    // Removing the budget returns the class to NCCL's choice at the next epoch it dominates.
    s.map("slo_budget_ns")
        .update(&(CLASS_1M as u32).to_le_bytes(), &0u64.to_le_bytes(), 0)
        .unwrap();
    slo_run(&mut s, 1, &cost);
    assert_eq!(s.class(CLASS_1M)[..3], [0, 0, 0]);
    let levels = slo_run(&mut s, 10, &cost);
    assert!(levels.iter().all(|&l| l == 0), "{levels:?}");
}

#[test]
fn slo_without_budgets_keeps_nccls_choice() {
    let mut s = Sim::new(
        SLO,
        "slo_enforcer",
        "slo_enforcer_epoch",
        None,
        Tier::Interpreter,
    );
    let levels = slo_run(&mut s, 10, &slo_cost(1_000_000, 1, 1));
    assert!(levels.iter().all(|&l| l == 0));
    // Other classes have no budget even when one is set for class 5.
    let mut s = slo();
    for _ in 0..10 {
        let d = s.run_epoch(&|_| 1024, &slo_cost(1_000_000, 1, 1));
        assert_eq!(one(&d), (-1, -1, 0));
    }
}

// ---------------------------------------------------------------- slots removed by staged updates

fn candidate_entry(algo: i32, proto: i32, nch: u32, valid: u32) -> Vec<u8> {
    [
        algo.to_le_bytes(),
        proto.to_le_bytes(),
        nch.to_le_bytes(),
        valid.to_le_bytes(),
    ]
    .concat()
}

/// Removes slot `slot` with a staged-style config update (valid 2).
fn remove_slot(s: &Sim, slot: u32) {
    s.map("autotune_candidates")
        .update(&slot.to_le_bytes(), &candidate_entry(0, 0, 0, 2), 0)
        .unwrap();
}

/// The default costs, where `removed` must never run.
fn without(removed: (i32, i32, u32)) -> impl Fn(&TunerCtx) -> u64 {
    move |c: &TunerCtx| {
        assert_ne!(decision(c), removed, "a removed candidate ran");
        autotune_cost(c)
    }
}

/// A staged config update that removes the slot being explored: the tuner program then applies
/// NCCL's choice (candidate 0), so `used == idx` never comes and the exploration never ends.
#[test]
fn autotune_exploration_goes_on_when_the_explored_slot_is_removed() {
    let mut s = autotune(Tier::Jit);
    // Until slot 3 (Ring/LL128) is the one being explored and applied.
    run_until(&mut s, &autotune_cost, SETTLE_MAX, &|s| {
        let [apply, ctl, _, _] = s.class(CLASS_1M);
        phase(s) == EXPLORING && (ctl >> 8) & 0xff == 3 && apply == 3
    });
    remove_slot(&s, 3);
    let cost = without((RING, LL128, 0));
    let mut last = 0;
    for _ in 0..120 {
        s.run_epoch(&|_| MIB, &cost);
        last = phase(&s);
        if last == SETTLED {
            break;
        }
    }
    assert_eq!(last, SETTLED, "stuck: class state {:?}", s.class(CLASS_1M));
}

/// A challenger's slot removed during its duel ends the duel (the best stays, the removed slot
/// is no runner-up) and exploration goes on with the candidates after it: default costs, where
/// Ring/Simple (slot 1, 90 us) duels NCCL's choice (100 us), and Ring/LL128 (slot 3, 50 us)
/// must still be found.
#[test]
fn autotune_duel_ends_and_exploration_goes_on_when_the_challenger_is_removed() {
    let mut s = autotune(Tier::Jit);
    run_until(&mut s, &autotune_cost, SETTLE_MAX, &|s| phase(s) == DUEL);
    assert_eq!(
        (s.class(CLASS_1M)[1] >> 8) & 0xff,
        1,
        "Ring/Simple challenges"
    );
    remove_slot(&s, 1);
    let cost = without((RING, SIMPLE, 0));
    run_until(&mut s, &cost, SETTLE_MAX, &|s| phase(s) == SETTLED);
    let [apply, ctl, _, _] = s.class(CLASS_1M);
    assert_eq!(apply, 3, "Ring/LL128, explored after the duel ended");
    assert_ne!((ctl >> 8) & 0xff, 1, "the removed slot is no runner-up");
    assert_eq!(rounds(&s), 1);
}

/// A class dominant only in bursts of D epochs (here 1 MiB for 2 epochs, then 1 KiB for 8)
/// flips its duel's choice twice per burst, so what runs never alternates and no pair forms:
/// the duel ends by its epoch bound instead of running one candidate for good.
#[test]
fn autotune_duel_without_pairs_ends_by_its_epoch_bound() {
    let mut s = autotune(Tier::Jit);
    run_until(&mut s, &autotune_cost, SETTLE_MAX, &|s| phase(s) == DUEL);
    let mut n = 0;
    while phase(&s) == DUEL {
        n += 1;
        assert!(
            n <= 20 * DUEL_EPOCHS,
            "a duel without pairs went on: {:?}",
            s.class(CLASS_1M)
        );
        let size = if n % 10 < D as usize { MIB } else { 1024 };
        s.run_epoch(&|_| size, &autotune_cost);
    }
    assert_ne!(phase(&s), DUEL);
}

/// The same for a probe: the probed runner-up's slot removed while it is probed leaves the
/// class in PROBING for good, running NCCL's choice instead of the kept Tree/Simple.
#[test]
fn autotune_probe_ends_when_the_probed_slot_is_removed() {
    let close = |c: &TunerCtx| match decision(c) {
        (RING, LL128, 0) | (TREE, LL128, 0) => 200_000,
        (RING, SIMPLE, 0) => 85_000,
        (-1, -1, 0) => 100_000,
        _ => autotune_cost(c),
    };
    let mut s = autotune(Tier::Jit);
    run_until(&mut s, &close, SETTLE_MAX, &|s| phase(s) == SETTLED);
    assert_eq!(kept_and_home(&s).0, 4, "Tree/Simple kept");
    run_until(&mut s, &close, PROBE_EVERY + 3 + D as usize, &|s| {
        phase(s) == PROBING
    });
    assert_eq!(s.class(CLASS_1M)[1] >> 56, 1, "probing Ring/Simple");
    remove_slot(&s, 1);
    let mut seen = vec![];
    for _ in 0..3 * PROBE_EVERY {
        seen.push(one(&s.run_epoch(&|_| MIB, &close)));
    }
    assert_eq!(
        (phase(&s), seen.last().copied()),
        (SETTLED, Some((TREE, SIMPLE, 0))),
        "class state {:?}",
        s.class(CLASS_1M)
    );
}

/// After a probe brings the class home, the choice it leaves becomes the runner-up without the
/// 1/8 test exploration applies: Tree/LL128 (70 us against Ring/LL128's 50, 40% slower) is then
/// probed every PROBE_EVERY epochs for good, though "one further behind is never probed".
#[test]
fn autotune_after_coming_home_probes_no_distant_runner_up() {
    let mut s = autotune(Tier::Jit);
    autotune_until(&mut s, 1, SETTLE_MAX, &|s| phase(s) == SETTLED);
    settle_under_contention(&mut s);
    assert_eq!(kept_and_home(&s), (6, 3));
    autotune_until(
        &mut s,
        1,
        PROBE_EVERY + DUEL_SPAN + 2 * D as usize + 2,
        &|s| kept_and_home(s) == (3, 0xff) && phase(s) == SETTLED,
    );
    // Let the last probe's epochs drain, then count what else runs.
    for _ in 0..D + 1 {
        s.run_epoch(&|_| MIB, &autotune_cost);
    }
    let mut other = vec![];
    for _ in 0..3 * PROBE_EVERY {
        let d = one(&s.run_epoch(&|_| MIB, &autotune_cost));
        if d != (RING, LL128, 0) {
            other.push(d);
        }
    }
    assert!(
        other.is_empty(),
        "runner-up {} probed: {other:?}",
        (s.class(CLASS_1M)[1] >> 8) & 0xff
    );
}
