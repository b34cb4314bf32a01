//! The agreement, tuner side, in one process: two tuner contexts of one two-rank communicator
//! stand for the two ranks (they share the process's exchange, so each one's record reaches
//! the other without a network). `policies/safe/epoch_state.c`: the epoch program counts epochs
//! whose agreed latency (the ranks' maximum) is over a config limit; the tuner program picks LL
//! after two in a row.

use ncclbpf_agreement::Params;
use ncclbpf_tuner::agree::{Mode, Setting};
use ncclbpf_tuner::ffi::TunerContext;
use ncclbpf_tuner::stage::{ConfigUpdate, History};
use ncclnet_headers::NcclFunc;
use policy_runtime::{LoadOptions, LoadedProgram, ProgramSlot};
use shared_maps::{Map, Registry};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn built(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(rel);
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

struct Loaded {
    slot: &'static ProgramSlot,
    epoch: &'static LoadedProgram,
    maps: Vec<Arc<Map>>,
}

fn load(tag: &str) -> Loaded {
    // The "ranks" here share the process's exchange: nothing to relay, nothing to write.
    ncclbpf_agreement::disable_local("in-process test");
    let reg = Box::leak(Box::new(Registry::new(
        std::env::temp_dir().join(format!("ncclbpf-agree-{tag}-{}", std::process::id())),
    )));
    let path = built("safe/epoch_state.o");
    let tuner = ncclbpf_tuner::policy::load(path.to_str().unwrap(), None, reg).unwrap();
    let obj = policy_object::Object::parse(&std::fs::read(&path).unwrap()).unwrap();
    let epoch = LoadedProgram::load(&obj, Some("epoch"), reg, &LoadOptions::default()).unwrap();
    let maps = tuner.maps().to_vec();
    Loaded {
        slot: Box::leak(Box::new(ProgramSlot::new(tuner))),
        epoch: Box::leak(Box::new(epoch)),
        maps,
    }
}

/// A history of staged changes of the test's own.
fn history() -> &'static History {
    Box::leak(Box::new(History::new()))
}

fn map<'a>(l: &'a Loaded, name: &str) -> &'a Map {
    l.maps.iter().find(|m| m.spec().name == name).unwrap()
}

fn setting(l: &Loaded, epoch: u64, delay: u64, timeout: Duration) -> Setting {
    Setting {
        mode: Mode::Auto,
        params: Params {
            epoch,
            delay,
            timeout,
        },
        epoch: Some(l.epoch),
        between_nodes: true,
    }
}

fn add(m: &Map, key: u32, v: u64) {
    let k = key.to_le_bytes();
    let now = u64::from_le_bytes(m.get(&k).unwrap().try_into().unwrap());
    m.update(&k, &(now + v).to_le_bytes(), 0).unwrap();
}

fn proto(c: &TunerContext) -> i32 {
    c.decide(NcclFunc::ALL_REDUCE, 1 << 20, 1, 0, None)
        .unwrap()
        .proto
}

#[test]
fn two_ranks_decide_alike_from_agreed_latency_once_the_first_epoch_is_applied() {
    let l = load("two");
    map(&l, "limit")
        .update(&0u32.to_le_bytes(), &100u64.to_le_bytes(), 0)
        .unwrap();
    let s = setting(&l, 4, 2, Duration::from_secs(10));
    let a = TunerContext::for_programs(0x7701, 2, 2, l.slot, &s, history());
    let b = TunerContext::for_programs(0x7701, 2, 2, l.slot, &s, history());
    let mut seen = Vec::new();
    for i in 1..=40u64 {
        // The "net hooks" see 1000 ns of latency per collective from seq 13 on.
        if i >= 13 {
            add(map(&l, "lat"), 0, 1000);
        }
        let (pa, pb) = (proto(&a), proto(&b));
        assert_eq!(pa, pb, "seq {i}");
        seen.push(pa);
    }
    // No opinion until epoch 0 applies at seq (0+2)*4+1 = 9. The first latency is counted
    // before seq 13, whose boundary closes epoch 2 (seq 9-12): epoch 2 applies at seq 17 (over
    // the limit once), epoch 3 at seq 21 (twice in a row): LL from seq 21 on.
    assert!(seen[..20].iter().all(|&p| p == -1), "{seen:?}");
    assert!(seen[20..].iter().all(|&p| p == 0), "{seen:?}");
    let sum = a.agreement_summary().unwrap();
    assert!(sum.contains("deciding from epoch 7"), "{sum}");
}

