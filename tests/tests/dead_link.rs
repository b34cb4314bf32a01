//! A link that dies under a connection fails its pending requests with `ncclRemoteError` within
//! `NCCL_BPF_TIMEOUT`, and the rest of the process's connections keep working.
//!
//! A peer that dies is noticed at once (the kernel resets its sockets; `processes.rs`). A dead
//! link or host sends nothing at all, so only the plugin's keepalive (idle streams) and
//! `TCP_USER_TIMEOUT` (unacknowledged data) can notice it. To cut a real link the test creates a
//! network namespace with two veth pairs (one per case) and runs the peer rank
//! (`harness-netns-peer`) inside it:
//!
//! - (a) a receive is pending and nothing flows; the peer's end goes down (keepalive path);
//! - (b) a large send is in flight; the test's end then drops every packet (`tc` netem
//!   `loss 100%` on egress, or where the kernel has no netem, a `tc` ingress filter that drops
//!   the peer's ACKs): unacknowledged data (`TCP_USER_TIMEOUT` path);
//! - (c) a loopback connection of the same process, opened before the failures, still carries a
//!   checked message afterwards.
//!
//! Each case runs to its verdict and failures are reported together, so one run shows all of
//! them. `DEAD_LINK_PLUGIN_TIMEOUT=0` gives the plugin another `NCCL_BPF_TIMEOUT` while the
//! bound stays at [`TIMEOUT_S`] + [`SLACK`]: with 0 (detection off), (a) and (b) must fail.
//!
//! Needs root and iproute2. Where a namespace cannot be made, the test says so in a line
//! starting `SKIPPED dead_link:` on stderr and in `<target>/dead_link.skipped` (which
//! `scripts/test.sh` prints), and checks nothing. Its own test binary: the plugin reads the
//! environment once per process, at `init`.

use ncclbpf_harness::{Net, RecvComm, SendComm, pattern};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PEER_BIN: &str = env!("CARGO_BIN_EXE_harness-netns-peer");

/// `NCCL_BPF_TIMEOUT` for both ends, in seconds.
const TIMEOUT_S: u64 = 3;
/// How much later than the timeout an error may come: keepalive probes are whole seconds,
/// retransmission timers fire late on a loaded machine.
const SLACK: Duration = Duration::from_secs(10);
/// Case (b)'s message: large enough that it cannot all be handed to the kernel before the link
/// is cut (a 2-core machine moves about 1-2 GB/s over veth), and the socket buffers hold far
/// less, so it stays pending until the streams fail.
const BIG: usize = 1 << 30;

fn bound() -> Duration {
    Duration::from_secs(TIMEOUT_S) + SLACK
}

/// Where skip reasons go: the cargo target directory, which `scripts/test.sh` looks into.
fn skip_file() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("dead_link.skipped")
}

