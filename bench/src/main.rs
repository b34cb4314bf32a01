//! Loopback data-path benchmark: the plugin (through its C ABI, as NCCL drives it) against raw
//! TCP sockets with the same number of streams, measured in the same run.
//!
//! ```text
//! cargo run --release -p ncclbpf-bench -- [--streams N] [--seconds S]
//! ```
//! Prints a markdown table: one-way latency from ping-pong, and throughput with 8 requests in
//! flight, for both the plugin and raw TCP, with their ratio.

use ncclbpf_harness::{Net, Request};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INFLIGHT: usize = 8;

fn plugin_pingpong(n: &Arc<Net>, size: usize, iters: usize) -> f64 {
    let (s1, r1) = n.connect_pair(0).unwrap();
    let (s2, r2) = n.connect_pair(0).unwrap();
    let n2 = n.clone();
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; size.max(1)];
        for _ in 0..iters + 10 {
            // SAFETY: buf outlives each wait.
            let q = unsafe { n2.irecv(r1, buf.as_mut_ptr(), size, false) }
                .unwrap()
                .unwrap();
            n2.wait(q, Duration::from_secs(60)).unwrap();
            // SAFETY: as above.
            let q = unsafe { n2.isend(s2, buf.as_ptr(), size) }
                .unwrap()
                .unwrap();
            n2.wait(q, Duration::from_secs(60)).unwrap();
        }
    });
    let mut buf = vec![1u8; size.max(1)];
    let mut t0 = Instant::now();
    for i in 0..iters + 10 {
        if i == 10 {
            t0 = Instant::now();
        }
        // SAFETY: buf outlives each wait.
        let q = unsafe { n.isend(s1, buf.as_ptr(), size) }.unwrap().unwrap();
        n.wait(q, Duration::from_secs(60)).unwrap();
        let q = unsafe { n.irecv(r2, buf.as_mut_ptr(), size, false) }
            .unwrap()
            .unwrap();
        n.wait(q, Duration::from_secs(60)).unwrap();
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
    echo.join().unwrap();
    for c in [s1, s2] {
        n.close_send(c).unwrap();
    }
    for c in [r1, r2] {
        n.close_recv(c).unwrap();
    }
    us
}

fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    (a, b)
}

fn tcp_pingpong(size: usize, iters: usize) -> f64 {
    let (mut a1, mut b1) = tcp_pair();
    let (mut a2, mut b2) = tcp_pair();
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; size + 8];
        for _ in 0..iters + 10 {
            b1.read_exact(&mut buf).unwrap();
            a2.write_all(&buf).unwrap();
        }
    });
    // Same framing cost as the plugin: an 8-byte size before the payload.
    let mut buf = vec![1u8; size + 8];
    let mut t0 = Instant::now();
    for i in 0..iters + 10 {
        if i == 10 {
            t0 = Instant::now();
        }
        a1.write_all(&buf).unwrap();
        b2.read_exact(&mut buf).unwrap();
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
    echo.join().unwrap();
    us
}

fn plugin_stream(n: &Arc<Net>, size: usize, total: usize) -> f64 {
    let (s, r) = n.connect_pair(0).unwrap();
    let count = (total / size).max(INFLIGHT);
    let n2 = n.clone();
    let rx = std::thread::spawn(move || {
        let mut bufs: Vec<Vec<u8>> = (0..INFLIGHT).map(|_| vec![0u8; size]).collect();
        let mut q: Vec<Option<Request>> = vec![None; INFLIGHT];
        let (mut posted, mut done) = (0, 0);
        while done < count {
            let before = done;
            for k in 0..INFLIGHT {
                if q[k].is_none() && posted < count {
                    // SAFETY: bufs[k] is not reused until its request is done.
                    q[k] = unsafe { n2.irecv(r, bufs[k].as_mut_ptr(), size, false) }.unwrap();
                    posted += q[k].is_some() as usize;
                }
                if let Some(req) = q[k]
                    && n2.test(req, true).unwrap().is_some()
                {
                    q[k] = None;
                    done += 1;
                }
            }
            if done == before {
                // As NCCL's proxy thread does when a pass makes no progress.
                std::thread::yield_now();
            }
        }
        r
    });
    let buf = vec![7u8; size];
    let mut q: Vec<Option<Request>> = vec![None; INFLIGHT];
    let (mut posted, mut done) = (0, 0);
    let t0 = Instant::now();
    while done < count {
        let before = done;
        for slot in q.iter_mut() {
            if slot.is_none() && posted < count {
                // SAFETY: buf outlives every request.
                *slot = unsafe { n.isend(s, buf.as_ptr(), size) }.unwrap();
                posted += slot.is_some() as usize;
            }
            if let Some(req) = *slot
                && n.test(req, true).unwrap().is_some()
            {
                *slot = None;
                done += 1;
            }
        }
        if done == before {
            std::thread::yield_now();
        }
    }
    let r = rx.join().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
    (count * size) as f64 / secs / 1e9
}

fn tcp_stream(streams: usize, size: usize, total: usize) -> f64 {
    let streams = streams.max(1);
    let pairs: Vec<_> = (0..streams).map(|_| tcp_pair()).collect();
    let count = (total / size).max(INFLIGHT);
    let per = size.div_ceil(streams);
    let t0 = Instant::now();
    let mut threads = vec![];
    for (mut a, mut b) in pairs {
        threads.push(std::thread::spawn(move || {
            let buf = vec![7u8; per];
            for _ in 0..count {
                a.write_all(&buf).unwrap();
            }
        }));
        threads.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; per];
            for _ in 0..count {
                b.read_exact(&mut buf).unwrap();
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    (count * per * streams) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect(name))
    };
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: ncclbpf-bench [--streams N] [--total-mib M]\n  plugin vs raw TCP on loopback; NCCL_BPF_* settings apply to the plugin"
        );
        return;
    }
    let streams = opt("--streams", 4);
    let total = opt("--total-mib", 1024) << 20;
    if std::env::var_os("NCCL_BPF_NSTREAMS").is_none() {
        // SAFETY: set before the plugin is loaded, in a single-threaded program.
        unsafe { std::env::set_var("NCCL_BPF_NSTREAMS", streams.to_string()) };
    }
    let streams = std::env::var("NCCL_BPF_NSTREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(streams);
    let n = Arc::new(Net::ready(None));
    println!(
        "plugin {} (net v{}), {streams} data stream(s); raw TCP uses the same count\n",
        ncclbpf_harness::plugin_path().display(),
        n.version
    );
    println!("| test | size | plugin | raw TCP | plugin / TCP |");
    println!("|---|---:|---:|---:|---:|");
    for size in [8usize, 1024, 65536] {
        let iters = if size > 4096 { 2000 } else { 5000 };
        let p = plugin_pingpong(&n, size, iters);
        let t = tcp_pingpong(size, iters);
        println!(
            "| latency (µs, one way) | {size} B | {p:.1} | {t:.1} | {:.2} |",
            p / t
        );
    }
    for size in [65536usize, 1 << 20, 16 << 20] {
        let p = plugin_stream(&n, size, total);
        let t = tcp_stream(streams, size, total);
        println!(
            "| throughput (GB/s) | {} KiB | {p:.2} | {t:.2} | {:.2} |",
            size >> 10,
            p / t
        );
    }
}
