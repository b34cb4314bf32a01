//! The `ncclbpf` command against real policy objects and a real process's maps: help texts,
//! exit statuses, JSON output, a tuner policy's decisions, a closed standard output.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ncclbpf");

/// A policy object built by policies/build.sh.
fn policy(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(rel);
    assert!(
        p.exists(),
        "{} missing: run policies/build.sh (it compiles the policies with clang)",
        p.display()
    );
    p
}

fn source(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../policies")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn run(args: &[&str]) -> (i32, String, String) {
    run_env(args, &[])
}

fn run_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> Value {
    let (code, out, err) = run(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn every_subcommand_has_help_with_examples_and_exit_statuses() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for word in [
        "verify",
        "inspect",
        "disasm",
        "decisions",
        "maps",
        "Exit status:",
    ] {
        assert!(out.contains(word), "{word}: {out}");
    }
    for cmd in ["verify", "inspect", "disasm", "decisions", "maps"] {
        let (code, out, err) = run(&[cmd, "--help"]);
        assert_eq!(code, 0, "{cmd}: {err}");
        let example = format!("  ncclbpf {cmd} ");
        assert!(
            out.contains("Usage: ncclbpf")
                && out.contains("Examples:")
                && out.contains(&example)
                && out.contains("Exit status:")
                && out.contains("  0  ")
                && out.contains("  2  ")
                && out.contains("--json"),
            "{cmd} --help: {out}"
        );
        let (code, again, _) = run(&["help", cmd]);
        assert_eq!((code, &again), (0, &out), "help {cmd}");
    }
    let (code, out, _) = run(&["decisions", "--help"]);
    assert_eq!(code, 0);
    for word in [
        "--coll",
        "--ranks",
        "--nodes",
        "--sizes",
        "--program",
        "NCCL's choice",
    ] {
        assert!(out.contains(word), "{word}: {out}");
    }
}

#[test]
fn exit_statuses() {
    let good = policy("src/net_stats.o");
    let bad = policy("unsafe/null_deref.o");
    let garbage =
        std::env::temp_dir().join(format!("ncclbpf-cli-{}-garbage.o", std::process::id()));
    std::fs::write(&garbage, b"not an ELF object").unwrap();
    let cases: &[(&[&str], i32)] = &[
        (&["verify", s(&good)], 0),
        (&["inspect", s(&good)], 0),
        (&["disasm", s(&good)], 0),
        (&["verify", s(&bad)], 1),
        (&["verify", "--json", s(&bad)], 1),
        // An object that is not one is bad, as a rejected program is.
        (&["verify", s(&garbage)], 1),
        (&["inspect", s(&garbage)], 1),
        (&["decisions", s(&garbage)], 1),
        (&["decisions", s(&bad)], 1),
        // Missing files, programs, processes; bad arguments.
        (&["verify", "/nonexistent.o"], 2),
        (&["inspect", "/nonexistent.o"], 2),
        (&["decisions", "/nonexistent.o"], 2),
        (&["verify", s(&good), "--program", "nope"], 2),
        (&["decisions", s(&good)], 2),
        (&["decisions", s(&good), "--program", "on_close"], 2),
        (&["maps", "999999999"], 2),
        (&[], 2),
        (&["verify"], 2),
        (&["frobnicate"], 2),
        (&["verify", s(&good), "--bogus"], 2),
        (&["maps", "not-a-pid"], 2),
        (&["decisions", s(&good), "--sizes", "4KB"], 2),
        (&["decisions", s(&good), "--sizes", "4G..8"], 2),
        (&["decisions", s(&good), "--coll", "allreduce,alltoall"], 2),
        (&["decisions", s(&good), "--ranks", "2", "--nodes", "4"], 2),
    ];
    for (args, want) in cases {
        let (code, out, err) = run(args);
        assert_eq!(code, *want, "{args:?}\nstdout: {out}\nstderr: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        if *want == 2 && !args.is_empty() {
            assert!(!err.is_empty(), "{args:?}: a usage error says why");
        }
    }
    std::fs::remove_file(&garbage).unwrap();
}

#[test]
fn verify_accepts_and_rejects_with_the_reason() {
    let p = policy("src/net_stats.o");
    let (code, out, _) = run(&["verify", s(&p)]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("on_complete (net/complete): accepted")
            && out.contains("on_close (net/close): accepted"),
        "{out}"
    );
    let bad = policy("unsafe/null_deref.o");
    let (code, out, _) = run(&["verify", s(&bad)]);
    assert_eq!(code, 1);
    assert!(
        out.contains("rejected [null_deref]")
            && out.contains("insn 7: r0 = *(u64 *)(r0 +0)")
            && out.contains("at null_deref.c:7")
            && out.contains("state: R0=map_value_or_null"),
        "{out}"
    );
    let (code, _, err) = run(&["verify", "/nonexistent.o"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent.o"), "{err}");
    let (code, _, err) = run(&["verify", s(&p), "--program", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("on_complete"), "{err}");
}

#[test]
fn verify_json_holds_verdicts_and_the_log() {
    let v = json(&["verify", "--json", s(&policy("src/net_stats.o"))]);
    assert_eq!(v["accepted"], true);
    let progs = v["programs"].as_array().unwrap();
    assert_eq!(progs.len(), 2);
    assert_eq!(progs[0]["name"], "on_complete");
    assert_eq!(progs[0]["section"], "net/complete");
    assert_eq!(progs[0]["accepted"], true);
    assert!(progs[0]["insns"].as_u64().unwrap() > 0);
    assert!(progs[0]["processed"].as_u64().unwrap() > 0);

    let (code, out, _) = run(&["verify", "--json", s(&policy("unsafe/null_deref.o"))]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["accepted"], false);
    let p = &v["programs"][0];
    assert_eq!(p["accepted"], false);
    assert_eq!(p["kind"], "null_deref");
    assert_eq!(p["insn"], 7);
    assert_eq!(p["register"], 0);
    assert_eq!(p["line"]["file"], "null_deref.c");
    assert_eq!(p["line"]["line"], 7);
    assert!(
        p["state"].as_str().unwrap().contains("map_value_or_null"),
        "{p}"
    );
    assert!(
        p["log"].as_str().unwrap().contains("at null_deref.c:7"),
        "{p}"
    );
}

#[test]
fn inspect_shows_hooks_maps_instructions_and_source() {
    let p = policy("src/size_aware.o");
    for cmd in ["inspect", "disasm"] {
        let (code, out, _) = run(&[cmd, s(&p)]);
        assert_eq!(code, 0);
        assert!(
            out.contains("size_aware: section tuner (hook: the tuner"),
            "{out}"
        );
        assert!(
            out.contains("map[0] tuner_thresholds: array key 4 B, value 8 B, 4 entries")
                && out.contains("map[1] tuner_decisions: array key 4 B, value 16 B, 3 entries"),
            "{out}"
        );
        assert!(
            out.contains("size_aware (tuner):")
                && out.contains("call 1")
                && out.contains("; size_aware.c:44: if (n <= small && ctx->nnodes >= 4) {"),
            "{out}"
        );
    }
    let v = json(&["inspect", "--json", s(&p)]);
    let prog = &v["programs"][0];
    assert_eq!(prog["name"], "size_aware");
    assert_eq!(prog["section"], "tuner");
    assert!(prog["hook"].as_str().unwrap().contains("tuner"));
    let insns = prog["instructions"].as_array().unwrap();
    assert!(!insns.is_empty() && insns[0]["pc"] == 0);
    assert!(
        insns.iter().any(|i| i["line"]["line"] == 44
            && i["line"]["file"] == "size_aware.c"
            && i["line"]["text"] == "if (n <= small && ctx->nnodes >= 4) {"),
        "{prog}"
    );
    assert!(insns.iter().any(|i| i["text"] == "call 1"));
    let maps = v["maps"].as_array().unwrap();
    assert_eq!(maps[0]["name"], "tuner_thresholds");
    assert_eq!(maps[0]["type"], "array");
    assert_eq!(
        (
            &maps[0]["key_size"],
            &maps[0]["value_size"],
            &maps[0]["max_entries"]
        ),
        (&Value::from(4), &Value::from(8), &Value::from(4))
    );
}

/// What `policies/src/size_aware.c` decides, from its constants (the test fails if they
/// change): TREE/LL up to `default_small` from 4 nodes on, TREE/SIMPLE up to `default_large`,
/// then RING/SIMPLE; channels always NCCL's.
fn size_aware_model(n: u64, nodes: u32) -> (i32, i32, u32) {
    let c = source("src/size_aware.c");
    assert!(
        c.contains("default_small = 16 * 1024;") && c.contains("default_large = 4 << 20;"),
        "size_aware.c's thresholds changed: update this test"
    );
    const SMALL: u64 = 16 * 1024;
    const LARGE: u64 = 4 << 20;
    const LL: i32 = 0;
    const SIMPLE: i32 = 2;
    const TREE: i32 = 0;
    const RING: i32 = 1;
    if n <= SMALL && nodes >= 4 {
        (TREE, LL, 0)
    } else if n <= LARGE {
        (TREE, SIMPLE, 0)
    } else {
        (RING, SIMPLE, 0)
    }
}

/// The model's ranges over the powers of two `lo..=hi`.
fn expected_ranges(lo: u64, hi: u64, nodes: u32) -> Vec<(u64, u64, (i32, i32, u32))> {
    let mut rows: Vec<(u64, u64, (i32, i32, u32))> = Vec::new();
    for k in 0..63 {
        let n = 1u64 << k;
        if n < lo || n > hi {
            continue;
        }
        let d = size_aware_model(n, nodes);
        match rows.last_mut() {
            Some(r) if r.2 == d => r.1 = n,
            _ => rows.push((n, n, d)),
        }
    }
    rows
}

fn ranges_of(coll: &Value) -> Vec<(u64, u64, (i32, i32, u32))> {
    coll["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["min_bytes"].as_u64().unwrap(),
                r["max_bytes"].as_u64().unwrap(),
                (
                    r["algo"].as_i64().unwrap() as i32,
                    r["proto"].as_i64().unwrap() as i32,
                    r["nchannels"].as_u64().unwrap() as u32,
                ),
            )
        })
        .collect()
}

#[test]
fn decisions_of_size_aware_switch_where_its_source_does() {
    let p = policy("src/size_aware.o");
    let want = expected_ranges(8, 4 << 30, 2);
    assert_eq!(want.len(), 2);
    assert_eq!((want[0].1, want[1].1), (4 << 20, 4 << 30));
    let four_nodes = expected_ranges(8, 4 << 30, 4);
    assert_eq!(four_nodes.len(), 3);
    assert_eq!(
        four_nodes[0],
        (8, 16 << 10, (0, 0, 0)),
        "TREE/LL up to 16 KiB"
    );

    let (code, out, err) = run(&["decisions", s(&p)]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("size_aware (")
            && out.contains("8 ranks on 2 nodes, 8 B to 4 GiB (30 sizes")
            && out.contains("broadcast, reduce, allgather, reducescatter, allreduce:"),
        "{out}"
    );
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with("  ") && !l.trim_start().starts_with("size"))
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(
        rows,
        [
            vec!["8 B .. 4 MiB", "TREE", "SIMPLE", "NCCL's choice"],
            vec!["8 MiB .. 4 GiB", "RING", "SIMPLE", "NCCL's choice"],
        ],
        "{out}"
    );

    let v = json(&["decisions", "--json", s(&p)]);
    assert_eq!(v["program"], "size_aware");
    assert_eq!(
        (&v["ranks"], &v["nodes"]),
        (&Value::from(8), &Value::from(2))
    );
    assert_eq!(v["sizes"]["min_bytes"], 8);
    assert_eq!(v["sizes"]["max_bytes"], 4u64 << 30);
    let colls = v["collectives"].as_array().unwrap();
    let names: Vec<&str> = colls.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "broadcast",
            "reduce",
            "allgather",
            "reducescatter",
            "allreduce"
        ]
    );
    for c in colls {
        assert_eq!(ranges_of(c), want, "{c}");
    }
    let first = &colls[0]["ranges"][0];
    assert_eq!(first["algorithm"], "TREE");
    assert_eq!(first["protocol"], "SIMPLE");
    assert_eq!(first["channels"], Value::Null, "NCCL's choice is null");
    assert_eq!(colls[0]["ranges"][1]["algorithm"], "RING");
    assert_eq!(colls[0]["ranges"][1]["protocol"], "SIMPLE");
    // From 4 nodes on, the smallest messages take LL.
    let v = json(&["decisions", "--json", s(&p), "--nodes", "4"]);
    for c in v["collectives"].as_array().unwrap() {
        assert_eq!(ranges_of(c), four_nodes, "{c}");
    }
    assert_eq!(colls[4]["coll_type"], 4);

    // One node: no channel count; a narrower range, one collective (given twice), the
    // interpreter instead of the JIT.
    for jit in ["1", "0"] {
        let (code, out, err) = run_env(
            &[
                "decisions",
                "--json",
                s(&p),
                "--coll",
                "all_reduce,allreduce",
                "--ranks",
                "4",
                "--nodes",
                "1",
                "--sizes",
                "100..64MiB",
            ],
            &[("NCCL_BPF_JIT", jit)],
        );
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let colls = v["collectives"].as_array().unwrap();
        assert_eq!(colls.len(), 1);
        assert_eq!(colls[0]["name"], "allreduce");
        assert_eq!(ranges_of(&colls[0]), expected_ranges(128, 64 << 20, 1));
    }
}