/// Reports that (part of) the test could not run: captured output hides a plain pass, so the
/// reason also goes to a file that `scripts/test.sh` prints.
fn skip(reason: &str) {
    let line = format!("SKIPPED dead_link: {reason}");
    eprintln!("{line}");
    let path = skip_file();
    let _ = std::fs::create_dir_all(path.parent().unwrap());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Runs a command to completion; its stderr is the error.
fn run(prog: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{prog}`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{prog} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

/// One veth pair: `test` stays in the test's namespace, `peer` lives in the new one.
struct Link {
    test: String,
    peer: String,
    test_addr: String,
    peer_addr: String,
}

/// The namespace and its links; dropping it deletes them, whatever happened in the test.
struct Netns {
    name: String,
    links: Vec<Link>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the test end deletes the pair even if the namespace is still held open.
        for l in &self.links {
            let _ = ip(&["link", "del", &l.test]);
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Creates the namespace and two veth pairs, up and addressed, in a private /30 each.
fn setup() -> Result<Netns, String> {
    let pid = std::process::id();
    let name = format!("ncclbpf-deadlink-{pid}");
    // A namespace of the same name can only be a leftover of a killed run with this pid.
    let _ = ip(&["netns", "del", &name]);
    ip(&["netns", "add", &name]).map_err(|e| format!("cannot create a network namespace: {e}"))?;
    let mut ns = Netns {
        name,
        links: vec![],
    };
    // 8 addresses per process in 10.213.0.0/16: two /30s, distinct for concurrent runs.
    let base = (pid % 8192) * 8;
    let (hi, lo) = (base >> 8, base & 0xff);
    for (i, case) in ["a", "b"].into_iter().enumerate() {
        let first = lo + 4 * i as u32;
        let link = Link {
            test: format!("nbpf{case}{pid}"),
            peer: format!("nbpf{case}{pid}p"),
            test_addr: format!("10.213.{hi}.{}", first + 1),
            peer_addr: format!("10.213.{hi}.{}", first + 2),
        };
        ip(&[
            "link", "add", &link.test, "type", "veth", "peer", "name", &link.peer, "netns",
            &ns.name,
        ])
        .map_err(|e| format!("cannot create a veth pair: {e}"))?;
        ns.links.push(link);
        let l = ns.links.last().unwrap();
        let (test_cidr, peer_cidr) = (format!("{}/30", l.test_addr), format!("{}/30", l.peer_addr));
        ip(&["addr", "add", &test_cidr, "dev", &l.test])?;
        ip(&["-n", &ns.name, "addr", "add", &peer_cidr, "dev", &l.peer])?;
        ip(&["-n", &ns.name, "link", "set", &l.peer, "up"])?;
        ip(&["link", "set", &l.test, "up"])?;
    }
    // The plugin lists only running interfaces; a veth runs once both ends are up.
    let deadline = Instant::now() + Duration::from_secs(5);
    for l in &ns.links {
        let carrier = format!("/sys/class/net/{}/carrier", l.test);
        while !std::fs::read_to_string(&carrier).is_ok_and(|s| s.trim() == "1") {
            if Instant::now() > deadline {
                return Err(format!("{} has no carrier 5 s after setup", l.test));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(ns)
}

/// A peer rank inside the namespace; killed when dropped.
struct Peer(Child);

impl Peer {
    fn start(ns: &Netns, link: &Link, args: &[&str]) -> Peer {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, PEER_BIN])
            .args(args)
            .env("NCCL_SOCKET_IFNAME", format!("={}", link.peer))
            .env("NCCL_BPF_TIMEOUT", plugin_timeout())
            // The peer exits when this pipe closes, should this process die without Drop.
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn the peer rank");
        Peer(child)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn plugin_timeout() -> String {
    std::env::var("DEAD_LINK_PLUGIN_TIMEOUT").unwrap_or_else(|_| TIMEOUT_S.to_string())
}

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-deadlink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fetch_handle(path: &Path, peer: &mut Peer) -> [u8; 128] {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(b) = std::fs::read(path) {
            return b.try_into().expect("128-byte handle");
        }
        if let Some(st) = peer.0.try_wait().unwrap() {
            panic!("the peer exited before publishing its handle: {st}");
        }
        assert!(
            Instant::now() < deadline,
            "the peer never published its handle"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs a blocking plugin call (a close) with a deadline, so a hang fails instead of blocking.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} did not return within 10 s"))
}

/// Polls `test` until the request fails (within the bound from `cut`); returns the error's name.
fn until_error(n: &Net, q: ncclbpf_harness::Request, cut: Instant, what: &str) -> &'static str {
    loop {
        match n.test(q, true) {
            Ok(None) => {}
            Ok(Some(size)) => panic!("{what} completed ({size} bytes) although the link is dead"),
            Err(e) => return e.name(),
        }
        assert!(
            cut.elapsed() < bound(),
            "{what} still pending {:?} after the link died (NCCL_BPF_TIMEOUT={})",
            bound(),
            plugin_timeout()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The first plugin log lines about failed calls since byte `from` of its log (which only grows).
fn new_log_lines(from: usize) -> String {
    let log = ncclbpf_harness::log_text();
    log.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("failed"))
        .take(3)
        .collect::<Vec<_>>()
        .join("\n")
}

/// (a) The peer's link goes down while our receive waits and nothing flows: keepalive.
fn case_a(n: &'static Net, ns: &Netns, dir: &Path) {
    let link = &ns.links[0];
    let dev = device(n, &link.test);
    let (h, l) = n.listen(dev).unwrap();
    std::fs::write(dir.join("handle.test"), h).unwrap();
    let mut peer = Peer::start(ns, link, &["idle-sender", dir.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        if let Some(r) = n.accept_step(l).unwrap() {
            break r;
        }
        if let Some(st) = peer.0.try_wait().unwrap() {
            panic!("the peer exited before connecting: {st}");
        }
        assert!(Instant::now() < deadline, "the peer never connected");
        std::thread::sleep(Duration::from_millis(1));
    };
    n.close_listen(l).unwrap();
    // One checked message proves the link carries data before it is cut.
    // Leaked: see case (b).
    let buf: &'static mut [u8] = vec![0u8; 1 << 20].leak();
    // SAFETY: buf is never freed.
    let q = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
        .unwrap()
        .expect("recv slot");
    n.wait(q, Duration::from_secs(30)).unwrap();
    assert!(*buf == pattern(1 << 20, 7)[..], "case (a): wrong data");
    // The peer now sends nothing more: this receive can only end in an error.
    // SAFETY: as above.
    let q = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
        .unwrap()
        .expect("recv slot");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        n.test(q, true),
        Ok(None),
        "the receive failed before the link was cut"
    );
    let log_from = ncclbpf_harness::log_text().len();
    ip(&["-n", &ns.name, "link", "set", &link.peer, "down"]).unwrap();
    let cut = Instant::now();
    let err = until_error(n, q, cut, "case (a): the pending receive");
    let took = cut.elapsed();
    eprintln!(
        "dead_link (a) link down, idle receive: {err} after {:.2} s\n{}",
        took.as_secs_f64(),
        new_log_lines(log_from)
    );
    assert_eq!(err, "ncclRemoteError");
    let said = new_log_lines(log_from);
    assert!(
        said.contains("stopped answering"),
        "the log does not say the peer stopped answering: {said}"
    );
    bounded("close_recv after the failure", move || n.close_recv(r)).unwrap();
    drop(peer);
}

/// How case (b) makes the link drop every packet, or why it cannot.
fn drop_everything(dev: &str) -> Result<&'static str, String> {
    let netem = run(
        "tc",
        &["qdisc", "add", "dev", dev, "root", "netem", "loss", "100%"],
    );
    let Err(netem_err) = netem else {
        return Ok("netem loss 100%");
    };
    if netem_err.starts_with("cannot run") {
        return Err(netem_err);
    }
    // Kernels without sch_netem: an ingress filter whose classic BPF program returns
    // TC_ACT_SHOT (2) for every packet drops the peer's ACKs just as silently.
    let filter = run("tc", &["qdisc", "add", "dev", dev, "clsact"]).and_then(|()| {
        run(
            "tc",
            &[
                "filter",
                "add",
                "dev",
                dev,
                "ingress",
                "bpf",
                "da",
                "bytecode",
                "1,6 0 0 2,",
            ],
        )
    });
    match filter {
        Ok(()) => Ok("tc ingress filter dropping every packet (no netem)"),
        Err(filter_err) => Err(format!("{netem_err}; fallback: {filter_err}")),
    }
}

/// (b) The link drops everything while a large send is in flight: TCP_USER_TIMEOUT.
fn case_b(n: &'static Net, ns: &Netns, dir: &Path) {
    let link = &ns.links[1];
    let dev = device(n, &link.test);
    let mut peer = Peer::start(
        ns,
        link,
        &["receiver", dir.to_str().unwrap(), &BIG.to_string()],
    );
    let mut h = fetch_handle(&dir.join("handle.peer"), &mut peer);
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        if let Some(s) = n.connect_step(dev, &mut h).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "connect to the peer timed out");
        std::thread::sleep(Duration::from_millis(1));
    };
    // Zeroed memory maps the shared zero page: a 1 GiB message that costs no resident memory.
    // Leaked, as every buffer lent to the plugin here: if a check fails while a request is
    // pending, the plugin's helper threads may still touch it.
    let data: &'static [u8] = vec![0u8; BIG].leak();
    // SAFETY: data is never freed.
    let q = unsafe { n.isend(s, data.as_ptr(), 1 << 20) }
        .unwrap()
        .expect("send slot");
    n.wait(q, Duration::from_secs(30)).unwrap();
    // SAFETY: as above.
    let q = unsafe { n.isend(s, data.as_ptr(), data.len()) }
        .unwrap()
        .expect("send slot");
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(50) {
        assert_eq!(n.test(q, true), Ok(None), "the 1 GiB send ended at once");
        std::thread::sleep(Duration::from_millis(1));
    }
    let log_from = ncclbpf_harness::log_text().len();
    let how = match drop_everything(&link.test) {
        Ok(how) => how,
        Err(reason) => {
            skip(&format!(
                "case (b) cannot make the link drop packets: {reason}"
            ));
            n.wait(q, Duration::from_secs(60)).unwrap();
            n.close_send(s).unwrap();
            return;
        }
    };
    let cut = Instant::now();
    assert_eq!(
        n.test(q, true),
        Ok(None),
        "the 1 GiB send finished before the link was cut: make BIG larger for this machine"
    );
    let err = until_error(n, q, cut, "case (b): the in-flight send");
    let took = cut.elapsed();
    eprintln!(
        "dead_link (b) {how}, send in flight: {err} after {:.2} s\n{}",
        took.as_secs_f64(),
        new_log_lines(log_from)
    );
    assert_eq!(err, "ncclRemoteError");
    let said = new_log_lines(log_from);
    assert!(
        said.contains("stopped answering"),
        "the log does not say the peer stopped answering: {said}"
    );
    bounded("close_send after the failure", move || n.close_send(s)).unwrap();
    drop(peer);
}

/// (c) The loopback connection opened before the failures still carries checked data.
fn case_c(n: &Net, s: SendComm, r: RecvComm) {
    let data = pattern(4 << 20, 11);
    assert!(
        n.transfer(s, r, &data, data.len()).unwrap() == data,
        "case (c): wrong data over loopback"
    );
    eprintln!("dead_link (c) loopback after the failures: 4 MiB transferred and checked");
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
}

fn device(n: &Net, name: &str) -> i32 {
    let count = n.devices().unwrap();
    (0..count)
        .find(|&d| n.props(d).unwrap().name == name)
        .unwrap_or_else(|| panic!("no device {name} among the plugin's {count}"))
}

#[test]
fn dead_link_fails_pending_requests_within_the_timeout() {
    let _ = std::fs::remove_file(skip_file());
    let ns = match setup() {
        Ok(ns) => ns,
        Err(reason) => return skip(&format!("{reason} (needs root and iproute2)")),
    };
    let ifnames = format!("={},{},lo", ns.links[0].test, ns.links[1].test);
    // SAFETY: the only test of this binary, and no thread of it has started the plugin yet.
    unsafe {
        std::env::set_var("NCCL_SOCKET_IFNAME", &ifnames);
        std::env::set_var("NCCL_BPF_TIMEOUT", plugin_timeout());
    }
    // 'static so that closes can run in a bounded helper thread; the process ends soon anyway.
    let n: &'static Net = Box::leak(Box::new(Net::ready(None)));
    let lo = device(n, "lo");
    let (lo_s, lo_r) = n.connect_pair(lo).unwrap();
    let dir = scratch();
    let mut failed = vec![];
    for (name, case) in [
        ("a", Box::new(|| case_a(n, &ns, &dir)) as Box<dyn Fn()>),
        ("b", Box::new(|| case_b(n, &ns, &dir))),
        ("c", Box::new(|| case_c(n, lo_s, lo_r))),
    ] {
        if catch_unwind(AssertUnwindSafe(case)).is_err() {
            failed.push(name);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failed.is_empty(),
        "failed cases: {failed:?} (messages above)"
    );
}
