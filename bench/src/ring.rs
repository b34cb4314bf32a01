//! `ncclbpf-bench ring`: the demo's job. A ring all-reduce of `--nranks` processes over
//! loopback through the plugin (each process drives it as NCCL's proxy would: receive posted
//! before the send, requests polled with `test`), and the same ring over raw TCP on the same
//! number of streams, in one run; the table gives both and their ratio.
//!
//! How a size is measured, alike for both backends: buffers allocated once per size, never in
//! the timed loop; `WARM` untimed all-reduces; then `iterations(size)` timed ones, each timed
//! on its own; the figure is the median of those (rank 0's clock). Every rank checks its result
//! after the last iteration (u32 sums, wrapping). Rounds alternate the backends, so that a busy
//! moment of a shared machine does not always hit the same one; the table shows the median
//! over rounds and the least and greatest.
//!
//! The raw TCP ring is the ceiling the plugin is held to: the plugin's stream count and
//! chunking (`NCCL_BPF_NSTREAMS`, `NCCL_BPF_INLINE_BYTES`, `NCCL_BPF_MIN_CHUNK`), non-blocking
//! sockets driven by one thread per rank that reads and writes while it can and sleeps in
//! `poll(2)` when neither moves, no header per piece, no bookkeeping. Neither backend starts
//! a spinning thread per stream, so that 4 ranks on 2 cores do not spin against each other.

use crate::common::{self, Results, cell, human, spread};
use crate::loopback::ratio;
use ncclbpf_harness::{Net, RecvComm, SendComm};
use std::collections::{BTreeMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Untimed all-reduces per size before the timed ones.
const WARM: usize = 3;

/// How long a rank waits for its peers (wire-up, one exchange) before it gives up.
const WAIT: Duration = Duration::from_secs(60);

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Ranks: one process each.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub nranks: u32,
    /// Message sizes of the all-reduce (bytes, or with K/KiB, M/MiB; multiples of 4).
    #[arg(long, value_delimiter = ',', value_parser = common::parse_size,
          default_value = "8,1K,64K,1M,16M,64M")]
    pub sizes: Vec<usize>,
    /// Rounds (each backend once per round).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Data streams per connection, for the plugin (NCCL_BPF_NSTREAMS, unless the environment
    /// sets it) and the raw TCP ring.
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// The plugin's ranks run without a net policy (by default `net_stats` is attached, as the
    /// demo shows it).
    #[arg(long)]
    pub no_policy: bool,
}

/// Which way the ring's bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Plugin,
    Tcp,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Plugin => "plugin",
            Backend::Tcp => "tcp",
        }
    }
}

/// One rank, in a child process (`ncclbpf-bench ring-rank`).
#[derive(clap::Args, Clone, Debug)]
pub struct RankArgs {
    #[arg(long, value_enum)]
    pub backend: Backend,
    #[arg(long)]
    pub rank: usize,
    #[arg(long)]
    pub nranks: usize,
    /// Where the ranks publish their addresses.
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
}

/// Timed all-reduces of `size` bytes: enough to be stable, few for the largest.
pub fn iterations(size: usize) -> usize {
    ((256usize << 20) / size.max(1)).clamp(5, 100)
}

/// The value rank `rank` contributes at element `i`.
fn value(rank: usize, i: usize) -> u32 {
    (rank as u32 + 1)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(i as u32 * 7)
}

/// Element `i` after `times` all-reduces of `nranks` ranks: the sum, then multiplied by
/// `nranks` for every further all-reduce (each rank then holds the same value).
pub fn expected(nranks: usize, i: usize, times: usize) -> u32 {
    let sum = (0..nranks).fold(0u32, |a, k| a.wrapping_add(value(k, i)));
    (1..times).fold(sum, |a, _| a.wrapping_mul(nranks as u32))
}

/// The byte range of segment `k` of a `count`-element buffer cut in `nranks`.
fn segment(k: usize, count: usize, nranks: usize) -> Range<usize> {
    let seg = count.div_ceil(nranks);
    4 * (k * seg).min(count)..4 * ((k + 1) * seg).min(count)
}

