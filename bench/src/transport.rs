//! The four ways of moving a message over loopback that `loopback` and `hooks` compare, each
//! measured in the child process the parent starts for it:
//!
//! * the plugin, through its C ABI as NCCL's proxy drives it (posted requests, `test` polled,
//!   `sched_yield` when a pass makes no progress); with or without a policy, as the parent set
//!   the child's environment;
//! * raw TCP, blocking: messages up to the plugin's inline limit whole on one stream with their
//!   8-byte size, larger ones cut over the same number of data streams as the plugin's into
//!   `max(size / streams, min_chunk)` pieces, round-robin, with no header per piece (the plugin
//!   caps its chunks at 1 MiB, puts each on its least-loaded stream and heads it with 16 bytes).
//!   Throughput: one thread per stream and side; latency: one thread per side, pieces written
//!   and then read in order;
//! * raw TCP, busy-polling: the same streams non-blocking, one thread per side driving all of
//!   them, spinning on `read`/`write`; like the plugin's driver and NCCL's proxy thread it
//!   calls `sched_yield` after a pass that moved nothing (on 2 shared cores a thread that
//!   never yields loses whole scheduler slices to its peer: milliseconds per message).
//!
//! The raw arms receive into one reused buffer per stream and carry no per-message bookkeeping:
//! they are the optimistic bound the plugin is held to.

use ncclbpf_harness::{Net, Request};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Which arm a child measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arm {
    /// The plugin with `conn_counter` attached (`NCCL_BPF_POLICY`).
    Hooks,
    /// The plugin with no program attached (the per-connection counters still run: the plugin
    /// has no setting that turns those off).
    Off,
    /// Raw TCP, blocking sockets.
    TcpBlock,
    /// Raw TCP, non-blocking sockets, busy-polled.
    TcpPoll,
    /// Raw TCP busy-polled, latency over two one-way connection sets (the ping on one, the pong
    /// on the other, as NCCL's connections and the plugin's run): each stream's ACKs then travel
    /// alone instead of riding on the reply. Not in `loopback`'s table; `arm` runs it, to tell
    /// the cost of one-way connections from the plugin's own.
    TcpPollOneWay,
}

impl Arm {
    pub const ALL: [Arm; 4] = [Arm::Hooks, Arm::Off, Arm::TcpBlock, Arm::TcpPoll];

    pub fn name(self) -> &'static str {
        match self {
            Arm::Hooks => "hooks",
            Arm::Off => "off",
            Arm::TcpBlock => "tcp-block",
            Arm::TcpPoll => "tcp-poll",
            Arm::TcpPollOneWay => "tcp-poll-one-way",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Arm::Hooks => "plugin + conn_counter",
            Arm::Off => "plugin, no policy",
            Arm::TcpBlock => "TCP blocking",
            Arm::TcpPoll => "TCP busy-poll",
            Arm::TcpPollOneWay => "TCP busy-poll, one-way connections",
        }
    }

    pub fn is_plugin(self) -> bool {
        matches!(self, Arm::Hooks | Arm::Off)
    }
}

/// The plugin's transport shape, as its settings give it.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub streams: usize,
    pub inline: usize,
    pub min_chunk: usize,
}

impl Shape {
    pub fn from_env() -> Shape {
        let (c, _) = ncclbpf_netplugin::config::Config::from_env();
        Shape {
            streams: c.nstreams as usize,
            inline: c.inline_bytes as usize,
            min_chunk: c.min_chunk as usize,
        }
    }

    fn is_inline(&self, size: usize) -> bool {
        self.streams == 0 || size <= self.inline
    }

    fn chunk(&self, size: usize) -> usize {
        size.div_ceil(self.streams.max(1))
            .max(self.min_chunk)
            .max(1)
    }

    /// The pieces `(offset, len, data stream)` of one message, starting at stream `*next`.
    fn pieces(&self, size: usize, next: &mut usize) -> Vec<(usize, usize, usize)> {
        let chunk = self.chunk(size);
        let mut out = vec![];
        let mut off = 0;
        while off < size {
            let len = chunk.min(size - off);
            out.push((off, len, *next));
            *next = (*next + 1) % self.streams;
            off += len;
        }
        out
    }

