//! Prometheus metrics from outside and inside, during a harness job: a sender and a receiver
//! process (`harness-metrics send|recv`) move messages of known sizes through the plugin,
//! then the receiver posts one more receive that never completes.
//!
//! * `ncclbpf exporter`, started before the job, is scraped with an HTTP client: each end's
//!   byte and op counters equal what the harness moved, the receiver has one request in
//!   flight, both ends carry the same connection id and each other's ports; with the receiver
//!   frozen (SIGSTOP) the exporter still answers, and the frozen end's wait grows; a process
//!   that ends leaves the next scrape.
//! * The in-process endpoint (`NCCL_BPF_METRICS_ADDR`): port 0 with the chosen port in the
//!   registry, port + `LOCAL_RANK`, a bad address (a warning; the job goes on), and the
//!   endpoint stopping at the last `finalize`.
//!
//! Every scrape passes `promtool check metrics` when promtool is installed (CI installs
//! Debian's `prometheus` package and sets `NCCLBPF_REQUIRE_PROMTOOL`, which makes a missing
//! promtool a failure; locally the check is skipped with a message).
//!
//! Needs the plugin (`scripts/build.sh`, or `$NCCLBPF_PLUGIN`) and the command (`cargo build
//! --release -p ncclbpf-cli`, or `$NCCLBPF_CLI`).

use ncclbpf_harness::LineChild;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_harness-metrics");

/// Message sizes: inline (control stream), at the inline limit, and cut across data streams.
const SIZES: [usize; 5] = [100, 4096, 65536, 1 << 20, (3 << 20) + 7];

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-metrics-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A harness process of these tests (a [`LineChild`] with its stdin piped), with what they
/// ask of it.
struct Proc(LineChild);

impl std::ops::Deref for Proc {
    type Target = LineChild;
    fn deref(&self) -> &LineChild {
        &self.0
    }
}

impl Proc {
    fn start(mut cmd: Command) -> Proc {
        Proc(LineChild::spawn(cmd.stdin(Stdio::piped())))
    }

    /// "moved <bytes> <messages>".
    fn moved(&self) -> (u64, u64) {
        let l = self.line();
        let f: Vec<&str> = l.split(' ').collect();
        assert!(f.len() == 3 && f[0] == "moved", "pid {}: {l}", self.pid);
        (f[1].parse().unwrap(), f[2].parse().unwrap())
    }

    fn say(&mut self, line: &str) {
        let s = self.0.child.stdin.as_mut().unwrap();
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
    }

    /// Closes stdin and waits for the exit.
    fn finish(mut self) -> std::process::ExitStatus {
        self.0.child.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.0.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "pid {} did not exit", self.0.pid);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn rank(mode: &str, dir: &Path, shm: &Path, env: &[(&str, &str)]) -> Proc {
    let mut c = Command::new(BIN);
    c.arg(mode)
        .arg(dir)
        .args(SIZES.iter().map(usize::to_string))
        .env("NCCL_BPF_SHM_DIR", shm)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env_remove("NCCL_BPF_POLICY")
        .env_remove("NCCL_BPF_NET_POLICY")
        .env_remove("NCCL_BPF_TUNER_POLICY")
        .env_remove("NCCL_BPF_METRICS_ADDR")
        .env_remove("LOCAL_RANK")
        .env_remove("RANK");
    for (k, v) in env {
        c.env(k, v);
    }
    Proc::start(c)
}

/// `ncclbpf exporter --listen 127.0.0.1:0` on `shm`; returns it and its address.
fn exporter(shm: &Path) -> (Proc, SocketAddr) {
    let mut c = Command::new(ncclbpf_harness::cli_path());
    c.args(["exporter", "--listen", "127.0.0.1:0"])
        .env("NCCL_BPF_SHM_DIR", shm);
    let p = Proc::start(c);
    let l = p.line();
    let addr = l
        .strip_prefix("ncclbpf exporter: serving http://")
        .and_then(|r| r.split("/metrics").next())
        .unwrap_or_else(|| panic!("unexpected first line {l:?}"))
        .parse()
        .unwrap();
    (p, addr)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// GET `http://addr/metrics` with a real HTTP client; the body, checked by promtool.
fn scrape(addr: SocketAddr) -> String {
    let mut r = agent()
        .get(&format!("http://{addr}/metrics"))
        .call()
        .unwrap_or_else(|e| panic!("scrape of {addr}: {e}"));
    assert_eq!(r.status(), 200);
    let ct = r.headers().get("content-type").unwrap().to_str().unwrap();
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    let body = r.body_mut().read_to_string().unwrap();
    promtool(&body);
    body
}

/// `promtool check metrics` on `text`, when promtool is installed.
fn promtool(text: &str) {
    let Ok(mut c) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        assert!(
            std::env::var_os("NCCLBPF_REQUIRE_PROMTOOL").is_none(),
            "NCCLBPF_REQUIRE_PROMTOOL is set and promtool cannot be run"
        );
        println!(
            "promtool not installed: exposition not checked (CI installs it: apt-get install prometheus)"
        );
        return;
    };
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    let msg = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics: {msg}\n{text}"
    );
    assert!(msg.trim().is_empty(), "promtool lint: {msg}");
}

