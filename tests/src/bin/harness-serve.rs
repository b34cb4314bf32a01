//! A long-running process with the plugin loaded, for the live-reload tests.
//!
//! ```text
//! harness-serve serve                 init, connect a loopback pair, print "ready <pid>", then
//!                                     move checked messages until stdin says "stop" (or closes);
//!                                     print "stopped <messages> <bytes>" and the plugin's log
//! harness-serve tuner <comm_id> [us [nranks]]
//!                                     init (for the control socket), open the tuner (v5) for
//!                                     communicator comm_id of `nranks` ranks (4; on min(nranks, 2)
//!                                     nodes), print "ready <pid>", then decide
//!                                     all-reduces of cycling sizes, one every `us` µs (100), until stdin
//!                                     says "stop"; print "stopped <calls>" and "channels S:N ..."
//!                                     (the decision number S from which the channel count was
//!                                     N), then the plugin's log. With nranks 1 a policy that runs
//!                                     the agreement completes it alone (its own records).
//! harness-serve tuner-only <comm_id> [us [nranks]]
//!                                     `tuner` without the net plugin (NCCL's own transport
//!                                     carries the data): only our tuner (v5) and profiler (v5/v6
//!                                     table) are initialised; after "stop" both are finalized and
//!                                     it prints "port file after finalize: yes|no" (the metrics
//!                                     endpoint's, with NCCL_BPF_METRICS_ADDR)
//! harness-serve as-uid <uid> <socket> switch to uid (and its gid), connect to the control
//!                                     socket, send "status", print what comes back
//! ```
//!
//! `serve` runs whatever the environment says (`NCCL_BPF_POLICY`, `NCCL_BPF_SHM_DIR`,
//! `NCCL_BPF_CONTROL`). Every message is a pattern that differs per message and size, received
//! into a buffer of its own and compared byte for byte: a lost, cut or corrupted message fails
//! the process (a panic, non-zero status).

use ncclbpf_harness::{Net, log_text, pattern};
use ncclnet_headers::profiler::ProfilerV5;
use std::io::{BufRead, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Inline (control stream) and chunked (data streams) messages, alternately.
const SIZES: [usize; 4] = [100, 4096, 300_000, 1 << 20];

fn serve() {
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).expect("connect a loopback pair");
    let stop = stopper();
    println!("ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let (mut messages, mut bytes) = (0u64, 0u64);
    while !stop.load(Ordering::SeqCst) {
        let size = SIZES[messages as usize % SIZES.len()];
        let data = pattern(size, messages);
        let got = n.transfer(s, r, &data, size).expect("transfer");
        assert!(
            got == data,
            "message {messages} ({size} bytes) arrived corrupted"
        );
        messages += 1;
        bytes += size as u64;
    }
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
    println!("stopped {messages} {bytes}");
    print!("{}", log_text());
    std::io::stdout().flush().unwrap();
}

/// Stops the loop when stdin says "stop" (or closes).
fn stopper() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() == "stop" => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        s.store(true, Ordering::SeqCst);
    });
    stop
}

/// Our profiler's `init` for communicator `comm_id` (its v5/v6 table), as NCCL calls it.
fn open_profiler(comm_id: u64, nranks: usize) -> (&'static ProfilerV5, *mut std::ffi::c_void) {
    static MASK: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    let (_, p) = ncclbpf_harness::newest_symbol("ncclProfiler_v", &[6, 5]).expect("a profiler");
    // SAFETY: the exported static has ProfilerV5's layout (v6 is the same), for the process.
    let table = unsafe { &*(p as *const ProfilerV5) };
    let mut ctx = std::ptr::null_mut();
    // SAFETY: NCCL's init arguments: an out-pointer, the process-wide mask, a NUL-terminated
    // name, the logger.
    let r = unsafe {
        table.init.unwrap()(
            &mut ctx,
            comm_id,
            MASK.as_ptr(),
            c"harness".as_ptr(),
            nranks.min(2) as i32,
            nranks as i32,
            0,
            ncclbpf_harness::logger(),
        )
    };
    assert!(r.is_success(), "profiler init: {r:?}");
    (table, ctx)
}

fn tuner(comm_id: u64, pause_us: u64, nranks: usize, with_net: bool) {
    let _net = with_net.then(|| Net::ready(None));
    let mut t = ncclbpf_harness::Tuner::open_comm(Some(5), comm_id, nranks, nranks.min(2))
        .expect("open the tuner");
    let profiler = (!with_net).then(|| open_profiler(comm_id, nranks));
    let stop = stopper();
    println!("ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let costs: Vec<f32> = (0..21).map(|i| 10.0 + i as f32).collect();
    let mut changes: Vec<(u64, i32)> = vec![];
    let mut calls = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let size = 1usize << (10 + calls % 12);
        let c = t
            .coll_info_for(
                ncclnet_headers::NcclFunc::ALL_REDUCE,
                size,
                1,
                0,
                &costs,
                7,
                3,
            )
            .expect("getCollInfo");
        calls += 1;
        if changes.last().is_none_or(|&(_, n)| n != c.nchannels) {
            changes.push((calls, c.nchannels));
        }
        std::thread::sleep(std::time::Duration::from_micros(pause_us));
    }
    println!("stopped {calls}");
    let list: Vec<String> = changes.iter().map(|(s, n)| format!("{s}:{n}")).collect();
    println!("channels {}", list.join(" "));
    if let Some((table, ctx)) = profiler {
        t.finalize().expect("tuner finalize");
        // SAFETY: the context this table's init made, finalized once.
        let r = unsafe { table.finalize.unwrap()(ctx) };
        assert!(r.is_success(), "profiler finalize: {r:?}");
        let port_file = shared_maps::registry_dir().join(format!("{}.metrics", std::process::id()));
        let left = if port_file.exists() { "yes" } else { "no" };
        println!("port file after finalize: {left}");
    }
    print!("{}", log_text());
    std::io::stdout().flush().unwrap();
}

fn as_uid(uid: u32, socket: &str) {
    // SAFETY: single-threaded here; setgid before setuid (after it we could not).
    let ok = unsafe { libc::setgid(uid) == 0 && libc::setuid(uid) == 0 };
    assert!(
        ok,
        "cannot switch to uid {uid}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, uid);
    let mut s = match std::os::unix::net::UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => {
            println!("connect failed: {e}");
            return;
        }
    };
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let _ = s.write_all(b"status\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    print!("{out}");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve"] => serve(),
        [mode @ ("tuner" | "tuner-only"), comm, ref rest @ ..] if rest.len() <= 2 => tuner(
            comm.parse().expect("comm id"),
            rest.first().map_or(100, |us| us.parse().expect("µs")),
            rest.get(1).map_or(4, |n| n.parse().expect("nranks")),
            mode == "tuner",
        ),
        ["as-uid", uid, socket] => as_uid(uid.parse().expect("uid"), socket),
        _ => {
            eprintln!(
                "usage: harness-serve serve | harness-serve tuner|tuner-only <comm_id> [us [nranks]] | harness-serve as-uid <uid> <socket>"
            );
            std::process::exit(2);
        }
    }
}