/// `(&data[a], &mut data[b])` for disjoint ranges.
fn split(data: &mut [u8], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    if a.start >= b.end {
        let (lo, hi) = data.split_at_mut(a.start);
        (&hi[..a.len()], &mut lo[b])
    } else {
        let (lo, hi) = data.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.len()])
    }
}

/// A rank's two neighbours: sends to the next, receives from the previous.
pub trait Link {
    /// Sends `out` and receives `inb.len()` bytes, the receive posted first; returns when both
    /// are done.
    fn exchange(&mut self, out: &[u8], inb: &mut [u8]) -> Result<(), String>;
}

/// One all-reduce of `data` (u32, little-endian) over the ring: reduce-scatter, then
/// all-gather received in place. `inbox` holds at least one segment.
pub fn all_reduce(
    link: &mut dyn Link,
    rank: usize,
    nranks: usize,
    data: &mut [u8],
    inbox: &mut [u8],
) -> Result<(), String> {
    let count = data.len() / 4;
    for step in 0..nranks - 1 {
        let sb = segment((rank + nranks - step) % nranks, count, nranks);
        let rb = segment((rank + nranks - step - 1) % nranks, count, nranks);
        let n = rb.len();
        let (out, acc) = split(data, sb, rb);
        link.exchange(out, &mut inbox[..n])?;
        for (a, b) in acc.chunks_exact_mut(4).zip(inbox[..n].chunks_exact(4)) {
            let s = u32::from_le_bytes(a[..].try_into().unwrap())
                .wrapping_add(u32::from_le_bytes(b.try_into().unwrap()));
            a.copy_from_slice(&s.to_le_bytes());
        }
    }
    for step in 0..nranks - 1 {
        let sb = segment((rank + 1 + nranks - step) % nranks, count, nranks);
        let rb = segment((rank + nranks - step) % nranks, count, nranks);
        let (out, inb) = split(data, sb, rb);
        link.exchange(out, inb)?;
    }
    Ok(())
}

/// Runs every size over `link`; returns rank 0's median µs per size. Checks the result.
fn sizes_over(
    link: &mut dyn Link,
    rank: usize,
    nranks: usize,
    sizes: &[usize],
) -> Result<Vec<f64>, String> {
    let mut medians = vec![];
    for &size in sizes {
        if size % 4 != 0 {
            return Err(format!("{size}: not a multiple of 4 bytes (u32 elements)"));
        }
        let count = size / 4;
        let mut data: Vec<u8> = (0..count)
            .flat_map(|i| value(rank, i).to_le_bytes())
            .collect();
        let mut inbox = vec![0u8; 4 * count.div_ceil(nranks)];
        let iters = iterations(size);
        for _ in 0..WARM {
            all_reduce(link, rank, nranks, &mut data, &mut inbox)?;
        }
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            all_reduce(link, rank, nranks, &mut data, &mut inbox)?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        for (i, c) in data.chunks_exact(4).enumerate() {
            let got = u32::from_le_bytes(c.try_into().unwrap());
            let want = expected(nranks, i, WARM + iters);
            if got != want {
                return Err(format!(
                    "rank {rank}: {size}-byte all-reduce: element {i} is {got:#x}, not {want:#x}"
                ));
            }
        }
        medians.push(spread(&times).0);
    }
    Ok(medians)
}

// ---- the plugin ----

fn publish(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| format!("publish {name}: {e}"))
}