type Sample = (BTreeMap<String, String>, f64);

/// The samples of family `name` in a scrape (a small parser of the text format).
fn samples(text: &str, name: &str) -> Vec<Sample> {
    let mut out = vec![];
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
            let mut m = BTreeMap::new();
            let mut chars = r.chars().peekable();
            loop {
                let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
                assert_eq!(chars.next(), Some('"'), "{l}");
                let mut v = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => match chars.next() {
                            Some('n') => v.push('\n'),
                            Some(x) => v.push(x),
                            None => panic!("{l}"),
                        },
                        '"' => break,
                        c => v.push(c),
                    }
                }
                m.insert(key, v);
                match chars.next() {
                    Some(',') => continue,
                    Some('}') => break,
                    x => panic!("{x:?} in {l}"),
                }
            }
            (m, chars.collect::<String>())
        } else if rest.starts_with(' ') {
            (BTreeMap::new(), rest.to_string())
        } else {
            continue;
        };
        let v = value.trim();
        let v = match v {
            "+Inf" => f64::INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("value {v:?} in {l}")),
        };
        out.push((labels, v));
    }
    out
}

/// The one sample of `name` whose labels include every `(key, value)` of `want`.
fn one(text: &str, name: &str, want: &[(&str, &str)]) -> Sample {
    let found: Vec<Sample> = samples(text, name)
        .into_iter()
        .filter(|(l, _)| {
            want.iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}\n{text}");
    found.into_iter().next().unwrap()
}

/// The collective of harness-rank `decide`'s call `i`, as the metrics name it (its
/// `decide_call`: allreduce, allgather, reducescatter, allreduce, broadcast, over and over).
fn harness_rank_call(i: usize) -> &'static str {
    [
        "allreduce",
        "allgather",
        "reducescatter",
        "allreduce",
        "broadcast",
    ][i % 5]
}

fn has_pid(text: &str, pid: u32) -> bool {
    text.contains(&format!("pid=\"{pid}\""))
}