    /// Bytes each stream carries for `count` messages of `size` (index 0: the control
    /// stream, which carries inline messages with their 8-byte size).
    fn totals(&self, size: usize, count: usize, next: &mut usize) -> Vec<usize> {
        let mut t = vec![0; self.streams + 1];
        if self.is_inline(size) {
            t[0] = count * (size + 8);
        } else {
            for _ in 0..count {
                for (_, len, s) in self.pieces(size, next) {
                    t[s + 1] += len;
                }
            }
        }
        t
    }
}

/// In-flight depth of the throughput test, as NCCL's proxy keeps several steps posted; fewer
/// for the largest messages, whose buffers would otherwise take gigabytes.
pub fn depth_for(size: usize) -> usize {
    match size {
        0..=0x100_0000 => 8,
        0x100_0001..=0x400_0000 => 4,
        _ => 2,
    }
}

/// Round trips timed after `WARM` untimed ones; `budget` decides how many.
const WARM: usize = 20;

/// Timed parts of one measurement: a measurement reports the median of its parts, so that a
/// moment the shared machine took the cores away (milliseconds, for a spinning thread) costs
/// one part, not the figure.
const PARTS: usize = 10;

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One-way latency in µs: `init` sends a message and waits for the echo, `echo` receives one
/// and sends it back (on its own thread). The median over `PARTS` batches of round trips.
fn pingpong(budget: Duration, mut init: impl FnMut(), mut echo: impl FnMut() + Send) -> f64 {
    let rounds = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for _ in 0..WARM {
                echo();
            }
            let k = loop {
                match rounds.load(Ordering::Acquire) {
                    0 => std::thread::yield_now(),
                    k => break k,
                }
            };
            for _ in 0..k {
                echo();
            }
        });
        let t = Instant::now();
        for _ in 0..WARM {
            init();
        }
        let per = t.elapsed().as_nanos() / WARM as u128;
        let batch = (budget.as_nanos() / per.max(1) / PARTS as u128).clamp(2, 500_000) as usize;
        rounds.store(batch * PARTS, Ordering::Release);
        let parts = (0..PARTS)
            .map(|_| {
                let t0 = Instant::now();
                for _ in 0..batch {
                    init();
                }
                t0.elapsed().as_secs_f64() * 1e6 / batch as f64 / 2.0
            })
            .collect();
        median(parts)
    })
}

const WAIT: Duration = Duration::from_secs(120);

/// Plugin: one-way latency of `size`-byte messages (µs), over two connections (one each way).
pub fn plugin_latency(n: &Net, size: usize, budget: Duration) -> Result<f64, String> {
    let e = |e| format!("plugin: {e:?}");
    let (s1, r1) = n.connect_pair(0).map_err(e)?;
    let (s2, r2) = n.connect_pair(0).map_err(e)?;
    let mut a_out = vec![1u8; size.max(1)];
    let mut a_in = vec![0u8; size.max(1)];
    let mut b = vec![0u8; size.max(1)];
    let (po, pi, pb) = (
        a_out.as_mut_ptr() as usize,
        a_in.as_mut_ptr() as usize,
        b.as_mut_ptr() as usize,
    );
    let us = pingpong(
        budget,
        move || {
            // SAFETY: both buffers outlive their requests, waited for here; the receive is
            // posted first, as NCCL posts receives ahead.
            let rq = unsafe { n.irecv(r2, pi as *mut u8, size, false) };
            // SAFETY: as above.
            let sq = unsafe { n.isend(s1, po as *const u8, size) };
            let (rq, sq) = (rq.unwrap().unwrap(), sq.unwrap().unwrap());
            let (mut rd, mut sd) = (false, false);
            while !(rd && sd) {
                sd = sd || n.test(sq, false).unwrap().is_some();
                rd = rd || n.test(rq, true).unwrap().is_some();
                if !(rd && sd) {
                    std::thread::yield_now();
                }
            }
        },
        move || {
            // SAFETY: `b` outlives each request, waited for before the next.
            let q = unsafe { n.irecv(r1, pb as *mut u8, size, false) };
            n.wait(q.unwrap().unwrap(), WAIT).unwrap();
            // SAFETY: as above.
            let q = unsafe { n.isend(s2, pb as *const u8, size) };
            n.wait(q.unwrap().unwrap(), WAIT).unwrap();
        },
    );
    drop((a_out, a_in, b));
    for c in [s1, s2] {
        n.close_send(c).map_err(e)?;
    }
    for c in [r1, r2] {
        n.close_recv(c).map_err(e)?;
    }
    Ok(us)
}