fn fetch(dir: &Path, name: &str) -> Result<Vec<u8>, String> {
    let p = dir.join(name);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(b) = std::fs::read(&p) {
            return Ok(b);
        }
        if Instant::now() > deadline {
            return Err(format!("no {} within {WAIT:?}", p.display()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct PluginLink<'a> {
    n: &'a Net,
    s: SendComm,
    r: RecvComm,
}

impl PluginLink<'_> {
    /// Listens, publishes the handle, connects to the next rank's, accepts the previous one.
    fn wire_up<'a>(
        n: &'a Net,
        dir: &Path,
        rank: usize,
        nranks: usize,
    ) -> Result<PluginLink<'a>, String> {
        let e = |what: &str, e: ncclnet_headers::NcclResult| format!("{what}: {}", e.name());
        let (h, l) = n.listen(0).map_err(|x| e("listen", x))?;
        publish(dir, &format!("handle.{rank}"), &h)?;
        let mut handle: [u8; 128] = fetch(dir, &format!("handle.{}", (rank + 1) % nranks))?
            .try_into()
            .map_err(|_| "a handle is not 128 bytes".to_string())?;
        let (mut s, mut r) = (None, None);
        let deadline = Instant::now() + WAIT;
        while s.is_none() || r.is_none() {
            if s.is_none() {
                s = n
                    .connect_step(0, &mut handle)
                    .map_err(|x| e("connect", x))?;
            }
            if r.is_none() {
                r = n.accept_step(l).map_err(|x| e("accept", x))?;
            }
            if Instant::now() > deadline {
                return Err("wire-up timed out".into());
            }
        }
        n.close_listen(l).map_err(|x| e("closeListen", x))?;
        Ok(PluginLink {
            n,
            s: s.unwrap(),
            r: r.unwrap(),
        })
    }
}

/// Ends the process: a request may still point into a buffer that returning would free.
fn fatal(msg: String) -> ! {
    eprintln!("ncclbpf-bench ring-rank: {msg}");
    std::process::exit(1)
}

