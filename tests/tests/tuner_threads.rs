//! Several threads calling `getCollInfo` on one tuner context at once, through the library's
//! `ncclTunerPlugin_v5` as NCCL would (the ABI does not promise one thread per context): every
//! decision is the policy's, and the finalize summary, like the policy's own map, counts every
//! call. The policy is read from the environment once per process, so each case re-runs this
//! test binary with `NCCL_BPF_TUNER_POLICY` set (JIT and interpreter).
//!
//! Threads that take turns on one context (NCCL's non-blocking communicators decide on a thread
//! per group) hand over the lock each turn: the thread that called in long runs owned it (no
//! locked instruction), the next one revoked it; no call falls outside the sequence.

use ncclbpf_harness::Tuner;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Barrier;

const CHILD: &str = "NCCLBPF_TUNER_THREADS_CHILD";
const THREADS: usize = 4;
const CALLS: usize = 20_000;
const KIB: usize = 1024;
const NUM_ALGO: usize = 7;
const NUM_PROTO: usize = 3;

/// A message size and what `size_aware` makes of it with [`costs`].
struct Case {
    bytes: usize,
    /// The (algo, proto) NCCL then picks.
    picked: (usize, usize),
    nchannels: i32,
    /// The policy's answer (algo, proto), as the finalize summary counts it.
    answer: (i32, i32),
    /// The key of size_aware's own `tuner_decisions` map it counts under.
    key: usize,
}

const fn case(bytes: usize, picked: (usize, usize), answer: (i32, i32), key: usize) -> Case {
    Case {
        bytes,
        picked,
        nchannels: 0,
        answer,
        key,
    }
}

/// Sizes around `size_aware`'s thresholds (16 KiB from 4 nodes: Tree/LL; 4 MiB: Tree/Simple,
/// then Ring/Simple), for a communicator of 8 ranks on 4 nodes.
const CASES: [Case; 6] = [
    case(8, (0, 0), (0, 0), 0),
    case(16 * KIB, (0, 0), (0, 0), 0),
    case(16 * KIB + 1, (0, 2), (0, 2), 1),
    case(4 << 20, (0, 2), (0, 2), 1),
    case((4 << 20) + 1, (1, 2), (1, 2), 2),
    case(1 << 30, (1, 2), (1, 2), 2),
];

/// NCCL-like costs: every combination usable, Simple cheapest, then LL128, then LL; Tree
/// cheapest of the algorithms.
fn costs() -> Vec<f32> {
    (0..NUM_ALGO * NUM_PROTO)
        .map(|i| 10.0 + (i / NUM_PROTO) as f32 + (NUM_PROTO - 1 - i % NUM_PROTO) as f32)
        .collect()
}

fn policy() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies/src/size_aware.o");
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

struct Shared(Tuner);
// SAFETY: `Tuner::coll_info` only reads the harness's table pointer and context; calling the
// library's getCollInfo on one context from several threads at once is what this test checks
// the library allows.
unsafe impl Sync for Shared {}

/// Runs test `name` of this binary again as a child with the policy (JIT, then interpreter);
/// its output must say `done`.
fn in_children(name: &str, done: &str) {
    for jit in ["1", "0"] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("NCCL_BPF_TUNER_POLICY", policy())
            .env("NCCL_BPF_JIT", jit)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "NCCL_BPF_JIT={jit}:\n{text}");
        assert!(text.contains(done), "NCCL_BPF_JIT={jit}:\n{text}");
    }
}

#[test]
fn concurrent_calls_on_one_context() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    in_children(
        "concurrent_calls_on_one_context",
        "every call decided and counted",
    );
}

