//! The plugin in a process that may start only a few more threads, as in a container near its
//! pid limit: a helper thread the OS refuses must fail the comm cleanly, never hang or leak.
//!
//! ```text
//! harness-nproc <uid> <extra-threads> send    isend of 4 MiB; the sender's helpers are refused
//! harness-nproc <uid> <extra-threads> recv    4 MiB transfer; the receiver's helpers are refused
//! harness-nproc <uid> 0 pool                   isend of 4 MiB; no I/O engine worker can start
//! harness-nproc <uid> 1 pool-partial           4 MiB transfers on the one engine worker that
//!                                               could start
//! ```
//!
//! `send` and `recv` are for `NCCL_BPF_IO=threads` (a helper thread per stream); `pool` and
//! `pool-partial` for the engine's paths (`epoll`, `uring`), set by the caller.
//!
//! Root is exempt from `RLIMIT_NPROC`, so the process (started as root) switches to the
//! unprivileged `uid` first, loads the plugin, connects a pair over loopback, then sets
//! `RLIMIT_NPROC` to that uid's current task count plus `extra-threads`. It first checks that
//! the limit is really enforced here (a probe thread must be refused); where it cannot force
//! the limit it prints `SKIP: <why>` and exits with status 77.
//!
//! Prints `ok <mode>` when every check passed; a failed check panics (non-zero status).

use ncclbpf_harness::{Net, R, Request, fds_and_threads, log_text, pattern};
use std::time::{Duration, Instant};

/// Requests per comm in the plugin (`comm::SLOTS`): a leaked slot per failure would make
/// NCCL's retries see "busy" (a NULL request) after this many calls.
const SLOTS: usize = 64;
/// Over the direct limit (1 MiB: medium messages are moved by the caller, with no thread).
const BIG: usize = 4 << 20;
const SKIP: i32 = 77;

fn skip(why: &str) -> ! {
    println!("SKIP: {why}");
    std::process::exit(SKIP);
}

/// Tasks (threads) whose real uid is `uid`, over every process this pid namespace shows: what
/// the kernel counts against `RLIMIT_NPROC`.
fn tasks_of(uid: u32) -> u64 {
    let mut n = 0;
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for p in procs.flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
                continue;
            };
            let real = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u32>().ok());
            if real == Some(uid) {
                n += 1;
            }
        }
    }
    n
}

fn set_nproc(soft: u64, hard: u64) {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit with a valid struct; lowering a limit needs no privilege.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &lim) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