#[test]
fn ranks_with_another_agreement_setting_have_no_opinion_from_the_same_collective() {
    let l = load("differ");
    let a = TunerContext::for_programs(
        0x7702,
        2,
        2,
        l.slot,
        &setting(&l, 4, 2, Duration::from_secs(10)),
        history(),
    );
    let b = TunerContext::for_programs(
        0x7702,
        2,
        2,
        l.slot,
        &setting(&l, 4, 3, Duration::from_secs(10)),
        history(),
    );
    map(&l, "limit")
        .update(&0u32.to_le_bytes(), &1u64.to_le_bytes(), 0)
        .unwrap();
    for i in 1..=40u64 {
        add(map(&l, "lat"), 0, 1000);
        assert_eq!((proto(&a), proto(&b)), (-1, -1), "seq {i}");
    }
    for c in [&a, &b] {
        assert!(c.agreement_summary().unwrap().contains("ranks differ"));
    }
}

#[test]
fn a_rank_that_hears_from_no_one_fails_at_the_first_agreement_and_after() {
    let l = load("alone");
    let a = TunerContext::for_programs(
        0x7703,
        2,
        2,
        l.slot,
        &setting(&l, 4, 2, Duration::from_millis(300)),
        history(),
    );
    for _ in 1..=8 {
        proto(&a);
        assert!(!a.failed());
    }
    let t = std::time::Instant::now();
    proto(&a);
    assert!(a.failed(), "seq 9 needs epoch 0");
    assert!(t.elapsed() >= Duration::from_millis(300));
    proto(&a);
    assert!(a.failed(), "and stays failed");
    assert!(a.agreement_summary().unwrap().contains("failed"));
}

fn set_limit(l: &Loaded, v: u64) {
    map(l, "limit")
        .update(&0u32.to_le_bytes(), &v.to_le_bytes(), 0)
        .unwrap();
}

/// A staged config update takes effect at the stated decision of each context, whatever else
/// changes the process-wide map: both ranks see the new limit from seq 30 on, decide alike, and
/// their records (whose configuration digest changes with it) still agree.
#[test]
fn a_staged_config_update_takes_effect_at_the_same_decision_on_every_rank() {
    let l = load("config");
    set_limit(&l, 1_000_000);
    let h = history();
    let s = setting(&l, 4, 2, Duration::from_secs(10));
    let a = TunerContext::for_programs(0x7704, 2, 2, l.slot, &s, h);
    let b = TunerContext::for_programs(0x7704, 2, 2, l.slot, &s, h);
    let up = ConfigUpdate {
        map: "limit".into(),
        values: vec![(0, 100)],
    };
    // Too near for a context that is already at its first decision? No: both are at 0.
    h.stage_config(70, up.clone(), "test").unwrap();
    // Writing the process-wide map directly changes nothing a context sees.
    set_limit(&l, 1);
    let mut seen = Vec::new();
    for i in 1..=120u64 {
        add(map(&l, "lat"), 0, 1000);
        let (pa, pb) = (proto(&a), proto(&b));
        assert_eq!(pa, pb, "seq {i}");
        seen.push(pa);
    }
    // The limit is 100 from seq 70 on: epochs applied from 73 (epoch 16, seq 65-68, made
    // before the update but combined after it) are over, twice in a row from seq 77.
    assert!(seen[..76].iter().all(|&p| p == -1), "{seen:?}");
    assert!(seen[76..].iter().all(|&p| p == 0), "{seen:?}");
    assert!(
        a.agreement_summary()
            .unwrap()
            .contains("deciding from epoch")
    );
    // A config update is refused for a map the program does not have, or that is not a
    // stageable config map, and for a start a context has passed.
    let prog = l.slot.current();
    let bad = |map: &str| ConfigUpdate {
        map: map.into(),
        values: vec![(0, 1)],
    };
    assert!(ncclbpf_tuner::agree::check_config(&prog, &bad("nope")).is_err());
    assert!(ncclbpf_tuner::agree::check_config(&prog, &bad("lat")).is_err());
    let e = ncclbpf_tuner::agree::check_config(
        &prog,
        &ConfigUpdate {
            map: "limit".into(),
            values: vec![(1, 1)],
        },
    )
    .unwrap_err();
    assert!(e.contains("no entry 1"), "{e}");
    let e = ncclbpf_tuner::agree::check_config(
        &prog,
        &ConfigUpdate {
            map: "limit".into(),
            values: vec![(0, 1), (0, 2)],
        },
    )
    .unwrap_err();
    assert!(e.contains("entry 0 given twice"), "{e}");
    assert!(
        h.stage_config(100, up, "test")
            .unwrap_err()
            .to_string()
            .contains("too late")
    );
}