#[test]
fn decisions_of_a_rejected_policy_print_the_verifier_message() {
    let bad = policy("unsafe/null_deref.o");
    for args in [
        vec!["decisions", s(&bad)],
        vec!["decisions", "--json", s(&bad)],
    ] {
        let (code, out, err) = run(&args);
        assert_eq!(code, 1, "{args:?}: {out} {err}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("rejected by the verifier")
                && err.contains("insn 7")
                && err.contains("null_deref.c:7"),
            "{err}"
        );
    }
    let (code, _, err) = run(&["decisions", s(&policy("src/net_stats.o"))]);
    assert_eq!(code, 2);
    assert!(err.contains("no program in a 'tuner' section"), "{err}");
}

#[test]
fn decisions_publish_no_maps() {
    let dir = std::env::temp_dir().join(format!("ncclbpf-cli-{}-shm", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (code, _, err) = run_env(
        &["decisions", s(&policy("src/size_aware.o")), "--sizes", "1M"],
        &[("NCCL_BPF_SHM_DIR", dir.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    let listed: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(listed.is_empty(), "registry files written: {listed:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn maps_of_a_running_process() {
    // This test process plays the job: it creates maps, and the command reads them by pid.
    use shared_maps::{MapSpec, MapType, Registry};
    let reg = Registry::global();
    let m = reg
        .shared(
            &MapSpec {
                name: "cli_counts".into(),
                kind: MapType::Hash,
                key_size: 8,
                value_size: 16,
                max_entries: 8,
            },
            "cli-test",
        )
        .unwrap();
    m.update(
        &42u64.to_le_bytes(),
        &[7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0],
        0,
    )
    .unwrap();
    let pid = std::process::id().to_string();
    let (code, out, err) = run(&["maps", &pid]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("cli_counts: hash key 8 B, value 16 B, 8 entries (1 non-zero)"),
        "{out}"
    );
    assert!(out.contains("  42 => 7 9"), "{out}");

    let v = json(&["maps", "--json", &pid, "--map", "cli_counts"]);
    assert_eq!(v["pid"], std::process::id());
    let maps = v["maps"].as_array().unwrap();
    assert_eq!(maps.len(), 1);
    let c = &maps[0];
    assert_eq!(c["name"], "cli_counts");
    assert_eq!(c["type"], "hash");
    assert_eq!(
        (
            &c["key_size"],
            &c["value_size"],
            &c["max_entries"],
            &c["nonzero"]
        ),
        (
            &Value::from(8),
            &Value::from(16),
            &Value::from(8),
            &Value::from(1)
        )
    );
    let e = &c["entries"][0];
    assert_eq!(e["key"], "2a00000000000000");
    assert_eq!(e["value"], "07000000000000000900000000000000");
    assert_eq!(e["key_words"], serde_json::json!([42]));
    assert_eq!(e["value_words"], serde_json::json!([7, 9]));

    let (code, _, err) = run(&["maps", &pid, "--map", "nope"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["maps", "999999999"]);
    assert_eq!(code, 2);
    assert!(err.contains("999999999"), "{err}");
}

/// Runs the command with standard output a pipe whose reader is already gone (as after
/// `| head -1` has read its line): every write fails with EPIPE.
fn run_closed_stdout(args: &[&str]) -> (i32, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN)
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_is_a_quiet_exit() {
    let ok = policy("src/net_stats.o");
    let bad = policy("unsafe/null_deref.o");
    let tuner = policy("src/size_aware.o");
    for (args, code) in [
        (vec!["inspect", s(&ok)], 0),
        (vec!["inspect", "--json", s(&ok)], 0),
        (vec!["verify", s(&ok)], 0),
        (vec!["decisions", s(&tuner)], 0),
        (vec!["decisions", "--json", s(&tuner)], 0),
        (vec!["--help"], 0),
        // The verdict still decides the status when nobody reads the output.
        (vec!["verify", s(&bad)], 1),
        (vec!["verify", "--json", s(&bad)], 1),
    ] {
        let (got, err) = run_closed_stdout(&args);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        assert!(err.is_empty(), "{args:?}: {err}");
        assert_eq!(got, code, "{args:?}: {err}");
    }
    // Errors still reach stderr.
    let (got, err) = run_closed_stdout(&["verify", "/nonexistent.o"]);
    assert_eq!(got, 2);
    assert!(
        err.contains("/nonexistent.o") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn maps_with_a_closed_stdout_is_a_quiet_exit() {
    use shared_maps::{MapSpec, MapType, Registry};
    let reg = Registry::global();
    let m = reg
        .shared(
            &MapSpec {
                name: "cli_pipe".into(),
                kind: MapType::Array,
                key_size: 4,
                value_size: 8,
                max_entries: 64,
            },
            "cli-test",
        )
        .unwrap();
    for k in 0..64u32 {
        m.update(&k.to_le_bytes(), &u64::from(k + 1).to_le_bytes(), 0)
            .unwrap();
    }
    let pid = std::process::id().to_string();
    for json in [false, true] {
        let mut args = vec!["maps", &pid, "--limit", "64"];
        if json {
            args.push("--json");
        }
        let (code, err) = run_closed_stdout(&args);
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(code, 0, "{err}");
    }
}

/// `rules check`: NCCL's example format loads, every malformed line is reported with its field
/// (exit 1), a missing file is exit 2; JSON for scripts.
#[test]
fn rules_check_validates_files_without_a_job() {
    let (code, out, err) = run(&["rules", "check", "--help"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ncclbpf rules check nccl_tuner.conf") && out.contains("Exit status:"));
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/nccl_tuner_example.conf");
    let (code, out, err) = run(&["rules", "check", s(&example)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("rules (the table holds 512)"), "{out}");
    let v = json(&["rules", "check", "--json", s(&example)]);
    assert_eq!(v["valid"], true);
    assert!(!v["rules"].as_array().unwrap().is_empty());
    assert!(v["rules"][0]["collective"].is_string());

    let dir = std::env::temp_dir().join(format!("ncclbpf-cli-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.conf");
    std::fs::write(
        &bad,
        "# a comment\nallreduce,0,65536,rng,simple,-1,-1,-1\nallreduce,0,x,ring,ll,2,1,1\nallgather,0,-1,ring,simple,-1,1,1\n",
    )
    .unwrap();
    let (code, _, err) = run(&["rules", "check", s(&bad)]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("bad.conf:2: field 4 (algorithm)")
            && err.contains("bad.conf:3: field 3 (max_bytes)"),
        "{err}"
    );
    assert!(!err.contains("bad.conf:4"), "line 4 is fine: {err}");
    let (code, out, _) = run(&["rules", "check", "--json", s(&bad)]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["errors"].as_array().unwrap().len(), 2);
    assert_eq!(v["errors"][0]["line"], 2);
    assert_eq!(v["errors"][0]["field"]["name"], "algorithm");
    let (code, _, err) = run(&["rules", "check", "/nonexistent/nccl_tuner.conf"]);
    assert_eq!(code, 2, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `reload` and `status` are wired in: help with exit statuses, usage errors and an
/// unreachable process are exit 2 (the verdicts themselves are tested in reload.rs and
/// tests/tests/live_reload.rs against real control sockets).
#[test]
fn reload_and_status_are_commands() {
    for cmd in ["reload", "status"] {
        let (code, out, err) = run(&[cmd, "--help"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("Exit status:") && out.contains(&format!("ncclbpf {cmd} ")),
            "{out}"
        );
    }
    let dir = std::env::temp_dir().join(format!("ncclbpf-cli-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env = [("NCCL_BPF_SHM_DIR", dir.to_str().unwrap())];
    let (code, _, err) = run_env(&["reload", "notapid", "x.o"], &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a process id"), "{err}");
    let (code, _, err) = run_env(&["reload", "1", "x.o", "--all"], &env);
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = run_env(&["status", "999999"], &env);
    assert_eq!(code, 2, "{out}{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `status --watch` needs a terminal and does not go with --json; --interval is bounded and
/// belongs to --watch. (The view itself is tested in src/watch.rs with ratatui's TestBackend.)
#[test]
fn status_watch_usage_errors() {
    let (code, out, _) = run(&["status", "--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("--watch") && out.contains("--interval <SECONDS>"),
        "{out}"
    );
    assert!(!out.contains("not there yet"), "{out}");
    let (code, out, err) = run(&["status", "--watch", "--json", "1"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("'--watch' cannot be used with '--json'"),
        "{err}"
    );
    // Output captured: not a terminal.
    let (code, out, err) = run(&["status", "--watch", "--all"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("--watch needs a terminal, and standard output is not one"),
        "{err}"
    );
    for bad in ["0", "0.01", "3601", "x"] {
        let (code, _, err) = run(&["status", "--watch", "--interval", bad, "1"]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("not a refresh interval"), "{bad}: {err}");
    }
    let (code, _, err) = run(&["status", "--interval", "2", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--watch"), "{err}");
}

#[test]
fn collectives_of_a_profiled_process() {
    // This test process plays a profiled job: the profiler's tracker writes its figures into
    // this process's registry, and the command reads them by pid.
    use ncclbpf_profiler::event::{Descr, Kind, Op, StateUpdate};
    use ncclbpf_profiler::handles::Handle;
    use ncclbpf_profiler::tracker::Tracker;
    let t = Tracker::new(
        0x46,
        Box::leak(Box::default()),
        Some(shared_maps::Registry::global()),
    );
    let ctx = t.init(0xc011, "cli", 1, 2, 1).unwrap();
    for dur in [40_000u64, 60_000, 900_000] {
        let op = Op {
            seq: 1,
            func: 4,
            count: 1 << 18,
            type_size: 4,
            algo: 1,
            proto: 2,
            nchannels: 1,
            root_or_peer: 0,
            ..Op::default()
        };
        let c = t.start(
            ctx,
            &Descr {
                kind: Kind::Coll(op),
                parent: Handle(0),
                rank: 1,
            },
        );
        t.stop(c);
        let k = t.start(
            ctx,
            &Descr {
                kind: Kind::KernelCh {
                    channel: 0,
                    start: 10,
                },
                parent: c,
                rank: 1,
            },
        );
        t.record(
            k,
            StateUpdate {
                state: 22,
                arg: 10 + dur,
            },
        );
        t.stop(k);
    }
    let pid = std::process::id().to_string();
    let (code, out, err) = run(&["collectives", &pid]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("3 operations timed, 0 untimed"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("0x000000000000c011"))
        .unwrap_or_else(|| panic!("no row for the communicator: {out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // comm rank collective size(2 words) algorithm proto count mean p50 p99 max busbw untimed
    assert_eq!(
        &cols[1..],
        &[
            "1",
            "allreduce",
            "1",
            "MiB",
            "ring",
            "simple",
            "3",
            "333.3",
            "64.0",
            "1024.0",
            "900.0",
            "3.146",
            "0"
        ],
        "{out}"
    );
    let v = json(&["collectives", "--json", &pid]);
    let c = v["collectives"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["comm"] == "0x000000000000c011")
        .unwrap();
    assert_eq!(
        (&c["count"], &c["mean_ns"], &c["p99_le_ns"]),
        (
            &Value::from(3),
            &Value::from(333_333),
            &Value::from(1_024_000)
        )
    );
    assert_eq!(v["counters"]["ops_timed"], Value::from(3));
    assert_eq!(c["user_tag"], Value::Null, "untagged");
    // A collective with a user tag (NCCL 2.31+): a row of its own, and a tag column.
    let op = Op {
        seq: 2,
        func: 4,
        count: 1 << 18,
        type_size: 4,
        algo: 1,
        proto: 2,
        nchannels: 1,
        user_tag: 31337,
        ..Op::default()
    };
    let c = t.start(
        ctx,
        &Descr {
            kind: Kind::Coll(op),
            parent: Handle(0),
            rank: 1,
        },
    );
    t.stop(c);
    let k = t.start(
        ctx,
        &Descr {
            kind: Kind::KernelCh {
                channel: 0,
                start: 10,
            },
            parent: c,
            rank: 1,
        },
    );
    t.record(
        k,
        StateUpdate {
            state: 22,
            arg: 10 + 50_000,
        },
    );
    t.stop(k);
    let (code, out, err) = run(&["collectives", &pid]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with("0x000000000000c011"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(out.contains("user tag"), "{out}");
    assert!(
        rows.iter().any(|r| r[3] == "31337" && r[8] == "1"),
        "the tagged row, one collective: {out}"
    );
    assert!(rows.iter().any(|r| r[3] == "-" && r[8] == "3"), "{out}");
    let v = json(&["collectives", "--json", &pid]);
    let tagged: Vec<&Value> = v["collectives"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["comm"] == "0x000000000000c011" && c["user_tag"] == "31337")
        .collect();
    assert_eq!(tagged.len(), 1);
    assert_eq!(tagged[0]["count"], Value::from(1));
    t.finalize(ctx);
}
