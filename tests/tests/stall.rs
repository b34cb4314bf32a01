//! The stall finder from outside: two processes (`harness-rank stall-recv` and `stall-send`)
//! with two connections between them. On one the sender keeps sending; on the other it sent
//! one message and then stopped (it stays alive), so the receiver's next receive never
//! completes. `ncclbpf status --stall-after 1` names that connection, with the port of the
//! sender's end, and not the one that keeps moving; with the sender frozen (SIGSTOP), it names
//! the moving one too, within a few seconds, though the frozen process's control socket never
//! answers.
//!
//! The `ncclbpf` command is the release (or debug) build next to this test's directory, or
//! `$NCCLBPF_CLI`.

use serde_json::Value;

use ncclbpf_harness::LineChild;
use std::path::{Path, PathBuf};
use std::process::Command;

use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_harness-rank");

/// A scratch directory for the handles and the registry, so the command sees only these two
/// processes.
fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-stall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `harness-rank` process in `mode`, its handles in `dir` and its registry in `shm`.
fn start_rank(mode: &str, dir: &Path, shm: &Path) -> LineChild {
    LineChild::spawn(
        Command::new(RANK_BIN)
            .args([mode, dir.to_str().unwrap()])
            .env("NCCL_BPF_SHM_DIR", shm)
            .env("NCCL_SOCKET_IFNAME", "lo")
            .env_remove("NCCL_BPF_POLICY")
            .env_remove("NCCL_BPF_NET_POLICY")
            .env_remove("NCCL_BPF_TUNER_POLICY"),
    )
}

/// `ncclbpf status --stall-after 1 [--json] PIDS`: exit status, stdout, and how long it took.
fn status(shm: &Path, json: bool, pids: &[u32]) -> (Option<i32>, String, Duration) {
    let t = Instant::now();
    let out = Command::new(ncclbpf_harness::cli_path())
        .args(["status", "--stall-after", "1"])
        .args(json.then_some("--json"))
        .args(pids.iter().map(u32::to_string))
        .env("NCCL_BPF_SHM_DIR", shm)
        .output()
        .unwrap();
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.is_empty(), "{err}");
    (out.status.code(), text, took)
}

fn conns(v: &Value, pid: u32) -> Vec<Value> {
    v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no process {pid}: {v}"))["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("no connections of {pid}: {v}"))
        .clone()
}

#[test]
fn status_names_the_connection_that_stopped() {
    let dir = scratch();
    let shm = dir.join("shm");
    let recv = start_rank("stall-recv", &dir, &shm);
    let send = start_rank("stall-send", &dir, &shm);
    recv.expect("ready");
    send.expect("ready");
    recv.expect("stuck");
    std::thread::sleep(Duration::from_millis(1500));

    let (code, text, _) = status(&shm, true, &[recv.pid, send.pid]);
    assert_eq!(code, Some(1), "a stalled connection is exit 1: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let (rc, sc) = (conns(&v, recv.pid), conns(&v, send.pid));
    assert_eq!((rc.len(), sc.len()), (2, 2), "{text}");
    for c in rc.iter().chain(&sc) {
        assert_eq!(c["comm_id"], "0x0000000000001234", "{c}");
        assert_eq!(c["peer_addr"], "127.0.0.1", "{c}");
    }
    for p in v["processes"].as_array().unwrap() {
        assert_eq!(p["verdict"], "ok", "both control sockets answer: {p}");
    }

    // Exactly one stalled connection: the receiver's end of the one the sender stopped using,
    // named with the port of the sender's end (the same connection id there) and its pid.
    let stalled = v["stalled"].as_array().unwrap();
    assert_eq!(stalled.len(), 1, "{text}");
    let s = &stalled[0];
    assert_eq!(s["pid"], recv.pid);
    assert_eq!(s["direction"], "recv");
    assert_eq!(s["pending"], 1);
    assert!(s["waiting_s"].as_f64().unwrap() > 1.0, "{s}");
    let other = sc
        .iter()
        .find(|c| c["conn_id"] == s["conn_id"])
        .unwrap_or_else(|| panic!("the sender has no end of {}: {text}", s["conn_id"]));
    assert_eq!(s["peer_port"], other["local_port"], "{text}");
    assert_eq!(other["peer_port"], s["local_port"], "{text}");
    assert_eq!(s["peer_pid"], send.pid);
    assert_eq!(
        s["peer"],
        format!("127.0.0.1:{}", other["local_port"]),
        "{text}"
    );
    assert_eq!(other["pending"], 0, "the sender has nothing pending there");
    assert_eq!(other["messages"], 1);

    // The other connection keeps moving: never named, and it has made progress lately.
    let moving = rc.iter().find(|c| c["conn_id"] != s["conn_id"]).unwrap();
    assert_eq!(moving["stalled"], false, "{moving}");
    assert!(moving["messages"].as_u64().unwrap() > 0, "{moving}");
    assert!(
        moving["since_progress_s"].as_f64().unwrap() < 1.0,
        "{moving}"
    );
    for c in &sc {
        assert_eq!(c["stalled"], false, "{c}");
    }

    // The same in text: one STALLED line, with the peer.
    let (code, text, _) = status(&shm, false, &[recv.pid, send.pid]);
    assert_eq!(code, Some(1), "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("STALLED "))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    let want = format!(
        "STALLED recv connection {} from 127.0.0.1:{} (pid {}), comm 0x0000000000001234: 1 request(s) pending, no progress for ",
        s["conn_id"].as_str().unwrap(),
        other["local_port"],
        send.pid
    );
    assert!(lines[0].trim_start().starts_with(&want), "{text}");
    assert!(
        text.contains("1 stalled connection(s) in 1 process(es)"),
        "{text}"
    );

    // Frozen mid-transfer: the sender stops (SIGSTOP). Its control socket never answers, but
    // both tables are read, and the receiver's moving connection is named too, with the frozen
    // process as its peer, within a few seconds.
    send.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1500));
    let (code, text, took) = status(&shm, true, &[recv.pid, send.pid]);
    send.signal(libc::SIGCONT);
    assert_eq!(code, Some(1), "{text}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let frozen = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == send.pid)
        .unwrap();
    assert_eq!(frozen["verdict"], "not_asked", "{frozen}");
    assert_eq!(
        frozen["connections"].as_array().map(Vec::len),
        Some(2),
        "read from shared memory: {frozen}"
    );
    let named: Vec<&Value> = v["stalled"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["pid"] == recv.pid)
        .collect();
    assert_eq!(named.len(), 2, "{text}");
    assert!(
        named
            .iter()
            .any(|s| s["conn_id"] == moving["conn_id"] && s["peer_pid"] == send.pid),
        "{text}"
    );
    // The sender first: the receiver then ends quietly.
    drop(send);
    drop(recv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process with no connection table yet, and one that is gone: the first is read (no
/// connections), the second is exit 2.
#[test]
fn processes_without_connections() {
    let dir = std::env::temp_dir().join(format!("ncclbpf-stall-none-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (code, text, _) = status(&dir, true, &[999_999_999]);
    assert_eq!(code, Some(2), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["processes"][0]["verdict"], "not_asked");
    assert!(v["processes"][0]["connections_error"].is_string(), "{text}");
    assert_eq!(v["stalled"], serde_json::json!([]));
    let _ = std::fs::remove_dir_all(&dir);
}