#[test]
fn the_exporter_counts_what_the_job_moved_and_answers_while_a_rank_is_frozen() {
    let dir = scratch("exporter");
    let shm = dir.join("shm");
    let (exp, addr) = exporter(&shm);
    // Nothing yet: no process (families without samples are not listed).
    let empty = scrape(addr);
    assert!(
        empty.contains("# TYPE ncclbpf_exporter_processes gauge"),
        "{empty}"
    );
    assert!(
        samples(&empty, "nccl_net_sent_bytes_total").is_empty(),
        "{empty}"
    );
    let (_, n) = one(&empty, "ncclbpf_exporter_processes", &[("state", "read")]);
    assert_eq!(n, 0.0);

    let recv = rank("recv", &dir, &shm, &[("RANK", "1")]);
    let send = rank("send", &dir, &shm, &[("RANK", "0")]);
    let want_bytes: usize = SIZES.iter().sum();
    let (sent, sent_msgs) = send.moved();
    let (got, got_msgs) = recv.moved();
    assert_eq!((sent, got), (want_bytes as u64, want_bytes as u64));
    assert_eq!(
        (sent_msgs, got_msgs),
        (SIZES.len() as u64, SIZES.len() as u64)
    );
    recv.expect("waiting");

    let text = scrape(addr);
    let (sp, rp) = (send.pid.to_string(), recv.pid.to_string());
    let (sl, sb) = one(&text, "nccl_net_sent_bytes_total", &[("pid", &sp)]);
    assert_eq!(sb, sent as f64, "{text}");
    let (rl, rb) = one(&text, "nccl_net_received_bytes_total", &[("pid", &rp)]);
    assert_eq!(rb, got as f64, "{text}");
    assert_eq!(
        one(&text, "nccl_net_send_ops_total", &[("pid", &sp)]).1,
        sent_msgs as f64
    );
    assert_eq!(
        one(&text, "nccl_net_recv_ops_total", &[("pid", &rp)]).1,
        got_msgs as f64
    );
    // Labels: the launcher's rank, the communicator, one connection id at both ends, the
    // peer's address and port, direction and device.
    assert_eq!((sl["rank"].as_str(), rl["rank"].as_str()), ("0", "1"));
    assert_eq!(sl["conn"], rl["conn"], "both ends of one connection");
    assert_eq!(sl["comm"], "0x0000000000001234");
    assert_eq!(sl["peer_addr"], "127.0.0.1");
    assert_eq!(
        (sl["direction"].as_str(), rl["direction"].as_str()),
        ("send", "recv")
    );
    assert_eq!(sl["device"], "0");
    assert_ne!(sl["peer_port"], rl["peer_port"]);
    // In flight: the receive that never completes; nothing at the sender.
    assert_eq!(
        one(&text, "nccl_net_inflight_requests", &[("pid", &rp)]).1,
        1.0
    );
    assert_eq!(
        one(&text, "nccl_net_inflight_requests", &[("pid", &sp)]).1,
        0.0
    );
    assert_eq!(
        one(&text, "nccl_net_waiting_seconds", &[("pid", &sp)]).1,
        0.0
    );
    assert_eq!(
        one(
            &text,
            "nccl_net_errors_total",
            &[("pid", &rp), ("kind", "request")]
        )
        .1,
        0.0
    );
    for (pid, dir) in [(&sp, "send"), (&rp, "recv")] {
        assert_eq!(
            one(
                &text,
                "nccl_net_connections",
                &[("pid", pid), ("direction", dir)]
            )
            .1,
            1.0
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (_, progress) = one(
        &text,
        "nccl_net_last_progress_timestamp_seconds",
        &[("pid", &sp)],
    );
    assert!((now - progress).abs() < 60.0, "{progress} vs {now}");
    let (_, n) = one(&text, "ncclbpf_exporter_processes", &[("state", "read")]);
    assert_eq!(n, 2.0);

    // Frozen mid-transfer: the exporter still answers, and the receiver's wait grows.
    recv.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    let frozen = scrape(addr);
    let took = t.elapsed();
    recv.signal(libc::SIGCONT);
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(
        one(&frozen, "nccl_net_received_bytes_total", &[("pid", &rp)]).1,
        got as f64
    );
    assert_eq!(
        one(&frozen, "nccl_net_inflight_requests", &[("pid", &rp)]).1,
        1.0
    );
    let (_, waited) = one(&frozen, "nccl_net_waiting_seconds", &[("pid", &rp)]);
    assert!(waited > 1.0, "{waited}\n{frozen}");

    // Processes that end leave the next scrape.
    let (spid, rpid) = (send.pid, recv.pid);
    assert!(send.finish().success());
    assert!(recv.finish().success());
    let after = scrape(addr);
    assert!(!has_pid(&after, spid) && !has_pid(&after, rpid), "{after}");
    assert!(
        samples(&after, "nccl_net_sent_bytes_total").is_empty(),
        "{after}"
    );
    // Anything else than GET /metrics.
    let e = agent()
        .get(&format!("http://{addr}/nope"))
        .call()
        .unwrap_err();
    assert!(matches!(e, ureq::Error::StatusCode(404)), "{e}");
    drop(exp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The address a process wrote to `<shm>/<pid>.metrics` (port 0).
fn port_file(shm: &Path, pid: u32) -> SocketAddr {
    let p = shm.join(format!("{pid}.metrics"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&p).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only");
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn each_rank_serves_its_own_metrics() {
    let dir = scratch("inproc");
    let shm = dir.join("shm");
    // The receiver: port 0, the chosen port in the registry. The sender: a base port plus
    // LOCAL_RANK (1).
    let port = free_port();
    let base = (port - 1).to_string();
    let recv = rank(
        "recv",
        &dir,
        &shm,
        &[("NCCL_BPF_METRICS_ADDR", "127.0.0.1:0")],
    );
    let send = rank(
        "send",
        &dir,
        &shm,
        &[("NCCL_BPF_METRICS_ADDR", &base), ("LOCAL_RANK", "1")],
    );
    let (sent, msgs) = send.moved();
    let (got, _) = recv.moved();
    recv.expect("waiting");
    let raddr = port_file(&shm, recv.pid);
    assert!(raddr.ip().is_loopback() && raddr.port() != 0, "{raddr}");
    let saddr = port_file(&shm, send.pid);
    assert_eq!(
        saddr,
        SocketAddr::from(([127, 0, 0, 1], port)),
        "port + LOCAL_RANK"
    );

    let (sp, rp) = (send.pid.to_string(), recv.pid.to_string());
    let r = scrape(raddr);
    assert_eq!(
        one(&r, "nccl_net_received_bytes_total", &[("pid", &rp)]).1,
        got as f64
    );
    assert_eq!(
        one(&r, "nccl_net_inflight_requests", &[("pid", &rp)]).1,
        1.0
    );
    assert!(!has_pid(&r, send.pid), "only its own process: {r}");
    let s = scrape(saddr);
    assert_eq!(
        one(&s, "nccl_net_sent_bytes_total", &[("pid", &sp)]).1,
        sent as f64
    );
    assert_eq!(
        one(&s, "nccl_net_send_ops_total", &[("pid", &sp)]).1,
        msgs as f64
    );
    assert!(!has_pid(&s, recv.pid), "{s}");
    // `ncclbpf status` names each process's endpoint.
    let out = Command::new(ncclbpf_harness::cli_path())
        .args(["status", "--json"])
        .arg(recv.pid.to_string())
        .arg(send.pid.to_string())
        .env("NCCL_BPF_SHM_DIR", &shm)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["processes"][0]["metrics"], raddr.to_string(), "{v}");
    assert_eq!(v["processes"][1]["metrics"], saddr.to_string(), "{v}");
    // The exporter serves the same numbers for both.
    let mut c = Command::new(ncclbpf_harness::cli_path());
    let out = c
        .args(["exporter", "--once"])
        .env("NCCL_BPF_SHM_DIR", &shm)
        .output()
        .unwrap();
    assert!(out.status.success());
    let all = String::from_utf8(out.stdout).unwrap();
    promtool(&all);
    assert_eq!(
        one(&all, "nccl_net_sent_bytes_total", &[("pid", &sp)]).1,
        sent as f64
    );
    assert_eq!(
        one(&all, "nccl_net_received_bytes_total", &[("pid", &rp)]).1,
        got as f64
    );
    drop(send);
    drop(recv);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_endpoint_stops_at_the_last_finalize() {
    let dir = scratch("finalize");
    let shm = dir.join("shm");
    let mut c = Command::new(BIN);
    c.arg("finalize")
        .env("NCCL_BPF_SHM_DIR", &shm)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_BPF_METRICS_ADDR", ":0")
        .env_remove("LOCAL_RANK");
    let mut p = Proc::start(c);
    p.expect("up");
    let addr = port_file(&shm, p.pid);
    let text = scrape(addr);
    let (_, up) = one(
        &text,
        "ncclbpf_process_readable",
        &[("pid", &p.pid.to_string())],
    );
    assert_eq!(up, 1.0);
    p.say("finalize");
    p.expect("finalized");
    assert!(
        TcpStream::connect(addr).is_err(),
        "still listening on {addr}"
    );
    assert!(
        !shm.join(format!("{}.metrics", p.pid)).exists(),
        "port file left"
    );
    assert!(p.finish().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_address_is_a_warning_and_the_job_goes_on() {
    let dir = scratch("bad");
    let out = Command::new(env!("CARGO_BIN_EXE_harness-rank"))
        .arg("probe")
        .env("NCCL_BPF_SHM_DIR", dir.join("shm"))
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_BPF_METRICS_ADDR", "no-such-host.invalid:x")
        .env_remove("NCCL_BPF_POLICY")
        .env_remove("NCCL_BPF_NET_POLICY")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("transfer ok"), "{text}");
    let warn: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("NCCL_BPF_METRICS_ADDR=\"no-such-host.invalid:x\""))
        .collect();
    assert_eq!(warn.len(), 1, "one warning: {text}");
    assert!(warn[0].contains("no metrics endpoint"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn policy(name: &str) -> String {
    ncclbpf_harness::shipped_policy(name)
        .unwrap_or_else(|| panic!("{name}.o not built (policies/build.sh)"))
        .to_string_lossy()
        .into_owned()
}

/// `ncclbpf reload PID OBJECT` on `shm`: the exit status and what it printed.
fn reload(shm: &Path, pid: u32, object: &Path) -> (Option<i32>, String) {
    let out = Command::new(ncclbpf_harness::cli_path())
        .arg("reload")
        .arg(pid.to_string())
        .arg(object)
        .env("NCCL_BPF_SHM_DIR", shm)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn policy_runs_reloads_and_op_durations() {
    let dir = scratch("policy");
    let shm = dir.join("shm");
    let (exp, addr) = exporter(&shm);
    let net_stats = policy("net_stats");
    let env = [("NCCL_BPF_NET_POLICY", net_stats.as_str())];
    let recv = rank("recv", &dir, &shm, &env);
    let send = rank("send", &dir, &shm, &env);
    let (_, msgs) = send.moved();
    recv.moved();
    recv.expect("waiting");
    // The tuner: 300 decisions of one communicator by size_aware.
    let mut c = Command::new(env!("CARGO_BIN_EXE_harness-rank"));
    c.args(["decide", "300", "0xabc"])
        .env("NCCL_BPF_SHM_DIR", &shm)
        .env("NCCL_BPF_TUNER_POLICY", policy("size_aware"))
        .env_remove("NCCL_BPF_POLICY")
        .env_remove("NCCL_BPF_NET_POLICY");
    let tuner = Proc::start(c);
    assert_eq!(tuner.line(), format!("ready pid={}", tuner.pid));

    // A reload the receiver accepts, and one it refuses (not an object).
    let bad = dir.join("bad.o");
    std::fs::write(&bad, b"not an ELF object").unwrap();
    let (code, out) = reload(&shm, recv.pid, Path::new(&net_stats));
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = reload(&shm, recv.pid, &bad);
    assert_eq!(code, Some(1), "refused: {out}");

    let text = scrape(addr);
    let (sp, rp, tp) = (
        send.pid.to_string(),
        recv.pid.to_string(),
        tuner.pid.to_string(),
    );
    // Op durations, from net_stats' histogram: one per completed request at each end (the
    // receive still pending is not among them).
    for pid in [&sp, &rp] {
        let (l, n) = one(&text, "nccl_net_op_duration_seconds_count", &[("pid", pid)]);
        assert_eq!(n, msgs as f64, "{pid}: {text}");
        let (_, inf) = one(
            &text,
            "nccl_net_op_duration_seconds_bucket",
            &[("pid", pid), ("le", "+Inf")],
        );
        assert_eq!(inf, n);
        let buckets = samples(&text, "nccl_net_op_duration_seconds_bucket");
        let mine: Vec<f64> = buckets
            .iter()
            .filter(|(b, _)| b["pid"] == *pid && b["conn"] == l["conn"])
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(mine.len(), 16);
        assert!(
            mine.windows(2).all(|w| w[0] <= w[1]),
            "cumulative: {mine:?}"
        );
    }
    // The same connection's counters as the policy counted them, exported as map words:
    // word 0 is send_bytes.
    let (l, _) = one(&text, "nccl_net_sent_bytes_total", &[("pid", &sp)]);
    let key = u64::from_str_radix(l["conn"].trim_start_matches("0x"), 16).unwrap();
    let (_, w0) = one(
        &text,
        "ncclbpf_map_value",
        &[
            ("pid", &sp),
            ("map", "net_conn_stats"),
            ("key", &key.to_string()),
            ("word", "0"),
        ],
    );
    assert_eq!(w0, SIZES.iter().sum::<usize>() as f64);
    // net_stats has a net/complete program only: it ran once per completed request at each
    // end (before the reload; the reloaded set counts on in the same slot).
    for pid in [&sp, &rp] {
        let (_, n) = one(
            &text,
            "ncclbpf_policy_runs_total",
            &[("pid", pid), ("hook", "net/complete")],
        );
        assert_eq!(n, msgs as f64, "{pid}: {text}");
    }
    assert!(
        !text.contains("hook=\"net/isend\"") && !text.contains("hook=\"net/irecv\""),
        "{text}"
    );
    // Reloads: one accepted, one refused, at the receiver only.
    let r = |pid: &str, result: &str| {
        one(
            &text,
            "ncclbpf_policy_reloads_total",
            &[("pid", pid), ("result", result)],
        )
        .1
    };
    assert_eq!((r(&rp, "ok"), r(&rp, "failed")), (1.0, 1.0), "{text}");
    assert_eq!((r(&sp, "ok"), r(&sp, "failed")), (0.0, 0.0));
    // Tuner decisions made by the policy.
    let (_, runs) = one(
        &text,
        "ncclbpf_policy_runs_total",
        &[
            ("pid", &tp),
            ("hook", "tuner"),
            ("comm", "0x0000000000000abc"),
        ],
    );
    assert_eq!(runs, 300.0, "{text}");
    let (_, live) = one(
        &text,
        "ncclbpf_tuner_contexts",
        &[("pid", &tp), ("state", "live")],
    );
    assert_eq!(live, 1.0);
    // The same decisions by collective, algorithm, protocol and whether applied: by
    // collective as harness-rank's `decide` calls them (decide_call: allreduce, allgather,
    // reducescatter, allreduce, broadcast, over and over) ...
    let decisions: Vec<Sample> = samples(&text, "nccl_tuner_decisions_total")
        .into_iter()
        .filter(|(l, _)| l["pid"] == tp)
        .collect();
    assert!(!decisions.is_empty(), "{text}");
    let mut by_coll: BTreeMap<String, f64> = BTreeMap::new();
    let mut by_choice: BTreeMap<(i32, i32, bool), f64> = BTreeMap::new();
    let algo = |a: &str| {
        let names = [
            "nccl",
            "tree",
            "ring",
            "collnetdirect",
            "collnetchain",
            "nvls",
        ];
        names
            .iter()
            .position(|n| *n == a)
            .unwrap_or_else(|| panic!("{a}")) as i32
            - 1
    };
    let proto = |p: &str| {
        let names = ["nccl", "ll", "ll128", "simple"];
        names
            .iter()
            .position(|n| *n == p)
            .unwrap_or_else(|| panic!("{p}")) as i32
            - 1
    };
    for (l, n) in &decisions {
        assert_eq!(l["comm"], "0x0000000000000abc");
        assert_eq!(l["context"], "0");
        *by_coll.entry(l["collective"].clone()).or_default() += n;
        let applied = match l["applied"].as_str() {
            "true" => true,
            "false" => false,
            x => panic!("applied={x}"),
        };
        *by_choice
            .entry((algo(&l["algorithm"]), proto(&l["protocol"]), applied))
            .or_default() += n;
    }
    let mut want: BTreeMap<String, f64> = BTreeMap::new();
    for i in 0..300 {
        let f = harness_rank_call(i);
        *want.entry(f.into()).or_default() += 1.0;
    }
    assert_eq!(by_coll, want, "{text}");
    // ... and by choice as the tuner's own summary at finalize says.
    let mut tuner = tuner;
    tuner.0.child.stdin.take();
    let summary = loop {
        let l = tuner.line();
        const AT: &str = "comm 0x0000000000000abc: algo ";
        if let Some(at) = l.find(AT) {
            // The choices, before any "; chunk sizes …" or "; channel counts …".
            let rest = &l[at + AT.len() - "algo ".len()..];
            break rest.split("; ").next().unwrap().to_string();
        }
    };
    let mut logged: BTreeMap<(i32, i32, bool), f64> = BTreeMap::new();
    for part in summary.split(", ") {
        // "algo A proto P[ (not applied)]: N"
        let (what, n) = part
            .rsplit_once(": ")
            .unwrap_or_else(|| panic!("{summary}"));
        let f: Vec<&str> = what.split(' ').collect();
        assert!(f[0] == "algo" && f[2] == "proto", "{summary}");
        logged.insert(
            (f[1].parse().unwrap(), f[3].parse().unwrap(), f.len() == 4),
            n.parse().unwrap(),
        );
    }
    assert_eq!(by_choice, logged, "{summary}\n{text}");
    assert_eq!(by_choice.values().sum::<f64>(), 300.0);
    drop((tuner, send, recv, exp));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child forked after the endpoint started (a data loader worker) that finalizes its copy of
/// the context neither stops nor holds the parent's endpoint: the parent still serves, and
/// once the parent finalizes, the port is closed although the child lives.
#[test]
fn a_forked_child_leaves_the_endpoint_to_its_parent() {
    let dir = scratch("fork");
    let shm = dir.join("shm");
    let mut c = Command::new(BIN);
    c.arg("fork")
        .arg(&dir)
        .env("NCCL_BPF_SHM_DIR", &shm)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_BPF_METRICS_ADDR", "127.0.0.1:0")
        .env_remove("LOCAL_RANK");
    let mut p = Proc::start(c);
    let l = p.line();
    let child: i32 = l
        .strip_prefix("up ")
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{l:?}"));
    let done = dir.join("child.done");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done.exists() {
        assert!(Instant::now() < deadline, "the child did not finalize");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_to_string(&done).unwrap(), "ok");
    let addr = port_file(&shm, p.pid);
    let text = scrape(addr);
    assert!(has_pid(&text, p.pid), "{text}");
    p.say("finalize");
    p.expect("finalized");
    // SAFETY: signal 0 only checks that the child is there.
    assert_eq!(unsafe { libc::kill(child, 0) }, 0, "the child lives");
    assert!(TcpStream::connect(addr).is_err(), "{addr} still open");
    assert!(p.finish().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The agreement's gauges while a rank waits for records that never come (a tuner context of a
/// 2-rank communicator whose peer never starts): state waiting, seconds growing, no epoch in
/// use yet, K and D as set; its decisions counted up to the wait.
#[test]
fn agreement_gauges_while_a_rank_waits() {
    let dir = scratch("agree");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let shm = dir.join("shm");
    let (exp, addr) = exporter(&shm);
    let mut c = Command::new(env!("CARGO_BIN_EXE_harness-rank"));
    c.args(["agree", "0", "1", dir.to_str().unwrap(), "400", "4096"])
        .args(["alone=1", "nranks=2"])
        .env("NCCL_BPF_POLICY", policy("net_autotune"))
        .env("NCCL_BPF_SHM_DIR", &shm)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_BPF_AGREEMENT_EPOCH", "32")
        .env("NCCL_BPF_AGREEMENT_DELAY", "4")
        .env("NCCL_BPF_AGREEMENT_TIMEOUT", "60")
        .env_remove("NCCL_BPF_NET_POLICY")
        .env_remove("NCCL_BPF_TUNER_POLICY")
        .env_remove("NCCL_BPF_METRICS_ADDR");
    let rank = Proc::start(c);
    let p = rank.pid.to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(addr);
        let waiting = samples(&text, "ncclbpf_agreement_state")
            .into_iter()
            .any(|(l, v)| l.get("pid") == Some(&p) && l["state"] == "waiting" && v == 1.0);
        if waiting {
            // Waited a moment: the seconds are seen growing.
            std::thread::sleep(Duration::from_millis(1200));
            break scrape(addr);
        }
        assert!(Instant::now() < deadline, "never waiting: {text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let ctx = [("pid", p.as_str()), ("comm", "0x000000000000a9ee")];
    let with = |k: &'static str, v: &'static str| {
        let mut l = ctx.to_vec();
        l.push((k, v));
        l
    };
    for (st, v) in [
        ("starting", 0.0),
        ("deciding", 0.0),
        ("waiting", 1.0),
        ("stopped", 0.0),
    ] {
        assert_eq!(
            one(&text, "ncclbpf_agreement_state", &with("state", st)).1,
            v,
            "{text}"
        );
    }
    let (_, waited) = one(&text, "ncclbpf_agreement_waiting_seconds", &ctx);
    assert!((1.0..60.0).contains(&waited), "{waited}: {text}");
    assert_eq!(
        one(&text, "ncclbpf_agreement_epoch_collectives", &ctx).1,
        32.0
    );
    assert_eq!(one(&text, "ncclbpf_agreement_delay_epochs", &ctx).1, 4.0);
    assert!(
        samples(&text, "ncclbpf_agreement_epoch").is_empty(),
        "no epoch applied yet: {text}"
    );
    // The wait is at the first decision after epoch D's end, 4 × 32 + 1: the 128 before it
    // were made (NCCL's choice: no opinion before the first agreement) and counted.
    let decided: f64 = samples(&text, "nccl_tuner_decisions_total")
        .into_iter()
        .filter(|(l, _)| l.get("pid") == Some(&p))
        .map(|(l, n)| {
            assert_eq!(
                (l["collective"].as_str(), l["algorithm"].as_str()),
                ("allreduce", "nccl"),
                "{text}"
            );
            n
        })
        .sum();
    assert_eq!(decided, 128.0, "{text}");
    assert_eq!(
        one(&text, "ncclbpf_policy_runs_total", &with("hook", "tuner")).1,
        128.0
    );
    drop((rank, exp));
    let _ = std::fs::remove_dir_all(&dir);
}