/// Keeps `depth` requests posted until `count` are done; `post(k)` posts into slot `k`.
fn window(
    n: &Net,
    depth: usize,
    count: usize,
    want_size: bool,
    mut post: impl FnMut(usize) -> Option<Request>,
) {
    let mut q: Vec<Option<Request>> = vec![None; depth];
    let (mut posted, mut done) = (0, 0);
    while done < count {
        let before = done;
        for (k, slot) in q.iter_mut().enumerate() {
            if slot.is_none() && posted < count {
                *slot = post(k);
                posted += slot.is_some() as usize;
            }
            if let Some(req) = *slot
                && n.test(req, want_size).unwrap().is_some()
            {
                *slot = None;
                done += 1;
            }
        }
        if done == before {
            // As NCCL's proxy thread does when a pass makes no progress.
            std::thread::yield_now();
        }
    }
}

/// Plugin: throughput (GB/s) of `count` messages of `size` with `depth` posted at a time, after
/// `depth` untimed ones (which also start the helper threads); the median over parts (each
/// ends when both sides are done with it, so the pipeline drains between parts alike for
/// every arm).
pub fn plugin_throughput(n: &Net, size: usize, depth: usize, count: usize) -> Result<f64, String> {
    let e = |e| format!("plugin: {e:?}");
    let (s, r) = n.connect_pair(0).map_err(e)?;
    let (parts, per) = parts_of(count, depth);
    let go = &Barrier::new(3);
    let times = std::thread::scope(|sc| {
        sc.spawn(move || {
            let mut bufs: Vec<Vec<u8>> = (0..depth).map(|_| vec![0u8; size.max(1)]).collect();
            let ptrs: Vec<usize> = bufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
            // SAFETY: slot k's buffer is reused only once its request is done.
            let post = |k: usize| unsafe { n.irecv(r, ptrs[k] as *mut u8, size, false) }.unwrap();
            window(n, depth, depth, true, post);
            go.wait();
            for _ in 0..parts {
                window(n, depth, per, true, post);
                go.wait();
            }
            drop(bufs);
        });
        sc.spawn(move || {
            let buf = vec![7u8; size.max(1)];
            // SAFETY: `buf` outlives every request (all done before `window` returns).
            let post = |_| unsafe { n.isend(s, buf.as_ptr(), size) }.unwrap();
            window(n, depth, depth, false, post);
            go.wait();
            for _ in 0..parts {
                window(n, depth, per, false, post);
                go.wait();
            }
        });
        clock(go, parts)
    });
    n.close_send(s).map_err(e)?;
    n.close_recv(r).map_err(e)?;
    Ok(rate(&times, per * size))
}

/// How a measurement of `count` messages with `depth` in flight is cut into parts: at most
/// `PARTS`, each of at least one window. Returns (parts, messages per part).
fn parts_of(count: usize, depth: usize) -> (usize, usize) {
    let parts = (count / depth.max(1)).clamp(1, PARTS);
    (parts, count / parts)
}

/// On the timing thread: the start (every mover past its warm-up) and the end of each part (every
/// mover done with it).
fn clock(go: &Barrier, parts: usize) -> Vec<Instant> {
    let mut t = vec![];
    go.wait();
    t.push(Instant::now());
    for _ in 0..parts {
        go.wait();
        t.push(Instant::now());
    }
    t
}

