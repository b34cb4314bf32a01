//! The `ncclbpf` command against real policy objects and a real process's maps.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ncclbpf");

fn policy(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(rel);
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verify_accepts_and_rejects_with_the_reason() {
    let p = policy("src/net_stats.o");
    let (code, out, _) = run(&["verify", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("on_complete (net/complete): accepted")
            && out.contains("on_close (net/close): accepted"),
        "{out}"
    );
    let bad = policy("unsafe/null_deref.o");
    let (code, out, _) = run(&["verify", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("rejected [null_deref]") && out.contains("null_deref.c:7"),
        "{out}"
    );
    let (code, _, err) = run(&["verify", "/nonexistent.o"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent.o"), "{err}");
    let (code, _, err) = run(&["verify", p.to_str().unwrap(), "--program", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("on_complete"), "{err}");
}

#[test]
fn disasm_shows_maps_instructions_and_source() {
    let p = policy("src/size_aware.o");
    let (code, out, _) = run(&["disasm", p.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(
        out.contains("map[0] tuner_thresholds: array key 4 B, value 8 B, 4 entries"),
        "{out}"
    );
    assert!(
        out.contains("size_aware (tuner):")
            && out.contains("call 1")
            && out.contains("; size_aware.c:"),
        "{out}"
    );
}

#[test]
fn maps_of_a_running_process_and_help() {
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
    let (code, _, err) = run(&["maps", &pid, "--map", "nope"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["maps", "999999999"]);
    assert_eq!(code, 2);
    assert!(err.contains("999999999"), "{err}");
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("verify") && out.contains("disasm") && out.contains("maps"),
        "{out}"
    );
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
    for (args, code) in [
        (vec!["disasm", ok.to_str().unwrap()], 0),
        (vec!["verify", ok.to_str().unwrap()], 0),
        // The verdict still decides the status when nobody reads the output.
        (vec!["verify", bad.to_str().unwrap()], 1),
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
    let (code, err) = run_closed_stdout(&["maps", &pid, "--limit", "64"]);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(code, 0, "{err}");
}
