//! The tuner in the same library, driven through every tuner ABI version as NCCL drives it.
//! Each case runs in its own process because the policy is read from the environment once.

use std::path::PathBuf;
use std::process::Command;

const RANK_BIN: &str = env!("CARGO_BIN_EXE_harness-rank");

fn policy(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(rel);
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

/// One decision line: `(bytes, algo, proto, nchannels, table entries changed)`.
type Row = (u64, u64, u64, i64, u64);

/// The decision lines and the whole output of `harness-rank tune`.
fn tune(version: u32, policy: Option<PathBuf>) -> (Vec<Row>, String) {
    let env: Vec<(&str, std::ffi::OsString)> = policy
        .map(|p| ("NCCL_BPF_TUNER_POLICY", p.into_os_string()))
        .into_iter()
        .collect();
    tune_env(version, &env)
}

/// `harness-rank tune` with these settings.
fn tune_env(version: u32, env: &[(&str, std::ffi::OsString)]) -> (Vec<Row>, String) {
    let mut cmd = Command::new(RANK_BIN);
    cmd.args(["tune", &version.to_string(), "4", "2"]);
    cmd.envs(env.iter().map(|(k, v)| (*k, v)));
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows = text
        .lines()
        .filter(|l| l.starts_with("decision "))
        .map(|l| {
            let v: Vec<i64> = l
                .split_whitespace()
                .skip(1)
                .map(|kv| kv.split('=').nth(1).unwrap().parse().unwrap())
                .collect();
            (v[0] as u64, v[1] as u64, v[2] as u64, v[3], v[4] as u64)
        })
        .collect();
    (rows, text)
}

const KIB: u64 = 1024;

#[test]
fn without_a_policy_nccls_table_is_untouched() {
    for v in [6, 5, 4, 3, 2] {
        let (rows, _) = tune(v, None);
        assert_eq!(rows.len(), 5);
        for (bytes, algo, proto, nch, changed) in rows {
            assert_eq!(
                (algo, proto, nch, changed),
                (0, 2, 0, 0),
                "v{v} {bytes} B: NCCL's own choice"
            );
        }
    }
}

/// size_aware's defaults (from the GPU sweep): Tree/Simple up to 4 MiB, Ring/Simple above; on
/// 2 nodes (this call) never LL. Full pairs, so v2 follows it too; channels stay NCCL's.
#[test]
fn size_aware_policy_steers_every_version() {
    for v in [6, 5, 4, 3, 2] {
        let (rows, text) = tune(v, Some(policy("src/size_aware.o")));
        let picked: Vec<_> = rows.iter().map(|r| (r.0, r.1, r.2, r.3)).collect();
        assert_eq!(
            picked,
            [
                (KIB, 0, 2, 0),
                (64 * KIB, 0, 2, 0),
                (1024 * KIB, 0, 2, 0),
                (16 << 20, 1, 2, 0),
                (256 << 20, 1, 2, 0)
            ],
            "v{v}:\n{text}"
        );
        if v >= 3 {
            assert!(
                rows.iter().all(|r| r.4 == 1),
                "exactly one entry lowered per decision"
            );
        }
        assert!(text.contains("policy 'size_aware'"), "{text}");
    }
}

#[test]
fn rejected_policy_leaves_nccl_in_charge() {
    let (rows, text) = tune(6, Some(policy("unsafe/div_by_zero.o")));
    assert!(rows.iter().all(|r| (r.1, r.2, r.4) == (0, 2, 0)), "{text}");
    assert!(
        text.contains("tuner policy not loaded") && text.contains("division or modulo by R1"),
        "{text}"
    );
    let (rows, text) = tune(6, Some(policy("src/net_stats.o")));
    assert!(rows.iter().all(|r| r.4 == 0));
    assert!(text.contains("no program in a 'tuner' section"), "{text}");
}

#[test]
fn noop_policy_runs_and_leaves_every_choice_to_nccl() {
    for v in [6, 5, 4, 3, 2] {
        let (rows, text) = tune(v, Some(policy("src/noop.o")));
        assert_eq!(rows.len(), 5);
        assert!(
            rows.iter().all(|r| (r.1, r.2, r.3, r.4) == (0, 2, 0, 0)),
            "v{v}: NCCL's own choice everywhere:\n{text}"
        );
        assert!(text.contains("policy 'noop'"), "{text}");
        // It did run: every call is counted as "no choice" in the summary.
        assert!(text.contains("algo -1 proto -1 (not applied): 5"), "{text}");
    }
}

#[test]
fn bad_channels_policy_forces_ring_ll_on_one_channel_in_every_version() {
    for v in [6, 5, 4, 3, 2] {
        let (rows, text) = tune(v, Some(policy("src/bad_channels.o")));
        assert_eq!(rows.len(), 5);
        assert!(
            rows.iter()
                .all(|r| (r.1, r.2, r.3, r.4) == (1, 0, 1, u64::from(v >= 3))),
            "v{v}: Ring, LL, one channel (one entry lowered from v3 on):\n{text}"
        );
    }
}

/// `NCCL_BPF_POLICY` lists objects: the tuner takes the `tuner` program of whichever has one
/// (net_stats has none, and is not an error there), the first listed wins.
#[test]
fn one_policy_setting_feeds_the_tuner_too() {
    let list = format!(
        "{},{},{}",
        policy("src/net_stats.o").display(),
        policy("src/size_aware.o").display(),
        policy("src/bad_channels.o").display()
    );
    let (rows, text) = tune_env(6, &[("NCCL_BPF_POLICY", list.into())]);
    assert!(text.contains("policy 'size_aware'"), "{text}");
    assert!(!text.contains("no program in a 'tuner' section"), "{text}");
    assert_eq!(rows[4].1, 1, "size_aware's ring for 256 MiB:\n{text}");
    assert!(
        rows.iter().all(|r| r.3 == 0),
        "bad_channels, listed later, is not used"
    );
    // NCCL_BPF_TUNER_PROGRAM picks by name across the list.
    let list = format!(
        "{},{}",
        policy("src/size_aware.o").display(),
        policy("src/bad_channels.o").display()
    );
    let (rows, text) = tune_env(
        6,
        &[
            ("NCCL_BPF_POLICY", list.into()),
            ("NCCL_BPF_TUNER_PROGRAM", "bad_channels".into()),
        ],
    );
    assert!(rows.iter().all(|r| r.3 == 1), "{text}");
}

/// `constants V` or `chunk` of harness-rank with these settings: (changed lines, whole output).
fn rank_mode(args: &[&str], env: &[(&str, std::ffi::OsString)]) -> (Vec<String>, String) {
    let out = Command::new(RANK_BIN)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines = text
        .lines()
        .filter(|l| l.starts_with("constant ") || l.starts_with("chunk "))
        .map(String::from)
        .collect();
    (lines, text)
}

/// `tuner/init` through tuner ABI v5 and v6: uniform_constants rewrites exactly the
/// CPU-dependent entries (NCCL's layout: hw_latencies[PCI][TREE|RING][SIMPLE] are 44 and 47,
/// ll_max_bws[0|1][1|2] are 85, 86, 88, 89); values outside [0, 1e6] are refused and NCCL's
/// kept, with a warning; v2-v4 have no constants and run nothing.
#[test]
fn tuner_init_corrects_nccls_constants_within_range() {
    for v in ["5", "6"] {
        let (lines, text) = rank_mode(
            &["constants", v],
            &[("NCCL_BPF_POLICY", policy("src/uniform_constants.o").into())],
        );
        assert_eq!(
            lines,
            [
                "constant 44 44.5 -> 5.7",
                "constant 47 47.5 -> 5.7",
                "constant 85 85.5 -> 22.5",
                "constant 86 86.5 -> 19",
                "constant 88 88.5 -> 22.5",
                "constant 89 89.5 -> 19",
            ],
            "v{v}:\n{text}"
        );
        assert!(
            text.contains("tuner/init 'uniform_constants': 6 constant(s) changed"),
            "{text}"
        );
    }
    let (lines, text) = rank_mode(
        &["constants", "5"],
        &[("NCCL_BPF_POLICY", policy("safe/init_bad_values.o").into())],
    );
    // base_latencies[RING][SIMPLE] is entry 5.
    assert_eq!(lines, ["constant 5 5.5 -> 2"], "{text}");
    assert!(
        text.contains("3 refused (not a finite number in [0, 1000000])")
            && text.contains("base_latencies[0][0] = NaN")
            && text.contains("hw_latencies[2][1][0] = -1")
            && text.contains("ll_max_bws[2][0] = 1000000000"),
        "{text}"
    );
}

/// `getChunkSize` (v6): chunk_double doubles Simple chunks of 64 MiB and more, leaves the rest,
/// and its request of 8 bytes for LL (under LL's 16-byte grain) is refused: NCCL's kept.
#[test]
fn tuner_chunk_sizes_through_get_chunk_size() {
    let (lines, text) = rank_mode(
        &["chunk"],
        &[("NCCL_BPF_POLICY", policy("safe/chunk_double.o").into())],
    );
    assert_eq!(
        lines,
        [
            "chunk proto=2 bytes=134217728 in=524288 out=1048576",
            "chunk proto=2 bytes=1048576 in=131072 out=131072",
            "chunk proto=0 bytes=1024 in=4096 out=4096",
            "chunk proto=1 bytes=67108864 in=122880 out=122880",
        ],
        "{text}"
    );
    assert!(text.contains("chunk size 8 refused"), "{text}");
    assert!(text.contains("chunk sizes: 1 changed, 1 refused"), "{text}");
    // Without a chunk program NCCL's chunk is untouched.
    let (lines, _) = rank_mode(&["chunk"], &[]);
    assert!(lines.iter().all(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f[3].trim_start_matches("in=") == f[4].trim_start_matches("out=")
    }));
}
