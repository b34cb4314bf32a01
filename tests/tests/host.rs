//! The host without the net plugin (issue 34): a process where NCCL loaded only our tuner and
//! profiler (NCCL's own transport carries the data) still has the control socket, live tuner
//! swaps, config updates and the metrics endpoint, and the endpoint stops when the last context
//! is finalized. `harness-serve tuner-only` never calls the net plugin's `init`.

use ncclbpf_control::{Item, Request};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const SERVE: &str = env!("CARGO_BIN_EXE_harness-serve");
const WAIT: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-host-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `tests/policies/<name>.c` into `out`.
fn fixture(name: &str, out: &Path) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("policies").join(format!("{name}.c"));
    let obj = out.join(format!("{name}.o"));
    let st = Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf", "-mcpu=v3", "-Wall", "-I"])
        .arg(root.join("../policies/include"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("clang (needed for {}): {e}", src.display()));
    assert!(st.success(), "clang failed on {}", src.display());
    obj
}

fn shipped(rel: &str) -> String {
    ncclbpf_policies::object(rel)
        .unwrap_or_else(|e| panic!("{e}"))
        .to_string_lossy()
        .into_owned()
}

/// `harness-serve tuner-only COMM US NRANKS` with its registry in `shm`.
struct TunerOnly {
    child: Child,
    pid: u32,
    shm: PathBuf,
    lines: Receiver<String>,
}

impl TunerOnly {
    fn start(shm: &Path, comm: u64, us: &str, nranks: &str, env: &[(&str, &str)]) -> TunerOnly {
        let mut cmd = Command::new(SERVE);
        cmd.args(["tuner-only", &comm.to_string(), us, nranks])
            .env("NCCL_BPF_SHM_DIR", shm)
            .env_remove("NCCL_BPF_CONTROL")
            .env_remove("LOCAL_RANK")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        let t = TunerOnly {
            child,
            pid,
            shm: shm.to_path_buf(),
            lines,
        };
        let ready = t
            .lines
            .recv_timeout(WAIT)
            .expect("harness-serve never got ready");
        assert_eq!(ready, format!("ready {pid}"));
        t
    }

    /// `ncclbpf ARGS...` against this process's registry: exit status and output.
    fn cli(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = Command::new(ncclbpf_harness::cli_path())
            .args(args)
            .env("NCCL_BPF_SHM_DIR", &self.shm)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    }