impl Link for PluginLink<'_> {
    fn exchange(&mut self, out: &[u8], inb: &mut [u8]) -> Result<(), String> {
        let n = self.n;
        let deadline = Instant::now() + WAIT;
        let (mut rq, mut sq) = (None, None);
        let (mut rdone, mut sdone) = (false, false);
        while !(rdone && sdone) {
            let mut moved = false;
            if rq.is_none() && !rdone {
                // SAFETY: `inb` outlives the request: this loop returns only once it is done,
                // and an error ends the process (`fatal`) before the buffer can be freed.
                rq = unsafe { n.irecv(self.r, inb.as_mut_ptr(), inb.len(), false) }
                    .unwrap_or_else(|x| fatal(format!("irecv: {}", x.name())));
                moved |= rq.is_some();
            }
            if sq.is_none() && !sdone && rq.is_some() {
                // SAFETY: as for `inb` above.
                sq = unsafe { n.isend(self.s, out.as_ptr(), out.len()) }
                    .unwrap_or_else(|x| fatal(format!("isend: {}", x.name())));
                moved |= sq.is_some();
            }
            if let Some(q) = rq
                && n.test(q, true)
                    .unwrap_or_else(|x| fatal(format!("test: {}", x.name())))
                    .is_some()
            {
                (rq, rdone, moved) = (None, true, true);
            }
            if let Some(q) = sq
                && n.test(q, false)
                    .unwrap_or_else(|x| fatal(format!("test: {}", x.name())))
                    .is_some()
            {
                (sq, sdone, moved) = (None, true, true);
            }
            if !moved {
                if Instant::now() > deadline {
                    fatal(format!("an exchange took over {WAIT:?}"));
                }
                // As NCCL's proxy thread does when a pass makes no progress.
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

fn plugin_rank(a: &RankArgs) -> Result<(), String> {
    let n = Net::ready(None);
    let mut link = PluginLink::wire_up(&n, &a.dir, a.rank, a.nranks)?;
    let medians = sizes_over(&mut link, a.rank, a.nranks, &a.sizes)?;
    if a.rank == 0 {
        common::emit("version", n.version);
        // What the verified net policy counted, read from shared memory as a tool would.
        if std::env::var_os("NCCL_BPF_NET_POLICY").is_some() {
            let stats = ncclbpf_harness::read_conn_stats(std::process::id())?;
            for (k, c) in stats.iter().enumerate() {
                common::emit(
                    &format!("conn.{k}"),
                    format_args!(
                        "conn {:#018x}: sent {} B in {} messages, received {} B in {} messages, \
                         {} errors",
                        c.conn_id, c.send_bytes, c.sends, c.recv_bytes, c.recvs, c.errors
                    ),
                );
            }
        }
        emit_medians(&a.sizes, &medians);
    }
    n.close_send(link.s)
        .map_err(|e| format!("closeSend: {}", e.name()))?;
    n.close_recv(link.r)
        .map_err(|e| format!("closeRecv: {}", e.name()))?;
    Ok(())
}

fn emit_medians(sizes: &[usize], medians: &[f64]) {
    for (s, m) in sizes.iter().zip(medians) {
        common::emit(&format!("us.{s}"), m);
    }
}

// ---- raw TCP ----

/// The plugin's cut of a message: up to `inline` bytes whole on stream 0; larger ones in
/// pieces of `max(len / streams, min_chunk)`, round-robin over the streams from stream 0.
#[derive(Clone, Copy, Debug)]
pub struct Cut {
    pub streams: usize,
    pub inline: usize,
    pub min_chunk: usize,
}

impl Cut {
    /// The pieces of a `len`-byte message, as byte ranges per stream, in order.
    pub fn pieces(&self, len: usize) -> Vec<VecDeque<Range<usize>>> {
        let s = self.streams.max(1);
        let mut per = vec![VecDeque::new(); s];
        if len == 0 {
            return per;
        }
        if s == 1 || len <= self.inline {
            per[0].push_back(0..len);
            return per;
        }
        let chunk = len.div_ceil(s).max(self.min_chunk).max(1);
        let (mut off, mut k) = (0, 0);
        while off < len {
            let end = (off + chunk).min(len);
            per[k].push_back(off..end);
            k = (k + 1) % s;
            off = end;
        }
        per
    }
}

struct TcpLink {
    send: Vec<TcpStream>,
    recv: Vec<TcpStream>,
    cut: Cut,
}

impl TcpLink {
    /// Listens, publishes the port, opens `streams` connections to the next rank (each says
    /// its index in one byte), accepts as many from the previous one.
    fn wire_up(dir: &Path, rank: usize, nranks: usize, cut: Cut) -> Result<TcpLink, String> {
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| io("bind", e))?;
        let port = l.local_addr().map_err(|e| io("local_addr", e))?.port();
        publish(dir, &format!("port.{rank}"), port.to_string().as_bytes())?;
        let next = fetch(dir, &format!("port.{}", (rank + 1) % nranks))?;
        let next: u16 = String::from_utf8_lossy(&next)
            .parse()
            .map_err(|_| "a bad port file".to_string())?;
        let streams = cut.streams.max(1);
        let mut send = vec![];
        for k in 0..streams {
            let mut c = TcpStream::connect(("127.0.0.1", next)).map_err(|e| io("connect", e))?;
            c.write_all(&[k as u8]).map_err(|e| io("write", e))?;
            send.push(c);
        }
        let mut recv: Vec<Option<TcpStream>> = (0..streams).map(|_| None).collect();
        for _ in 0..streams {
            let (mut c, _) = l.accept().map_err(|e| io("accept", e))?;
            let mut k = [0u8];
            c.read_exact(&mut k).map_err(|e| io("read", e))?;
            *recv.get_mut(k[0] as usize).ok_or("a bad stream index")? = Some(c);
        }
        let recv: Vec<TcpStream> = recv
            .into_iter()
            .map(|c| c.ok_or("a stream missing"))
            .collect::<Result<_, _>>()?;
        for c in send.iter().chain(&recv) {
            c.set_nodelay(true).map_err(|e| io("TCP_NODELAY", e))?;
            c.set_nonblocking(true).map_err(|e| io("O_NONBLOCK", e))?;
        }
        Ok(TcpLink { send, recv, cut })
    }
}

impl Link for TcpLink {
    fn exchange(&mut self, out: &[u8], inb: &mut [u8]) -> Result<(), String> {
        let mut sq = self.cut.pieces(out.len());
        let mut rq = self.cut.pieces(inb.len());
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let deadline = Instant::now() + WAIT;
        loop {
            let mut moved = false;
            for (k, q) in rq.iter_mut().enumerate() {
                while let Some(r) = q.front_mut() {
                    match self.recv[k].read(&mut inb[r.clone()]) {
                        Ok(0) => return Err("the previous rank closed".into()),
                        Ok(m) => {
                            r.start += m;
                            moved = true;
                            if r.start == r.end {
                                q.pop_front();
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(io("read", e)),
                    }
                }
            }
            for (k, q) in sq.iter_mut().enumerate() {
                while let Some(r) = q.front_mut() {
                    match self.send[k].write(&out[r.clone()]) {
                        Ok(m) => {
                            r.start += m;
                            moved = true;
                            if r.start == r.end {
                                q.pop_front();
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(io("write", e)),
                    }
                }
            }
            let busy = |q: &[VecDeque<Range<usize>>]| q.iter().any(|p| !p.is_empty());
            if !busy(&sq) && !busy(&rq) {
                return Ok(());
            }
            if !moved {
                if Instant::now() > deadline {
                    return Err(format!("an exchange took over {WAIT:?}"));
                }
                let mut fds: Vec<libc::pollfd> = vec![];
                for (k, q) in rq.iter().enumerate() {
                    if !q.is_empty() {
                        fds.push(libc::pollfd {
                            fd: self.recv[k].as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        });
                    }
                }
                for (k, q) in sq.iter().enumerate() {
                    if !q.is_empty() {
                        fds.push(libc::pollfd {
                            fd: self.send[k].as_raw_fd(),
                            events: libc::POLLOUT,
                            revents: 0,
                        });
                    }
                }
                // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            }
        }
    }
}

fn tcp_rank(a: &RankArgs) -> Result<(), String> {
    let c = common::shape(None);
    let cut = Cut {
        streams: c.nstreams as usize,
        inline: c.inline_bytes as usize,
        min_chunk: c.min_chunk as usize,
    };
    let mut link = TcpLink::wire_up(&a.dir, a.rank, a.nranks, cut)?;
    let medians = sizes_over(&mut link, a.rank, a.nranks, &a.sizes)?;
    if a.rank == 0 {
        emit_medians(&a.sizes, &medians);
    }
    Ok(())
}

/// The child: one rank of one backend.
pub fn rank_main(a: &RankArgs) -> Result<(), String> {
    match a.backend {
        Backend::Plugin => plugin_rank(a),
        Backend::Tcp => tcp_rank(a),
    }
}

// ---- the parent ----

/// Runs one job of `nranks` children; returns rank 0's results.
fn job(
    backend: Backend,
    a: &Args,
    env: &[(&'static str, Option<String>)],
) -> Result<Results, String> {
    let dir = std::env::temp_dir().join(format!(
        "ncclbpf-ring-{}-{}-{}",
        std::process::id(),
        backend.name(),
        JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let sizes = a
        .sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let results: Vec<Result<Results, String>> = std::thread::scope(|sc| {
        let kids: Vec<_> = (0..a.nranks as usize)
            .map(|r| {
                let args: Vec<String> = [
                    "ring-rank",
                    "--backend",
                    backend.name(),
                    "--rank",
                    &r.to_string(),
                    "--nranks",
                    &a.nranks.to_string(),
                    "--dir",
                    &dir.display().to_string(),
                    "--sizes",
                    &sizes,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                sc.spawn(move || common::child(&args, env, Duration::from_secs(300)))
            })
            .collect();
        kids.into_iter()
            .map(|k| {
                k.join()
                    .unwrap_or_else(|_| Err("a rank's thread panicked".into()))
            })
            .collect()
    });
    let _ = std::fs::remove_dir_all(&dir);
    let mut first = None;
    for r in results {
        let r = r?;
        first.get_or_insert(r);
    }
    first.ok_or_else(|| "no ranks".into())
}

/// Distinguishes the temporary directories of the jobs of one process.
static JOBS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn run(a: &Args) -> Result<(), String> {
    if let Some(s) = a.sizes.iter().find(|s| *s % 4 != 0) {
        return Err(format!("{s}: sizes must be multiples of 4 bytes"));
    }
    let rounds = a.rounds.max(1);
    let mut env = common::plugin_env(Some(a.streams));
    let policy = if a.no_policy {
        None
    } else {
        Some(common::policy("net_stats")?)
    };
    env.push(("NCCL_BPF_POLICY", None));
    env.push((
        "NCCL_BPF_NET_POLICY",
        policy.as_ref().map(|p| p.display().to_string()),
    ));
    let shape = common::shape(Some(a.streams));
    let t0 = Instant::now();
    let load0 = common::load();
    let mut us: BTreeMap<(&str, usize), Vec<Option<f64>>> = BTreeMap::new();
    let mut last_plugin = None;
    let mut errors = vec![];
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [Backend::Plugin, Backend::Tcp]
        } else {
            [Backend::Tcp, Backend::Plugin]
        };
        for b in order {
            common::progress(Some(format_args!(
                "round {}/{rounds}: {}",
                round + 1,
                b.name()
            )));
            let r = job(b, a, &env);
            for &s in &a.sizes {
                let v = r
                    .as_ref()
                    .ok()
                    .and_then(|r| r.get(&format!("us.{s}"))?.parse().ok());
                us.entry((b.name(), s)).or_default().push(v);
            }
            match r {
                Ok(r) if b == Backend::Plugin => last_plugin = Some(r),
                Ok(_) => {}
                Err(e) => errors.push(format!("{} round {}: {e}", b.name(), round + 1)),
            }
        }
    }
    common::progress(None);
    let n = a.nranks as usize;
    println!(
        "ring all-reduce, {n} ranks (processes) over loopback: through the plugin (net ABI v{}, \
         {}) and over raw TCP; {} data stream(s), inline ≤ {}, min chunk {}; {}; {rounds} \
         round(s); {:.0} s, load average {load0} at start, {} at end",
        last_plugin
            .as_ref()
            .and_then(|r| r.get("version"))
            .map_or("?", String::as_str),
        policy.as_ref().map_or("no policy".into(), |p| format!(
            "net policy {}",
            p.display()
        )),
        shape.nstreams,
        human(shape.inline_bytes as usize),
        human(shape.min_chunk as usize),
        common::machine(),
        t0.elapsed().as_secs_f64(),
        common::load(),
    );
    println!(
        "each figure: the median of {WARM}+N all-reduces' N timed ones (N = 100 for small sizes, \
         5 for the largest), every result checked; cells: median (least–greatest) over rounds\n"
    );
    println!(
        "| size | timed | plugin µs (lower is better) | raw TCP µs | plugin busbw GB/s (higher \
         is better) | raw TCP busbw GB/s | plugin speed vs raw TCP (higher is better, 1 = same) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let busbw = |size: usize, us: f64| 2.0 * (n - 1) as f64 / n as f64 * size as f64 / us / 1e3;
    for &s in &a.sizes {
        let get = |b: &str| us.get(&(b, s)).cloned().unwrap_or_default();
        let ok = |v: &[Option<f64>]| v.iter().flatten().copied().collect::<Vec<f64>>();
        let (p, t) = (get("plugin"), get("tcp"));
        let bw = |v: &[Option<f64>]| ok(v).iter().map(|&u| busbw(s, u)).collect::<Vec<_>>();
        let prec = if s >= 64 << 10 { 0 } else { 1 };
        let speed = match ratio(&p, &t, &|p, t| t / p) {
            Some((m, lo, hi)) => format!("{m:.2}× ({lo:.2}–{hi:.2})"),
            None => "–".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {speed} |",
            human(s),
            iterations(s),
            cell(&ok(&p), prec),
            cell(&ok(&t), prec),
            cell(&bw(&p), 3),
            cell(&bw(&t), 3),
        );
    }
    println!(
        "\nbusbw = 2 (n − 1) / n × size / time (NCCL's all-reduce bus bandwidth); speed = raw \
         TCP time / plugin time, of the medians, and in brackets the least and greatest of one \
         round's pair"
    );
    if let Some(r) = &last_plugin {
        let conns: Vec<&String> = r
            .iter()
            .filter(|(k, _)| k.starts_with("conn."))
            .map(|(_, v)| v)
            .collect();
        if !conns.is_empty() {
            println!(
                "\nwhat the net policy counted in rank 0 (last round), read from its shared-memory \
                 map as `ncclbpf` reads it:"
            );
            for c in conns {
                println!("- {c}");
            }
        }
    }
    common::failures(&errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring of `n` in-process ranks over channels, to check the algorithm without a network.
    struct Chan {
        tx: std::sync::mpsc::Sender<Vec<u8>>,
        rx: std::sync::mpsc::Receiver<Vec<u8>>,
    }

    impl Link for Chan {
        fn exchange(&mut self, out: &[u8], inb: &mut [u8]) -> Result<(), String> {
            self.tx.send(out.to_vec()).map_err(|e| e.to_string())?;
            let m = self.rx.recv().map_err(|e| e.to_string())?;
            assert_eq!(m.len(), inb.len(), "the peer's segment has this length");
            inb.copy_from_slice(&m);
            Ok(())
        }
    }

    #[test]
    fn ring_all_reduce_sums_every_element_across_repeats() {
        for n in [2usize, 3, 4, 5] {
            for count in [1usize, 2, 3, 7, 1000] {
                // Rank r receives on channel r and sends on channel r + 1.
                let (txs, rxs): (Vec<_>, Vec<_>) =
                    (0..n).map(|_| std::sync::mpsc::channel()).unzip();
                let links: Vec<Chan> = rxs
                    .into_iter()
                    .enumerate()
                    .map(|(r, rx)| Chan {
                        tx: txs[(r + 1) % n].clone(),
                        rx,
                    })
                    .collect();
                std::thread::scope(|sc| {
                    for (rank, mut l) in links.into_iter().enumerate() {
                        sc.spawn(move || {
                            let mut data: Vec<u8> = (0..count)
                                .flat_map(|i| value(rank, i).to_le_bytes())
                                .collect();
                            let mut inbox = vec![0u8; 4 * count.div_ceil(n)];
                            for _ in 0..3 {
                                all_reduce(&mut l, rank, n, &mut data, &mut inbox).unwrap();
                            }
                            for (i, c) in data.chunks_exact(4).enumerate() {
                                let got = u32::from_le_bytes(c.try_into().unwrap());
                                assert_eq!(
                                    got,
                                    expected(n, i, 3),
                                    "n={n} count={count} rank={rank} i={i}"
                                );
                            }
                        });
                    }
                });
            }
        }
    }

    #[test]
    fn cut_follows_the_plugins_shape() {
        let c = Cut {
            streams: 4,
            inline: 64 << 10,
            min_chunk: 64 << 10,
        };
        // Inline: whole on stream 0.
        assert_eq!(c.pieces(1000)[0].iter().collect::<Vec<_>>(), [&(0..1000)]);
        // 1 MiB over 4 streams: 256 KiB each.
        let p = c.pieces(1 << 20);
        assert!(p.iter().all(|q| q.len() == 1 && q[0].len() == 256 << 10));
        // 100 KiB: pieces of at least min_chunk, so two.
        let p = c.pieces(100 << 10);
        assert_eq!(p[0].iter().collect::<Vec<_>>(), [&(0..64 << 10)]);
        assert_eq!(p[1].iter().collect::<Vec<_>>(), [&(64 << 10..100 << 10)]);
        assert!(c.pieces(0).iter().all(VecDeque::is_empty));
        // Every byte exactly once.
        let total: usize = c.pieces(10 << 20).iter().flatten().map(|r| r.len()).sum();
        assert_eq!(total, 10 << 20);
    }

    #[test]
    fn split_gives_disjoint_views() {
        let mut d: Vec<u8> = (0..10).collect();
        let (a, b) = split(&mut d, 6..8, 1..3);
        assert_eq!(a, &[6, 7]);
        assert_eq!(b, &mut [1, 2]);
        let (a, b) = split(&mut d, 0..2, 5..9);
        assert_eq!(a, &[0, 1]);
        assert_eq!(b, &mut [5, 6, 7, 8]);
    }
}