#[test]
fn threads_taking_turns_keep_every_call_in_the_sequence() {
    if std::env::var_os(CHILD).is_none() {
        return in_children(
            "threads_taking_turns_keep_every_call_in_the_sequence",
            "every turn sequenced",
        );
    }
    const TURNS: usize = 12;
    // Long turns (the thread becomes the owner) and short ones (it never does).
    let turn_calls = |turn: usize| if turn % 3 == 2 { 3 } else { 500 };
    let tuner = Shared(Tuner::open(Some(5), 8, 4).unwrap());
    let costs = costs();
    let turn = std::sync::Mutex::new(0usize);
    let moved = std::sync::Condvar::new();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (tuner, costs, turn, moved) = (&tuner, &costs, &turn, &moved);
            s.spawn(move || {
                loop {
                    let mut now = turn.lock().unwrap();
                    while *now < TURNS && *now % THREADS != t {
                        now = moved.wait(now).unwrap();
                    }
                    if *now >= TURNS {
                        return;
                    }
                    for i in 0..turn_calls(*now) {
                        let w = &CASES[(i + t) % CASES.len()];
                        let c = tuner
                            .0
                            .coll_info(w.bytes, costs, NUM_ALGO, NUM_PROTO)
                            .unwrap();
                        assert_eq!(c.picked(NUM_PROTO), Some(w.picked), "{} B", w.bytes);
                    }
                    *now += 1;
                    moved.notify_all();
                }
            });
        }
    });
    let mut tuner = tuner.0;
    tuner.finalize().unwrap();
    let calls: usize = (0..TURNS).map(turn_calls).sum();
    let log = ncclbpf_harness::log_text();
    let digest = log
        .lines()
        .find_map(|l| l.split_once("decision digest of comm ").map(|(_, s)| s))
        .unwrap_or_else(|| panic!("no digest line at finalize:\n{log}"));
    assert!(
        digest.starts_with(&format!("0x0000000000c0ffee: seq {calls}, digest ")),
        "{digest}"
    );
    assert!(!digest.contains("outside the sequence"), "{digest}");
    println!("every turn sequenced: {digest}");
}

fn child() {
    let tuner = Shared(Tuner::open(Some(5), 8, 4).unwrap());
    let costs = costs();
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (tuner, costs, start) = (&tuner, &costs, &start);
            s.spawn(move || {
                start.wait();
                for i in 0..CALLS {
                    let w = &CASES[(i + t) % CASES.len()];
                    let bytes = w.bytes;
                    let c = tuner
                        .0
                        .coll_info(bytes, costs, NUM_ALGO, NUM_PROTO)
                        .unwrap();
                    assert_eq!(c.picked(NUM_PROTO), Some(w.picked), "{bytes} B");
                    assert_eq!(c.nchannels, w.nchannels, "{bytes} B");
                    let changed = c.table.iter().zip(costs).filter(|(x, y)| x != y).count();
                    assert_eq!(changed, 1, "{bytes} B: one entry lowered");
                }
            });
        }
    });
    let mut tuner = tuner.0;
    tuner.finalize().unwrap();

    // Calls per answer, and per size_aware's own map key (0 small, 1 medium, 2 large).
    let mut per_answer = std::collections::BTreeMap::<(i32, i32), u64>::new();
    let mut per_key = [0u64; 3];
    for t in 0..THREADS {
        for i in 0..CALLS {
            let c = &CASES[(i + t) % CASES.len()];
            *per_answer.entry(c.answer).or_default() += 1;
            per_key[c.key] += 1;
        }
    }
    let want = per_answer
        .iter()
        .map(|((a, p), n)| format!("algo {a} proto {p}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let log = ncclbpf_harness::log_text();
    let summary = log
        .lines()
        .find_map(|l| l.split_once("TUNER/BPF comm ").map(|(_, s)| s))
        .unwrap_or_else(|| panic!("no summary at finalize:\n{log}"));
    assert_eq!(summary, format!("0x0000000000c0ffee: {want}"), "{log}");

    let views = shared_maps::MapView::open_all(std::process::id()).unwrap();
    let map = views
        .iter()
        .find(|v| v.name == "tuner_decisions")
        .expect("size_aware's tuner_decisions map");
    let mut seen = [0u64; 3];
    for (k, vals) in map.entries() {
        let key = u32::from_le_bytes(k[..4].try_into().unwrap()) as usize;
        seen[key] = u64::from_le_bytes(vals[0][..8].try_into().unwrap());
    }
    assert_eq!(
        seen, per_key,
        "the policy's own counts (atomic adds in BPF)"
    );
    println!("every call decided and counted: {summary}");
}
