//! `bench/gpu/tuner_sweep.py`, the GPU sweep of every algorithm, protocol and channel count in one
//! job, writes rules files that the tuner must accept: checked here with `ncclbpf rules check`,
//! on its sweep file and on a rules file it derives from made-up results.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ncclbpf");

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/gpu/tuner_sweep.py")
}

fn python(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("python3 runs (the GPU scripts need it)");
    assert!(
        out.status.success(),
        "tuner_sweep.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A field that may say "any" (`-1` in the file, `null` in the JSON) as -1.
fn any(v: &Value) -> i64 {
    v.as_i64().unwrap_or(-1)
}

/// `ncclbpf rules check --json FILE`: the rules the tuner would install.
fn rules(file: &Path) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["rules", "check", "--json", file.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {text}{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&text).unwrap();
    v["rules"].as_array().unwrap().clone()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-sweep-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The combinations in the script's order at a size under 4 MiB: NCCL's choice, then algorithm
/// (tree, ring) x protocol (ll, simple) x channels (1, 2, all).
const COMBOS: usize = 1 + 2 * 2 * 3;

#[test]
fn the_sweep_pins_each_combination_to_its_own_size() {
    let dir = tmp("conf");
    let env = python(&[
        "conf",
        "t",
        "--build",
        dir.to_str().unwrap(),
        "--sizes",
        "8,65536,4194304",
        "--decode",
        "16384",
    ]);
    let sizes: Vec<u64> = env
        .lines()
        .find_map(|l| l.strip_prefix("SIZES='"))
        .unwrap()
        .trim_end_matches('\'')
        .split(' ')
        .map(|s| s.parse().unwrap())
        .collect();
    // Warm-up first (one per algorithm and protocol at the smallest size), then every tag.
    assert_eq!(&sizes[..4], &[8 + 4 * 3, 8 + 4 * 6, 8 + 4 * 9, 8 + 4 * 12]);
    // 4 MiB and up leaves LL out: NCCL's choice + 2 algorithms x simple x 3 channel counts.
    assert_eq!(sizes.len(), 4 + COMBOS + COMBOS + 7);
    let r = rules(&dir.join("t.conf"));
    // Every tag but NCCL's choice is pinned, once: 2 x 12 + 6 + the decode size's 12.
    assert_eq!(r.len(), 2 * (COMBOS - 1) + 6 + (COMBOS - 1), "{r:?}");
    for rule in &r {
        assert_eq!(rule["min_bytes"], rule["max_bytes"], "{rule}");
        assert_eq!(rule["collective"], "allreduce");
    }
    // Combination 4 at 64 KiB: tree, simple, one channel.
    let k4 = r.iter().find(|x| x["min_bytes"] == 65536 + 16).unwrap();
    assert_eq!(
        (
            k4["algorithm"].as_str(),
            k4["protocol"].as_str(),
            k4["channels"].as_i64()
        ),
        (Some("tree"), Some("simple"), Some(1)),
        "{k4}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn derived_rules_load_and_keep_only_clear_gains() {
    let dir = tmp("rules");
    let mut lines = String::new();
    // 2 ranks. At 64 KiB combination 7 (ring, ll, one channel) takes half NCCL's time; at 8 B
    // the best other is only 5 % faster: no rule there. Decode at 16 KiB: combination 12 (ring,
    // simple, all channels) at 0.6. Round 2 stalled during combination 7 at 64 KiB (6x): with two
    // rounds the best counts, so the stall must not hide the gain.
    for round in [1, 2] {
        for k in 0..COMBOS {
            let stall = if round == 2 && k == 7 { 6.0 } else { 1.0 };
            let us8 = if k == 2 { 95.0 } else { 100.0 };
            let us64 = if k == 7 { 50.0 * stall } else { 100.0 };
            let ms16 = if k == 12 { 6.0 } else { 10.0 };
            lines += &format!(
                "RESULT arm=x ranks=2 round={round} coll=all_reduce size={} bytes=1 iters=9 us={} algbw=1 busbw=1 checks=1 bad=0\n",
                8 + 4 * k,
                us8
            );
            lines += &format!(
                "RESULT arm=x ranks=2 round={round} coll=all_reduce size={} bytes=1 iters=9 us={} algbw=1 busbw=1 checks=1 bad=0\n",
                65536 + 4 * k,
                us64
            );
            lines += &format!(
                "DECODE arm=x ranks=2 round={round} size={} per=160 tokens=5 ms_median={} ms_min=1 ms_max=1 checks=1 bad=0\n",
                16384 + 4 * k,
                ms16
            );
        }
    }
    let results = dir.join("results.txt");
    std::fs::write(&results, lines).unwrap();
    let out = python(&[
        "rules",
        results.to_str().unwrap(),
        "--arm",
        "x",
        "--sizes",
        "8,65536",
        "--decode",
        "16384",
    ]);
    let conf = dir.join("derived.conf");
    std::fs::write(&conf, &out).unwrap();
    let r = rules(&conf);
    assert_eq!(r.len(), 2, "{out}");
    // Bands meet halfway (geometrically) between the measured sizes: 8 | 362 | 16384 | 32768 | 65536.
    let (dec, big) = (&r[0], &r[1]);
    assert_eq!(
        (dec["min_bytes"].as_u64(), dec["max_bytes"].as_u64()),
        (Some(363), Some(32768)),
        "{out}"
    );
    assert_eq!(
        (
            dec["algorithm"].as_str(),
            dec["protocol"].as_str(),
            any(&dec["channels"])
        ),
        (Some("ring"), Some("simple"), -1)
    );
    assert_eq!(big["min_bytes"].as_u64(), Some(32769));
    assert_eq!(any(&big["max_bytes"]), -1, "{big}");
    assert_eq!(
        (
            big["algorithm"].as_str(),
            big["protocol"].as_str(),
            big["channels"].as_i64(),
            big["nranks"].as_i64()
        ),
        (Some("ring"), Some("ll"), Some(1), Some(2))
    );
    assert!(
        out.contains("# 2 ranks, 8 B: NCCL's choice (best other 0.95)"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