/// Drops root for `uid` (so `RLIMIT_NPROC` applies), or skips.
fn become_unprivileged(uid: u32) {
    // SAFETY: plain identity calls; the process has one thread here.
    unsafe {
        if libc::geteuid() != 0 {
            skip(
                "not root: this test switches to an unprivileged uid of its own, whose thread \
                 count it can control",
            );
        }
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(uid) != 0
            || libc::setuid(uid) != 0
        {
            skip(&format!(
                "cannot switch to uid {uid}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
}

/// Caps this uid at its current task count plus `extra`, after checking the cap is enforced.
fn limit_threads(uid: u32, extra: u64) {
    let now = tasks_of(uid);
    set_nproc(now, now + extra);
    match std::thread::Builder::new().spawn(|| {}) {
        Ok(t) => {
            let _ = t.join();
            skip(&format!(
                "RLIMIT_NPROC={now} (uid {uid}'s task count) did not refuse a thread here"
            ));
        }
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(libc::EAGAIN),
            "probe thread refused with {e}"
        ),
    }
    set_nproc(now + extra, now + extra);
    println!("uid {uid}: {now} task(s), RLIMIT_NPROC {}", now + extra);
}

/// Tests until done or failed; a request that does neither within 10 s is a hang.
fn settle(n: &Net, q: Request) -> R<Option<i32>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = n.test(q, true)? {
            return Ok(Some(s));
        }
        assert!(Instant::now() < deadline, "request neither done nor failed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn threads() -> usize {
    fds_and_threads().1
}

/// The thread count gets back to `want` (helpers that did start were joined, not left behind).
fn threads_back_to(want: usize) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while threads() != want {
        assert!(
            Instant::now() < deadline,
            "{} threads, {want} before the failure: helper threads left running",
            threads()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let uid: u32 = args[0].parse().expect("uid");
    let extra: u64 = args[1].parse().expect("extra threads");
    let mode = args[2].as_str();
    become_unprivileged(uid);
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).expect("connect pair over loopback");
    // Inline messages need no helper thread.
    let small = pattern(1000, 1);
    assert_eq!(n.transfer(s, r, &small, 1000).unwrap(), small);
    let data = pattern(BIG, 2);
    let mut into = vec![0u8; BIG];
    limit_threads(uid, extra);
    let before = threads();
    let want = |e: ncclnet_headers::NcclResult, what: &str| {
        assert_eq!(e.name(), "ncclSystemError", "{what}: {e:?}\n{}", log_text());
    };
    match mode {
        "send" => {
            // SAFETY: data outlives every request (the comms are closed before it is dropped).
            let e = unsafe { n.isend(s, data.as_ptr(), BIG) }
                .map(|q| q.is_some())
                .expect_err("isend of 4 MiB with no thread to spare succeeded");
            want(e, "isend");
            threads_back_to(before);
            // NCCL would go on calling. A slot kept per failure would turn these into "busy"
            // (a NULL request, which NCCL retries forever) after SLOTS calls; and the comm
            // must stay failed for small (inline) messages too.
            for k in 0..2 * SLOTS {
                let size = if k <= SLOTS { BIG } else { 100 };
                // SAFETY: as above.
                match unsafe { n.isend(s, data.as_ptr(), size) } {
                    Err(e) => want(e, "later isend"),
                    Ok(q) => panic!("isend {k} after the failure returned {q:?}"),
                }
            }
        }
        "recv" => {
            // SAFETY: into and data outlive the requests (closed below, before they drop).
            let rq = unsafe { n.irecv(r, into.as_mut_ptr(), BIG, false) }
                .unwrap()
                .expect("recv slot");
            // SAFETY: as above.
            let _sq = unsafe { n.isend(s, data.as_ptr(), BIG) }
                .expect("the sender's helpers fit under the limit")
                .expect("send slot");
            let e = settle(&n, rq).expect_err("receive of 4 MiB with no thread to spare completed");
            want(e, "test of the receive");
            for k in 0..2 * SLOTS {
                // SAFETY: as above.
                match unsafe { n.irecv(r, into.as_mut_ptr(), BIG, false) } {
                    Err(e) => want(e, "later irecv"),
                    Ok(q) => panic!("irecv {k} after the failure returned {q:?}"),
                }
            }
        }
        "pool" => {
            // SAFETY: data outlives every request (the comms are closed before it is dropped).
            let e = unsafe { n.isend(s, data.as_ptr(), BIG) }
                .map(|q| q.is_some())
                .expect_err("isend of 4 MiB with no engine worker succeeded");
            want(e, "isend");
            threads_back_to(before);
            for k in 0..2 * SLOTS {
                let size = if k <= SLOTS { BIG } else { 100 };
                // SAFETY: as above.
                match unsafe { n.isend(s, data.as_ptr(), size) } {
                    Err(e) => want(e, "later isend"),
                    Ok(q) => panic!("isend {k} after the failure returned {q:?}"),
                }
            }
        }
        "pool-partial" => {
            // Every stream of both ends on the one worker there was room for.
            for k in 0..4u64 {
                let data = pattern(BIG + k as usize, 3 + k);
                assert_eq!(n.transfer(s, r, &data, BIG + 4).unwrap(), data);
            }
        }
        m => panic!("unknown mode {m}"),
    }
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
    // The plugin's log, each distinct line once (every later call logs the same error).
    let mut seen = std::collections::HashSet::new();
    for l in log_text().lines() {
        let msg = l.split_once(" NET/BPF ").map_or(l, |(_, m)| m);
        if seen.insert(msg.to_string()) {
            println!("{l}");
        }
    }
    println!("still running after the failure; ok {mode}");
}