/// GB/s: the median over parts of `bytes` per part.
fn rate(times: &[Instant], bytes: usize) -> f64 {
    median(
        times
            .windows(2)
            .map(|w| bytes as f64 / (w[1] - w[0]).as_secs_f64() / 1e9)
            .collect(),
    )
}

/// Raw TCP: the control stream (index 0) and `streams` data streams, both ends.
fn raw_set(streams: usize, nonblocking: bool) -> io::Result<(Vec<TcpStream>, Vec<TcpStream>)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let (mut a, mut b) = (vec![], vec![]);
    for _ in 0..=streams {
        let x = TcpStream::connect(l.local_addr()?)?;
        let (y, _) = l.accept()?;
        for s in [&x, &y] {
            s.set_nodelay(true)?;
            s.set_nonblocking(nonblocking)?;
            // The plugin's arms take NCCL_BPF_TCP_CONGESTION; raw TCP takes the same, so that
            // every arm is paced (or not) alike.
            if let Ok(cc) = std::env::var("NCCL_BPF_TCP_CONGESTION") {
                socket2::SockRef::from(s).set_tcp_congestion(cc.trim().as_bytes())?;
            }
        }
        a.push(x);
        b.push(y);
    }
    Ok((a, b))
}

/// Busy-polls non-blocking `write`s of `bufs[i]` to `socks[i]` (all at once) until done.
fn spin_write(socks: &[&TcpStream], bufs: &[&[u8]]) {
    let mut off = vec![0; bufs.len()];
    let mut left = bufs.len();
    while left > 0 {
        let mut moved = false;
        for i in 0..bufs.len() {
            if off[i] == bufs[i].len() {
                continue;
            }
            let mut s = socks[i];
            match s.write(&bufs[i][off[i]..]) {
                Ok(0) => panic!("write: peer closed"),
                Ok(m) => {
                    moved = true;
                    off[i] += m;
                    left -= (off[i] == bufs[i].len()) as usize;
                }
                Err(e) if retry(&e) => {}
                Err(e) => panic!("write: {e}"),
            }
        }
        if !moved {
            // As the plugin's driver (and NCCL's proxy thread) does after an idle pass.
            std::thread::yield_now();
        }
    }
}

