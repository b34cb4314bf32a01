//! Connection setup cost: how long `listen` + `connect` + `accept` take per connection over
//! loopback, through the plugin's C ABI, with the connecting and the accepting side each on its
//! own thread polling as NCCL's proxy threads do.
//!
//! ```text
//! NCCL_SOCKET_IFNAME=lo cargo run --release -p ncclbpf-bench --bin setup-bench -- [--conns N]
//! ```
//! Prints the median, P90 and P99 per connection (one listen, one connect, one accept; every
//! TCP stream of the connection, `NCCL_BPF_NSTREAMS` data streams plus the control stream).

use ncclbpf_harness::Net;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let mut conns = 300usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--conns" => conns = args.next().and_then(|v| v.parse().ok()).expect("--conns N"),
            "-h" | "--help" => {
                println!(
                    "setup-bench [--conns N]: per-connection setup time of the net plugin over loopback"
                );
                return;
            }
            other => panic!("unknown argument {other} (try --help)"),
        }
    }
    if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
        // SAFETY: single-threaded here, before the plugin or any other thread starts.
        unsafe { std::env::set_var("NCCL_SOCKET_IFNAME", "lo") };
    }
    let n = Arc::new(Net::ready(None));
    let (to_conn, handles) = mpsc::channel::<[u8; 128]>();
    let (to_main, done) = mpsc::channel::<Instant>();
    let nc = Arc::clone(&n);
    let connector = std::thread::spawn(move || {
        for mut h in handles {
            let s = loop {
                if let Some(s) = nc.connect_step(0, &mut h).unwrap() {
                    break s;
                }
            };
            to_main.send(Instant::now()).unwrap();
            nc.close_send(s).unwrap();
        }
    });
    let mut times = Vec::with_capacity(conns);
    for i in 0..conns + 20 {
        let t0 = Instant::now();
        let (h, l) = n.listen(0).unwrap();
        to_conn.send(h).unwrap();
        let r = loop {
            if let Some(r) = n.accept_step(l).unwrap() {
                break r;
            }
        };
        let accepted = Instant::now();
        let connected = done.recv().unwrap();
        if i >= 20 {
            times.push(accepted.max(connected) - t0);
        }
        n.close_recv(r).unwrap();
        n.close_listen(l).unwrap();
    }
    drop(to_conn);
    connector.join().unwrap();
    times.sort();
    let streams = std::env::var("NCCL_BPF_NSTREAMS").unwrap_or_else(|_| "4 (default)".into());
    println!("| connections | data streams | median | P90 | P99 |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {conns} | {streams} | {:.1} µs | {:.1} µs | {:.1} µs |",
        percentile(&times, 0.5).as_secs_f64() * 1e6,
        percentile(&times, 0.9).as_secs_f64() * 1e6,
        percentile(&times, 0.99).as_secs_f64() * 1e6,
    );
}
