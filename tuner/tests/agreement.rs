//! The agreement, tuner side, in one process: two tuner contexts of one two-rank communicator
//! stand for the two ranks (they share the process's exchange, so each one's record reaches
//! the other without a network). `policies/safe/epoch_state.c`: the epoch program counts epochs
//! whose agreed latency (the ranks' maximum) is over a config limit; the tuner program picks LL
//! after two in a row.

use ncclbpf_agreement::Params;
use ncclbpf_tuner::agree::{Mode, Setting};
use ncclbpf_tuner::ffi::TunerContext;
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
    let a = TunerContext::for_programs(0x7701, 2, 2, l.slot, &s);
    let b = TunerContext::for_programs(0x7701, 2, 2, l.slot, &s);
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
    );
    let b = TunerContext::for_programs(
        0x7702,
        2,
        2,
        l.slot,
        &setting(&l, 4, 3, Duration::from_secs(10)),
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
