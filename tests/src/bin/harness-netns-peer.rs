//! The far end of `tests/tests/dead_link.rs`, run inside a network namespace
//! (`ip netns exec NAME harness-netns-peer ...`) with `NCCL_SOCKET_IFNAME` naming its veth end.
//!
//! ```text
//! harness-netns-peer idle-sender <dir>       connect to dir/handle.test, send one 1 MiB pattern
//!                                            (seed 7), then hold the connection open, idle
//! harness-netns-peer receiver <dir> <bytes>  listen (dir/handle.peer), accept, then receive
//!                                            messages of up to <bytes> until the comm fails
//! ```
//!
//! Neither mode ends on its own while the connection lives: the test kills the process. So that
//! a test process that dies without killing it (SIGKILL, a crash) leaves nothing behind in the
//! namespace, the peer also exits when its stdin (a pipe from the test) reaches end of file.

use ncclbpf_harness::{Net, pattern};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// Exits the process once stdin is closed, i.e. once the test that started us is gone.
fn exit_with_parent() {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while let Ok(n) = std::io::stdin().read(&mut sink) {
            if n == 0 {
                break;
            }
        }
        std::process::exit(0);
    });
}

fn publish(dir: &Path, name: &str, handle: &[u8]) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, handle).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

fn fetch(dir: &Path, name: &str) -> [u8; 128] {
    let p = dir.join(name);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(b) = std::fs::read(&p) {
            return b.try_into().expect("128-byte handle");
        }
        assert!(Instant::now() < deadline, "no {name} from the test");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn idle_sender(dir: PathBuf) {
    let n = Net::ready(None);
    let mut h = fetch(&dir, "handle.test");
    let deadline = Instant::now() + WAIT;
    let s = loop {
        if let Some(s) = n.connect_step(0, &mut h).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "connect timed out");
    };
    let data = pattern(1 << 20, 7);
    // SAFETY: data lives until the process ends.
    let q = unsafe { n.isend(s, data.as_ptr(), data.len()) }
        .unwrap()
        .expect("send slot");
    n.wait(q, WAIT).unwrap();
    // Nothing more: the test's pending receive must be failed by keepalive alone.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn receiver(dir: PathBuf, bytes: usize) {
    let n = Net::ready(None);
    let (h, l) = n.listen(0).unwrap();
    publish(&dir, "handle.peer", &h);
    let deadline = Instant::now() + WAIT;
    let r = loop {
        if let Some(r) = n.accept_step(l).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline, "accept timed out");
    };
    n.close_listen(l).unwrap();
    // Zeroed (calloc'd) memory: only the pages a message reaches become resident.
    let mut buf = vec![0u8; bytes];
    loop {
        // SAFETY: buf outlives every request, each waited for before the next is posted.
        let q = match unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) } {
            Ok(Some(q)) => q,
            Ok(None) => continue,
            Err(e) => return eprintln!("peer: irecv failed: {}", e.name()),
        };
        loop {
            match n.test(q, false) {
                Ok(Some(_)) => break,
                Ok(None) => std::thread::sleep(Duration::from_micros(200)),
                // The test cut the link: this end fails too, sooner or later; nothing to do.
                Err(e) => return eprintln!("peer: receive failed: {}", e.name()),
            }
        }
    }
}

fn main() {
    exit_with_parent();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or_default();
    match a(0) {
        "idle-sender" => idle_sender(a(1).into()),
        "receiver" => receiver(a(1).into(), a(2).parse().expect("byte count")),
        m => panic!("unknown mode {m:?}"),
    }
}
