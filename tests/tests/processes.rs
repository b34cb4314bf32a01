//! Several processes, as in a real job: a ring all-reduce, peers killed mid-transfer,
//! settings from the environment, and connect/close cycles that must leave nothing behind.

use ncclbpf_harness::{Net, pattern};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_harness-rank");

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wait_all(mut kids: Vec<Child>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    for k in kids.iter_mut() {
        loop {
            if let Some(st) = k.try_wait().unwrap() {
                assert!(st.success(), "a rank failed: {st}");
                break;
            }
            if Instant::now() > deadline {
                let _ = k.kill();
                panic!("a rank hung");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn ring_allreduce_four_processes_every_version() {
    for v in ["12", "11", "10", "9", "8", "7"] {
        let dir = scratch(&format!("ring{v}"));
        let sizes = ["4", "1024", "65536", "1048576", "16777216", "40000"];
        let kids: Vec<Child> = (0..4)
            .map(|r| {
                Command::new(RANK_BIN)
                    .args(["ring", &r.to_string(), "4", dir.to_str().unwrap(), v])
                    .args(sizes)
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        wait_all(kids, Duration::from_secs(120));
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn fetch_handle(dir: &std::path::Path, rank: usize) -> [u8; 128] {
    let p = dir.join(format!("handle.{rank}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(b) = std::fs::read(&p) {
            return b.try_into().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "child never published its handle"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn killed_sender_fails_pending_receive_quickly() {
    let n = Net::ready(None);
    let dir = scratch("killsend");
    let (h, l) = n.listen(0).unwrap();
    std::fs::write(dir.join("handle.0"), h).unwrap();
    let mut child = Command::new(RANK_BIN)
        .args(["send-forever", dir.to_str().unwrap(), "12"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        if let Some(r) = n.accept_step(l).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline, "child never connected");
    };
    n.close_listen(l).unwrap();
    let mut buf = vec![0u8; 64 << 20];
    // One whole message proves the stream flows; then kill the sender in the middle of the next.
    // SAFETY: buf outlives every request below.
    let q = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
        .unwrap()
        .unwrap();
    n.wait(q, Duration::from_secs(30)).unwrap();
    assert!(buf == pattern(64 << 20, 1));
    // SAFETY: as above.
    let q = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
        .unwrap()
        .unwrap();
    std::thread::sleep(Duration::from_millis(5));
    child.kill().unwrap();
    let killed = Instant::now();
    child.wait().unwrap();
    let mut q = Some(q);
    let err = loop {
        let cur = match q {
            Some(c) => c,
            // SAFETY: as above.
            None => match unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) } {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => break e,
            },
        };
        match n.test(cur, true) {
            Ok(Some(_)) => q = None,
            Ok(None) => q = Some(cur),
            Err(e) => break e,
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "no error 5 s after the peer died"
        );
    };
    assert_eq!(err.name(), "ncclRemoteError", "{err:?}");
    assert!(ncclbpf_harness::log_text().contains("closed by remote peer"));
    n.close_recv(r).unwrap();
}

#[test]
fn killed_receiver_fails_pending_send_quickly() {
    let n = Net::ready(None);
    let dir = scratch("killrecv");
    let mut child = Command::new(RANK_BIN)
        .args(["recv-forever", dir.to_str().unwrap(), "12"])
        .spawn()
        .unwrap();
    let mut h = fetch_handle(&dir, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        if let Some(s) = n.connect_step(0, &mut h).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline);
    };
    let data = pattern(64 << 20, 9);
    // SAFETY: data outlives every request.
    let q = unsafe { n.isend(s, data.as_ptr(), data.len()) }
        .unwrap()
        .unwrap();
    n.wait(q, Duration::from_secs(30)).unwrap();
    child.kill().unwrap();
    let killed = Instant::now();
    child.wait().unwrap();
    let err = loop {
        // SAFETY: as above.
        let q = match unsafe { n.isend(s, data.as_ptr(), data.len()) } {
            Ok(Some(q)) => q,
            Ok(None) => continue,
            Err(e) => break e,
        };
        let res = loop {
            match n.test(q, true) {
                Ok(Some(_)) => break Ok(()),
                Ok(None) => assert!(
                    killed.elapsed() < Duration::from_secs(5),
                    "send still pending 5 s after the peer died"
                ),
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = res {
            break e;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "sends still succeed 5 s after the peer died"
        );
    };
    assert!(
        ["ncclRemoteError", "ncclSystemError"].contains(&err.name()),
        "{err:?}"
    );
    n.close_send(s).unwrap();
}

#[test]
fn connect_close_cycles_leave_no_fds_or_threads() {
    let out = Command::new(RANK_BIN)
        .args(["cycles", "1000"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let nums = |prefix: &str| -> (usize, usize) {
        let line = text.lines().find(|l| l.starts_with(prefix)).expect(prefix);
        let v: Vec<usize> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        (v[0], v[1])
    };
    let before = nums("before");
    let after = nums("after");
    assert_eq!(
        before, after,
        "fds/threads before vs after 1000 cycles:\n{text}"
    );
}

#[test]
fn bad_settings_are_logged_and_defaults_used() {
    let text = probe(&[
        ("NCCL_BPF_NSTREAMS", "lots".as_ref()),
        ("NCCL_BPF_MIN_CHUNK", "7".as_ref()),
    ]);
    assert!(
        text.contains("NCCL_BPF_NSTREAMS=\"lots\" ignored"),
        "{text}"
    );
    assert!(text.contains("NCCL_BPF_MIN_CHUNK=\"7\" ignored"), "{text}");
    assert!(text.contains("4 data stream(s)"), "default used: {text}");
}

#[test]
fn settings_change_the_transport_shape() {
    for streams in ["0", "1", "8"] {
        let text = probe(&[("NCCL_BPF_NSTREAMS", streams.as_ref())]);
        assert!(
            text.contains(&format!("{streams} data stream(s)")),
            "{text}"
        );
    }
}

#[test]
fn no_interface_fails_init_with_a_reason() {
    let out = probe_output(&[("NCCL_SOCKET_IFNAME", "=nosuchif0".as_ref())]);
    assert!(!out.status.success(), "init must fail without a device");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("init"), "{err}");
}

/// Runs `harness-rank probe` (one connection, a few transfers, then the plugin's log) with
/// extra environment; returns its stdout, failing unless it succeeded.
fn probe(env: &[(&str, &std::ffi::OsStr)]) -> String {
    let out = probe_output(env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("transfer ok"), "{text}");
    text
}

fn probe_output(env: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    Command::new(RANK_BIN)
        .arg("probe")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn probe_with_policy(policy: &std::path::Path) -> String {
    probe(&[("NCCL_BPF_NET_POLICY", policy.as_os_str())])
}

fn policy(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(rel);
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

#[test]
fn net_policy_counts_what_the_plugin_moved() {
    let text = probe_with_policy(&policy("src/net_stats.o"));
    // probe sends 100 B, 2 MiB and 0 B on one connection; both ends update one record.
    let want = format!(
        "conn_stats send_bytes={n} recv_bytes={n} sends=3 recvs=3 errors=0 timed=6",
        n = 100 + (2 << 20)
    );
    assert!(text.contains(&want), "{text}");
    assert!(
        text.contains("'on_complete' attached to net/complete"),
        "{text}"
    );
}

/// `NCCL_BPF_POLICY` takes a list: an object that cannot be read is logged and the next one's
/// net programs still attach (its tuner program, if any, is the tuner's business).
#[test]
fn one_policy_setting_takes_a_list() {
    let good = policy("src/net_stats.o");
    let list = format!("/nonexistent/first.o, {}", good.display());
    let text = probe(&[("NCCL_BPF_POLICY", std::ffi::OsStr::new(&list))]);
    let want = format!(
        "conn_stats send_bytes={n} recv_bytes={n} sends=3 recvs=3 errors=0 timed=6",
        n = 100 + (2 << 20)
    );
    assert!(text.contains(&want), "{text}");
    assert!(
        text.contains("NCCL_BPF_POLICY=/nonexistent/first.o"),
        "{text}"
    );
}

/// `conn_counter` keeps bytes and operations per connection and per communicator; the probe
/// moves 100 B, 2 MiB and 0 B over one connection of communicator 0x1234, both ends in one
/// process, so each record holds both directions.
#[test]
fn conn_counter_counts_per_connection_and_per_communicator() {
    let text = probe_with_policy(&policy("src/conn_counter.o"));
    let n = 100 + (2 << 20);
    for map in ["conn_traffic", "comm_traffic"] {
        let want = format!("map {map} [0] = {n} {n} 3 3 0");
        assert!(text.contains(&want), "{want}:\n{text}");
    }
}

#[test]
fn rejected_net_policy_is_logged_and_traffic_flows() {
    let text = probe_with_policy(&policy("unsafe/null_deref_wrong_branch.o"));
    assert!(text.contains("rejected by the verifier"), "{text}");
    assert!(text.contains("map_value_or_null"), "{text}");
    let text = probe_with_policy(std::path::Path::new("/nonexistent/policy.o"));
    assert!(
        text.contains("NCCL_BPF_NET_POLICY=/nonexistent/policy.o"),
        "{text}"
    );
}

#[test]
fn net_hooks_see_the_communicator_and_connection_shape() {
    // harness-rank probe initialises net v12 with commId 0x1234; connections have 4 streams,
    // or 0 over an inner plugin (`NCCL_BPF_NET_INNER`: its streams are its own).
    let streams = if std::env::var_os("NCCL_BPF_NET_INNER").is_some() {
        0
    } else {
        4
    };
    let text = probe_with_policy(&policy("safe/net_seen.o"));
    assert!(
        text.contains(&format!("map net_seen [0] = {} {streams} 1", 0x1234)),
        "{text}"
    );
}
