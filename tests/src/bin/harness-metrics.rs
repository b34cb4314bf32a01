//! Harness processes for the metrics tests (`tests/tests/metrics.rs`).
//!
//! ```text
//! harness-metrics recv <dir> <size>...   listen (dir/handle.0), receive one message of each size,
//!                                         print "moved <bytes> <messages>", then post one more
//!                                         receive that never completes, print "waiting" and test
//!                                         it (as NCCL's proxy would) until stdin closes
//! harness-metrics send <dir> <size>...   connect to dir/handle.0, send one message of each size,
//!                                         print "moved <bytes> <messages>", then wait for stdin to
//!                                         close
//! harness-metrics finalize               init (net v12, one context), print "up", then on a stdin
//!                                         line finalize and print "finalized"; exit on EOF
//! harness-metrics fork <dir>             as finalize, but first fork a child that finalizes its copy
//!                                         of the context at once, writes dir/child.done and lives
//!                                         30 s more (as a data loader worker forked after init);
//!                                         prints "up <child pid>"
//! ```
//!
//! Every message's contents are checked at the receiver.

use ncclbpf_harness::{Net, pattern};
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

fn publish(dir: &Path, handle: &[u8]) {
    let tmp = dir.join(".handle.0.tmp");
    std::fs::write(&tmp, handle).unwrap();
    std::fs::rename(tmp, dir.join("handle.0")).unwrap();
}

fn fetch(dir: &Path) -> [u8; 128] {
    let p = dir.join("handle.0");
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(b) = std::fs::read(&p) {
            return b.try_into().expect("128-byte handle");
        }
        assert!(Instant::now() < deadline, "no handle");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn sizes(args: &[String]) -> Vec<usize> {
    args.iter().map(|s| s.parse().expect("a size")).collect()
}

fn until_stdin_closes() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn recv(dir: PathBuf, sizes: &[usize]) {
    let n = Net::ready(None);
    let (h, l) = n.listen(0).unwrap();
    publish(&dir, &h);
    let deadline = Instant::now() + WAIT;
    let r = loop {
        if let Some(r) = n.accept_step(l).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline, "accept timed out");
    };
    n.close_listen(l).unwrap();
    let mut total = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let mut buf = vec![0u8; size];
        // SAFETY: buf outlives the wait.
        let q = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
            .unwrap()
            .expect("a free request slot");
        let got = n.wait(q, WAIT).unwrap();
        assert_eq!(got as usize, size);
        assert!(buf == pattern(size, i as u64), "message {i} differs");
        total += size;
    }
    println!("moved {total} {}", sizes.len());
    let mut never = vec![0u8; 4096];
    // SAFETY: `never` lives until the process ends.
    let q = unsafe { n.irecv(r, never.as_mut_ptr(), never.len(), false) }
        .unwrap()
        .expect("a free request slot");
    println!("waiting");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        until_stdin_closes();
        let _ = tx.send(());
    });
    while rx.try_recv().is_err() {
        match n.test(q, false) {
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => panic!("nothing was sent"),
            // The sender went first.
            Err(_) => break,
        }
    }
}

fn send(dir: PathBuf, sizes: &[usize]) {
    let n = Net::ready(None);
    let mut h = fetch(&dir);
    let deadline = Instant::now() + WAIT;
    let s = loop {
        if let Some(s) = n.connect_step(0, &mut h).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "connect timed out");
    };
    let mut total = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, i as u64);
        // SAFETY: data outlives the wait.
        let q = unsafe { n.isend(s, data.as_ptr(), data.len()) }
            .unwrap()
            .expect("a free request slot");
        n.wait(q, WAIT).unwrap();
        total += size;
    }
    println!("moved {total} {}", sizes.len());
    until_stdin_closes();
}

fn finalize() {
    let mut n = Net::ready(Some(12));
    println!("up");
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    n.finalize().unwrap();
    println!("finalized");
    until_stdin_closes();
}

fn fork(dir: PathBuf) {
    let mut n = Net::ready(Some(12));
    // SAFETY: the child only finalizes, writes a file, sleeps and _exits.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        let ok = n.finalize().is_ok();
        // Written aside and renamed, so that the test never reads it half written.
        let tmp = dir.join("child.done.tmp");
        let _ = std::fs::write(&tmp, if ok { "ok" } else { "failed" });
        let _ = std::fs::rename(&tmp, dir.join("child.done"));
        std::thread::sleep(Duration::from_secs(30));
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    println!("up {child}");
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    n.finalize().unwrap();
    println!("finalized");
    until_stdin_closes();
    // SAFETY: kill of our own child.
    unsafe { libc::kill(child, libc::SIGKILL) };
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    match a(0) {
        "recv" => recv(a(1).into(), &sizes(&args[2..])),
        "send" => send(a(1).into(), &sizes(&args[2..])),
        "finalize" => finalize(),
        "fork" => fork(a(1).into()),
        m => {
            eprintln!("harness-metrics: unknown mode {m:?}");
            std::process::exit(2);
        }
    }
}