    /// Decisions made so far by communicator `comm`, asked through the control socket.
    fn seq(&self, comm: u64) -> u64 {
        let r = ncclbpf_control::request_in(&self.shm, self.pid, &Request::Status, WAIT)
            .unwrap_or_else(|e| panic!("status: {e}"));
        r.items
            .iter()
            .find_map(|i| match i {
                Item::Comm { id, seq, .. } if *id == comm => Some(*seq),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no context {comm:#x}: {}", r.to_text()))
    }

    /// Stops it; the rest of its output (its log included).
    fn stop(mut self) -> String {
        let _ = self.child.stdin.as_mut().unwrap().write_all(b"stop\n");
        let deadline = Instant::now() + WAIT;
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "harness-serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = vec![];
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            rest.push(l);
        }
        let text = rest.join("\n");
        assert!(st.success(), "harness-serve failed ({st}):\n{text}");
        text
    }
}

impl Drop for TunerOnly {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET /metrics` of the endpoint in `<shm>/<pid>.metrics`.
fn scrape(shm: &Path, pid: u32) -> String {
    let file = shm.join(format!("{pid}.metrics"));
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (no metrics endpoint)", file.display()));
    let addr: SocketAddr = text.trim().parse().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200"),
        "{out}"
    );
    out
}

/// Only the tuner and the profiler of the library are initialised: `ncclbpf status` answers
/// (the control socket is up) and lists the tuner's context; a plain `reload` says there is no
/// net hook and changes nothing; `ncclbpf reload --at-seq` swaps the tuner program at the stated
/// collective; the metrics endpoint serves this process, and is gone once both contexts are
/// finalized. Before the host, only the net plugin's `init` started the socket and the endpoint:
/// `status` found no control socket.
#[test]
fn a_tuner_only_process_answers_status_reload_and_metrics() {
    let dir = scratch("tuner-only");
    let shm = dir.join("shm");
    let three = fixture("tuner_three", &dir);
    let bad = shipped("src/bad_channels.o");
    let comm = 0x7001u64;
    let t = TunerOnly::start(
        &shm,
        comm,
        "100",
        "4",
        &[
            ("NCCL_BPF_POLICY", bad.as_str()),
            ("NCCL_BPF_METRICS_ADDR", "127.0.0.1:0"),
        ],
    );
    let pid = t.pid.to_string();

    // The control socket answers, and lists the tuner's context.
    eventually("the tuner decides", || t.seq(comm) > 100);
    let (code, text) = t.cli(&["status", &pid]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("{comm:#018x}")), "{text}");

    // A plain reload of a tuner object: refused, nothing changes.
    let (code, text) = t.cli(&["reload", &pid, three.to_str().unwrap()]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("no net plugin of ours"), "{text}");

    // A staged swap: from the stated collective on.
    let (code, text) = t.cli(&["reload", "--at-seq", "+2000", &pid, three.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}");
    let at: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tuner switch at seq "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no switch point in:\n{text}"));
    assert!(text.contains(&format!("switches at seq {at}")), "{text}");

    // The endpoint serves this process's metrics.
    let m = scrape(&shm, t.pid);
    assert!(
        m.lines().any(|l| l.starts_with("ncclbpf_process_readable{")
            && l.contains(&format!("pid=\"{pid}\""))
            && l.ends_with(" 1")),
        "{m}"
    );

    eventually("the switch point passes", || t.seq(comm) > at + 50);
    let log = t.stop();
    assert!(
        log.contains(&format!("channels 1:1 {at}:3")),
        "one channel until seq {at}, three from it:\n{log}"
    );
    assert!(log.contains("port file after finalize: no"), "{log}");
    assert!(!log.contains("NET/BPF"), "the net plugin ran:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ncclbpf config --at-seq` in a tuner-only process: a one-rank communicator whose context runs
/// the agreement (epoch_state.o, completed on its own record) takes the staged value at exactly
/// the stated collective.
#[test]
fn a_tuner_only_process_takes_config_updates() {
    let dir = scratch("tuner-only-config");
    let shm = dir.join("shm");
    let obj = shipped("safe/epoch_state.o");
    let comm = 0x7002u64;
    let t = TunerOnly::start(
        &shm,
        comm,
        "1000",
        "1",
        &[("NCCL_BPF_POLICY", obj.as_str())],
    );
    let pid = t.pid.to_string();
    eventually("the tuner decides", || t.seq(comm) > 10);
    let (code, text) = t.cli(&[
        "config", "--json", "--at-seq", "+200", &pid, "limit", "0=100",
    ]);
    assert_eq!(code, Some(0), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let at = v["at_seq"].as_u64().unwrap();
    eventually("the stated collective passes", || t.seq(comm) > at + 20);
    let log = t.stop();
    let line = format!("comm {comm:#018x}: config limit 0=100 from seq {at} on");
    assert_eq!(log.matches(&line).count(), 1, "{line}:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tuner-only process on a communicator over two nodes: records cannot cross nodes without
/// our net plugin, so a policy that decides from agreed data (epoch_state.o) has no opinion
/// from the start (NCCL's choices, the same on every rank), says why once, and never waits for
/// records that cannot come (before, each rank waited `NCCL_BPF_AGREEMENT_TIMEOUT` for the other
/// node's records, then failed the collective).
#[test]
fn across_nodes_without_our_net_a_policy_needing_agreement_has_no_opinion() {
    let dir = scratch("tuner-only-nodes");
    let shm = dir.join("shm");
    let obj = shipped("safe/epoch_state.o");
    let comm = 0x7003u64;
    let t = TunerOnly::start(
        &shm,
        comm,
        "100",
        "4",
        &[
            ("NCCL_BPF_POLICY", obj.as_str()),
            ("NCCL_BPF_AGREEMENT_TIMEOUT", "1"),
        ],
    );
    // Past the first epochs the agreement would have applied (K = 64, D = 2).
    eventually("the tuner decides past the first agreement", || {
        t.seq(comm) > 600
    });
    let log = t.stop();
    let why = "records cross nodes only over our net plugin's connections";
    assert_eq!(log.matches(why).count(), 1, "{log}");
    assert!(
        log.contains("has no opinion, like every rank of it"),
        "{log}"
    );
    assert!(!log.contains("agreement on ("), "no agreement ran:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