/// Contexts that read the process-wide config maps (no agreement, so no views) refuse staged
/// config updates: new values would reach every communicator of the process at once.
#[test]
fn staged_config_updates_are_refused_while_a_context_keeps_no_views() {
    let l = load("noviews");
    let h = history();
    let off = Setting {
        mode: Mode::Off,
        ..setting(&l, 4, 2, Duration::from_secs(1))
    };
    let plain = TunerContext::for_programs(0x7705, 2, 2, l.slot, &off, h);
    let e = h
        .stage_config(
            500,
            ConfigUpdate {
                map: "limit".into(),
                values: vec![(0, 5)],
            },
            "test",
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("0x0000000000007705") && e.contains("NCCL_BPF_AGREEMENT=on"),
        "{e}"
    );
    drop(plain);
}

/// Two contexts of one communicator in one process (one per GPU), one (D−1)·K decisions ahead
/// of the other, D = 11: the board keeps every epoch the slower one still needs (it used to drop
/// epochs 8 below the faster one's, and the slower one failed at seq 12).
#[test]
fn a_lagging_context_of_the_same_communicator_still_finds_its_epochs() {
    let l = load("lag");
    let s = setting(&l, 1, 11, Duration::from_millis(500));
    let h = history();
    let a = TunerContext::for_programs(0x7711, 2, 2, l.slot, &s, h);
    let b = TunerContext::for_programs(0x7711, 2, 2, l.slot, &s, h);
    for _ in 1..=10 {
        proto(&a);
    }
    for i in 1..=40u64 {
        proto(&b);
        assert!(
            !b.failed(),
            "b failed at seq {i}: {}",
            b.agreement_summary().unwrap()
        );
        proto(&a);
        assert!(!a.failed(), "a failed at seq {}", i + 10);
    }
}

/// A communicator made after another one already applied a staged config update starts from
/// the object's contents, not from the view the other installed: its ranks, made at different
/// moments of the other communicator's progress, agree.
#[test]
fn a_new_communicators_configuration_does_not_depend_on_another_communicators_progress() {
    let l = load("newview");
    set_limit(&l, 1_000_000);
    let h = history();
    let s = setting(&l, 4, 2, Duration::from_secs(5));
    let xa = TunerContext::for_programs(0x7731, 2, 2, l.slot, &s, h);
    let xb = TunerContext::for_programs(0x7731, 2, 2, l.slot, &s, h);
    h.stage_config(
        90,
        ConfigUpdate {
            map: "limit".into(),
            values: vec![(0, 100)],
        },
        "test",
    )
    .unwrap();
    for _ in 1..=85 {
        proto(&xa);
        proto(&xb);
    }
    // Rank a is further on in X when it makes Y (X's update applied, its view installed); rank
    // b makes Y right after X's seq 86 (without the update yet).
    for _ in 86..=90 {
        proto(&xa);
    }
    let ya = TunerContext::for_programs(0x7732, 2, 2, l.slot, &s, h);
    proto(&xb);
    let yb = TunerContext::for_programs(0x7732, 2, 2, l.slot, &s, h);
    for i in 1..=20u64 {
        assert_eq!(proto(&ya), proto(&yb), "seq {i}");
    }
    let sum = ya.agreement_summary().unwrap();
    assert!(sum.contains("deciding from epoch"), "{sum}");
}

