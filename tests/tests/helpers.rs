//! Threads the OS refuses (a pid or thread limit, as in a container): a helper thread per
//! stream (`NCCL_BPF_IO=threads`), or the I/O engine's workers (`epoll`, `uring`). With none to
//! be had the comm fails with `ncclSystemError` and a message naming the limit, keeps no
//! request slot, leaves no thread behind, and the process carries on; an engine that got some
//! of its workers runs on those. Forced in a child process (`harness-nproc`) that drops root
//! for an unprivileged uid and caps it with `RLIMIT_NPROC`.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NPROC_BIN: &str = env!("CARGO_BIN_EXE_harness-nproc");

/// Runs `harness-nproc <uid> <extra> <mode>` with `NCCL_BPF_IO=io`; `None` when it could not
/// force the limit here (the reason is printed where cargo does not hide it).
fn run_on(io: &str, uid: u32, extra: u32, mode: &str) -> Option<String> {
    let mut child = Command::new(NPROC_BIN)
        .args([&uid.to_string(), &extra.to_string(), mode])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_BPF_IO", io)
        .env("NCCL_BPF_IO_WORKERS", "4")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("harness-nproc {mode} hung:\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let all = text(&out);
    if out.status.code() == Some(77) {
        // Straight to stderr: libtest captures print!/eprint!, not this.
        let _ = writeln!(
            std::io::stderr(),
            "SKIP helper-thread limit test ({mode}): {}",
            all.lines()
                .find_map(|l| l.strip_prefix("SKIP: "))
                .unwrap_or("?")
        );
        return None;
    }
    assert!(out.status.success(), "harness-nproc {mode} failed:\n{all}");
    assert!(all.contains(&format!("ok {mode}")), "{all}");
    Some(all)
}

fn run(uid: u32, extra: u32, mode: &str) -> Option<String> {
    run_on("threads", uid, extra, mode)
}

/// The engine's paths (on a kernel without io_uring, `uring` falls back to epoll, said in the
/// log, and the same checks hold).
fn engine_paths() -> [&'static str; 2] {
    ["epoll", "uring"]
}

#[test]
fn an_engine_without_workers_fails_the_comm_and_keeps_no_slot() {
    for (i, io) in engine_paths().into_iter().enumerate() {
        let Some(log) = run_on(io, 65532 - i as u32, 0, "pool") else {
            return;
        };
        assert!(
            log.contains("cannot start any of the 4") && log.contains("I/O worker(s)"),
            "{io}: {log}"
        );
        assert!(log.contains("raise the pid/thread limit"), "{io}: {log}");
        assert!(log.contains("(ncclSystemError)"), "{io}: {log}");
    }
}

#[test]
fn an_engine_with_some_of_its_workers_runs_on_those() {
    for (i, io) in engine_paths().into_iter().enumerate() {
        let Some(log) = run_on(io, 65530 - i as u32, 1, "pool-partial") else {
            return;
        };
        assert!(log.contains("started 1 of 4 worker(s)"), "{io}: {log}");
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn refused_send_helper_fails_the_comm_and_keeps_no_slot() {
    // Room for 2 more threads: helpers 1 and 2 of 4 start, 3 is refused; 1 and 2 are joined.
    let Some(log) = run(65534, 2, "send") else {
        return;
    };
    assert!(
        log.contains("isend failed: cannot start helper thread 3 of 4 for connection"),
        "{log}"
    );
    assert!(
        log.contains("(send): Resource temporarily unavailable"),
        "{log}"
    );
    assert!(
        log.contains("raise the pid/thread limit") && log.contains("NCCL_BPF_NSTREAMS"),
        "{log}"
    );
    assert!(log.contains("(ncclSystemError)"), "{log}");
}

#[test]
fn refused_recv_helper_fails_the_receive_with_a_system_error() {
    // Room for 5: the sender's 4 helpers and the receiver's first; its second is refused.
    let Some(log) = run(65533, 5, "recv") else {
        return;
    };
    assert!(
        log.contains("cannot start helper thread 2 of 4 for connection"),
        "{log}"
    );
    assert!(
        log.contains("(recv): Resource temporarily unavailable"),
        "{log}"
    );
    assert!(log.contains("(ncclSystemError)"), "{log}");
}