/// Busy-polls non-blocking `read`s into `bufs[i]` from `socks[i]` until every one is full.
fn spin_read(socks: &[&TcpStream], bufs: &mut [&mut [u8]]) {
    let mut off = vec![0; bufs.len()];
    let mut left = bufs.len();
    while left > 0 {
        let mut moved = false;
        for i in 0..bufs.len() {
            if off[i] == bufs[i].len() {
                continue;
            }
            let mut s = socks[i];
            match s.read(&mut bufs[i][off[i]..]) {
                Ok(0) => panic!("read: peer closed"),
                Ok(m) => {
                    moved = true;
                    off[i] += m;
                    left -= (off[i] == bufs[i].len()) as usize;
                }
                Err(e) if retry(&e) => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        if !moved {
            // As the plugin's driver (and NCCL's proxy thread) does after an idle pass.
            std::thread::yield_now();
        }
    }
}

fn retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Busy-polls `totals[i]` bytes through `socks[i]` (writes from, or reads into, `buf`).
fn spin_stream(socks: &[TcpStream], totals: &[usize], buf: &mut [u8], write: bool) {
    let mut rem = totals.to_vec();
    let mut left = rem.iter().filter(|&&r| r > 0).count();
    while left > 0 {
        let mut moved = false;
        for (i, s) in socks.iter().enumerate() {
            if rem[i] == 0 {
                continue;
            }
            let k = rem[i].min(buf.len());
            let r = if write {
                (&*s).write(&buf[..k])
            } else {
                (&*s).read(&mut buf[..k])
            };
            match r {
                Ok(0) => panic!("peer closed"),
                Ok(m) => {
                    moved = true;
                    rem[i] -= m;
                    left -= (rem[i] == 0) as usize;
                }
                Err(e) if retry(&e) => {}
                Err(e) => panic!("{e}"),
            }
        }
        if !moved {
            // As the plugin's driver (and NCCL's proxy thread) does after an idle pass.
            std::thread::yield_now();
        }
    }
}

/// Blocking: `total` bytes through `s`, from or into `buf`.
fn block_stream(mut s: &TcpStream, total: usize, buf: &mut [u8], write: bool) {
    let mut rem = total;
    while rem > 0 {
        let k = rem.min(buf.len());
        if write {
            s.write_all(&buf[..k]).expect("write");
        } else {
            s.read_exact(&mut buf[..k]).expect("read");
        }
        rem -= k;
    }
}

/// Raw TCP: one-way latency (µs).
pub fn tcp_latency(
    shape: Shape,
    size: usize,
    poll: bool,
    one_way: bool,
    budget: Duration,
) -> Result<f64, String> {
    let (a, b) = raw_set(shape.streams, poll).map_err(|e| format!("raw TCP setup: {e}"))?;
    // The pong's connections: the same ones, or a second set (`c` reads what `d` writes).
    let back = if one_way {
        Some(raw_set(shape.streams, poll).map_err(|e| format!("raw TCP setup: {e}"))?)
    } else {
        None
    };
    let (c, d) = match &back {
        Some((c, d)) => (c.as_slice(), d.as_slice()),
        None => (a.as_slice(), b.as_slice()),
    };
    let inline = shape.is_inline(size);
    // Every message starts at stream 0 both ways: both ends agree without bookkeeping.
    let pieces = if inline {
        vec![]
    } else {
        shape.pieces(size, &mut 0)
    };
    let msg_len = if inline { size + 8 } else { size };
    // One round: write the message, then read one (the initiator: the echo; the echo: the
    // message, then it writes it back).
    let send = |socks: &[TcpStream], buf: &mut [u8]| {
        if inline {
            if poll {
                spin_write(&[&socks[0]], &[buf]);
            } else {
                (&socks[0]).write_all(buf).expect("write");
            }
        } else if poll {
            let ss: Vec<&TcpStream> = pieces.iter().map(|p| &socks[p.2 + 1]).collect();
            let bs: Vec<&[u8]> = pieces.iter().map(|p| &buf[p.0..p.0 + p.1]).collect();
            spin_write(&ss, &bs);
        } else {
            for &(off, len, s) in &pieces {
                (&socks[s + 1])
                    .write_all(&buf[off..off + len])
                    .expect("write");
            }
        }
    };
    let recv = |socks: &[TcpStream], buf: &mut [u8]| {
        if inline {
            if poll {
                spin_read(&[&socks[0]], &mut [buf]);
            } else {
                (&socks[0]).read_exact(buf).expect("read");
            }
        } else if poll {
            let ss: Vec<&TcpStream> = pieces.iter().map(|p| &socks[p.2 + 1]).collect();
            let mut rest = buf;
            let mut bs: Vec<&mut [u8]> = vec![];
            for p in &pieces {
                let (head, tail) = rest.split_at_mut(p.1);
                bs.push(head);
                rest = tail;
            }
            spin_read(&ss, &mut bs);
        } else {
            for &(off, len, s) in &pieces {
                (&socks[s + 1])
                    .read_exact(&mut buf[off..off + len])
                    .expect("read");
            }
        }
    };
    let mut ba = vec![1u8; msg_len];
    let mut bb = vec![0u8; msg_len];
    Ok(pingpong(
        budget,
        || {
            send(&a, &mut ba);
            recv(c, &mut ba);
        },
        || {
            recv(&b, &mut bb);
            send(d, &mut bb);
        },
    ))
}

/// Raw TCP: throughput (GB/s) of `count` messages of `size`, after `warm` untimed ones; the
/// median over parts, as for the plugin.
pub fn tcp_throughput(
    shape: Shape,
    size: usize,
    poll: bool,
    warm: usize,
    count: usize,
) -> Result<f64, String> {
    let (a, b) = raw_set(shape.streams, poll).map_err(|e| format!("raw TCP setup: {e}"))?;
    let (parts, per) = parts_of(count, warm);
    let mut next = 0;
    let warm_t = shape.totals(size, warm, &mut next);
    let part_t: Vec<Vec<usize>> = (0..parts)
        .map(|_| shape.totals(size, per, &mut next))
        .collect();
    let piece = if shape.is_inline(size) {
        size + 8
    } else {
        shape.chunk(size)
    };
    let times = if poll {
        let go = Barrier::new(3);
        std::thread::scope(|sc| {
            for (socks, write) in [(&a, true), (&b, false)] {
                let (go, warm_t, part_t) = (&go, &warm_t, &part_t);
                sc.spawn(move || {
                    let mut buf = vec![7u8; piece];
                    spin_stream(socks, warm_t, &mut buf, write);
                    go.wait();
                    for t in part_t {
                        spin_stream(socks, t, &mut buf, write);
                        go.wait();
                    }
                });
            }
            clock(&go, parts)
        })
    } else {
        let used: Vec<usize> = (0..=shape.streams)
            .filter(|&i| warm_t[i] > 0 || part_t.iter().any(|t| t[i] > 0))
            .collect();
        let go = Barrier::new(2 * used.len() + 1);
        std::thread::scope(|sc| {
            for &i in &used {
                for (socks, write) in [(&a, true), (&b, false)] {
                    let (go, w, part_t) = (&go, warm_t[i], &part_t);
                    sc.spawn(move || {
                        let mut buf = vec![7u8; piece];
                        block_stream(&socks[i], w, &mut buf, write);
                        go.wait();
                        for t in part_t {
                            block_stream(&socks[i], t[i], &mut buf, write);
                            go.wait();
                        }
                    });
                }
            }
            clock(&go, parts)
        })
    };
    Ok(rate(&times, per * size))
}

/// The count of timed messages for `total` bytes of `size`: at least two windows.
pub fn count_for(size: usize, total: usize) -> usize {
    (total / size.max(1)).max(2 * depth_for(size))
}

/// Measures `test` (`lat` or `tput`) of `size` for `arm` in this process; `n` is the loaded
/// plugin for the plugin arms.
pub fn measure(
    arm: Arm,
    n: Option<&Net>,
    test: Test,
    size: usize,
    budget: Duration,
    total: usize,
) -> Result<f64, String> {
    let shape = Shape::from_env();
    let depth = depth_for(size);
    let count = count_for(size, total);
    match (arm, test) {
        (Arm::Hooks | Arm::Off, Test::Lat) => plugin_latency(n.expect("plugin"), size, budget),
        (Arm::Hooks | Arm::Off, Test::Tput) => {
            plugin_throughput(n.expect("plugin"), size, depth, count)
        }
        (_, Test::Lat) => tcp_latency(
            shape,
            size,
            arm != Arm::TcpBlock,
            arm == Arm::TcpPollOneWay,
            budget,
        ),
        (_, Test::Tput) => tcp_throughput(shape, size, arm != Arm::TcpBlock, depth, count),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Test {
    /// One-way latency from ping-pong, µs.
    Lat,
    /// Throughput with several requests in flight, GB/s.
    Tput,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_plugins_rule() {
        let s = Shape {
            streams: 4,
            inline: 64 << 10,
            min_chunk: 64 << 10,
        };
        let mut next = 0;
        assert_eq!(
            s.pieces(128 << 10, &mut next),
            vec![(0, 65536, 0), (65536, 65536, 1)]
        );
        assert_eq!(next, 2);
        assert_eq!(s.pieces(1 << 20, &mut next).len(), 4);
        assert_eq!(s.totals(1024, 3, &mut 0), vec![3 * 1032, 0, 0, 0, 0]);
        assert_eq!(
            s.totals(128 << 10, 2, &mut 0),
            vec![0, 65536, 65536, 65536, 65536]
        );
    }
}