/// The agreement words of a context's record, as `ncclbpf exporter` reads them.
fn words(c: &TunerContext) -> ncclbpf_tuner::sequence::AgreementWords {
    c.sequence()
        .snapshot(0, 0)
        .unwrap()
        .agreement
        .expect("not changing: one thread decides")
}

/// The published agreement words follow the context through its states: starting (posting,
/// no epoch applied), deciding from epoch e (D behind the current epoch), waiting for an
/// epoch (since a moment ago, seen from another thread while the decision waits), stopped.
#[test]
fn the_agreement_words_follow_the_states() {
    use ncclbpf_tuner::sequence::{NO_EPOCH, agreement_state as st};
    let l = load("words");
    set_limit(&l, 100);
    let s = setting(&l, 4, 2, Duration::from_secs(10));
    let a = TunerContext::for_programs(0x7710, 2, 2, l.slot, &s, history());
    let b = TunerContext::for_programs(0x7710, 2, 2, l.slot, &s, history());
    let w = words(&a);
    assert_eq!(
        (w.state, w.used, w.current, w.waiting_for, w.epoch, w.delay),
        (st::STARTING, NO_EPOCH, 0, NO_EPOCH, 4, 2)
    );
    // Seq 5 posts epoch 0 (seq 1-4); nothing to apply before epoch D = 2 is posted.
    for _ in 1..=5 {
        proto(&a);
        proto(&b);
    }
    let w = words(&a);
    assert_eq!((w.state, w.used, w.current), (st::STARTING, NO_EPOCH, 1));
    for _ in 6..=40 {
        proto(&a);
        proto(&b);
    }
    // Seq 37 posted epoch 8 (epoch 9 is current) and applied epoch 7 (as the summary says).
    assert!(
        a.agreement_summary()
            .unwrap()
            .contains("deciding from epoch 7")
    );
    for c in [&a, &b] {
        let w = words(c);
        assert_eq!(
            (
                w.state,
                w.used,
                w.current,
                w.waiting_for,
                w.waiting_since_ns
            ),
            (st::DECIDING, 7, 9, NO_EPOCH, 0)
        );
        assert_eq!(w.current - w.used, 2, "the lag: D");
    }
    // A context whose peer never comes: waiting for epoch 0 at seq 9, then stopped.
    let alone = TunerContext::for_programs(
        0x7711,
        2,
        2,
        l.slot,
        &setting(&l, 4, 2, Duration::from_millis(1500)),
        history(),
    );
    for _ in 1..=8 {
        proto(&alone);
    }
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    std::thread::scope(|t| {
        let h = t.spawn(|| proto(&alone));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let w = loop {
            let snap = alone.sequence().snapshot(0, 0).unwrap();
            if let Some(w) = snap.agreement
                && w.state == st::WAITING
            {
                break w;
            }
            assert!(std::time::Instant::now() < deadline, "never waiting");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!((w.waiting_for, w.current, w.used), (0, 2, NO_EPOCH));
        assert!(
            w.waiting_since_ns >= before - 1_000_000
                && w.waiting_since_ns <= before + 1_000_000_000,
            "{} vs {before}",
            w.waiting_since_ns
        );
        h.join().unwrap();
    });
    assert!(alone.failed());
    let w = words(&alone);
    assert_eq!(
        (w.state, w.waiting_for, w.waiting_since_ns, w.current),
        (st::STOPPED, NO_EPOCH, 0, 2)
    );
}
