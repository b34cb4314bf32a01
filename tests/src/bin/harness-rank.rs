//! One NCCL "rank" driven by the harness, for tests that need several processes.
//!
//! ```text
//! harness-rank ring <rank> <nranks> <dir> <version> <size>...   ring all-reduce, checked
//! harness-rank send-forever <dir> <version>                      connect to dir/handle.0, send forever
//! harness-rank recv-forever <dir> <version>                      listen (dir/handle.0), receive forever
//! harness-rank stall-recv <dir>                                  two receivers (dir/handle.0 moving,
//!                                                                  dir/handle.1 stalling): one message on
//!                                                                  1, then a receive there that never
//!                                                                  completes ("stuck"), while 0 receives
//!                                                                  forever
//! harness-rank stall-send <dir>                                   the peer of stall-recv: one message
//!                                                                  to 1, then sends to 0 forever (stays
//!                                                                  alive, never sends to 1 again)
//! harness-rank cycles <n>                                        n connect/close cycles, print fds/threads
//! harness-rank probe                                              one transfer, then print the plugin's log
//! harness-rank tune <version|0> <nranks> <nnodes>                 tuner decisions for a size sweep
//! harness-rank decide <calls> <comm>[,<comm>...] [<at>:<bytes>]   tuner contexts (v5) for these comm
//!                                                                  ids, <calls> collectives each (call
//!                                                                  <at> of <bytes> instead), then
//!                                                                  "ready"; finalize on a stdin line
//! harness-rank agree <rank> <nranks> <dir> <calls> <bytes> [opt=N]...
//!                                                                  a rank of a 4-process job (net v11
//!                                                                  ring + tuner v5, comm 0xa9ee): per
//!                                                                  collective a tuner decision, then a
//!                                                                  ring step of <bytes> (16x from half
//!                                                                  way); opts: ahead=N (decide N ahead
//!                                                                  of the traffic), slow=US (pause per
//!                                                                  collective), lat=US (pause before
//!                                                                  each send), alone=1 (no peers, no
//!                                                                  traffic), nranks=N (the tuner's);
//!                                                                  writes dir/decisions.<rank>
//! harness-rank job <nranks> <version> <size>...                   the demo: a ring all-reduce job of
//!                                                                  nranks processes, with timings and
//!                                                                  per-connection totals
//! ```

use ncclbpf_harness::{Net, RecvComm, SendComm, fds_and_threads, pattern};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

fn publish(dir: &Path, rank: usize, handle: &[u8]) {
    let tmp = dir.join(format!(".handle.{rank}.tmp"));
    std::fs::write(&tmp, handle).unwrap();
    std::fs::rename(tmp, dir.join(format!("handle.{rank}"))).unwrap();
}

fn fetch(dir: &Path, rank: usize) -> [u8; 128] {
    let p = dir.join(format!("handle.{rank}"));
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(b) = std::fs::read(&p) {
            return b.try_into().expect("128-byte handle");
        }
        assert!(Instant::now() < deadline, "no handle from rank {rank}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Listens (publishing the handle as `rank`), connects to `peer`'s handle, and polls both.
fn wire_up(
    n: &Net,
    dir: &Path,
    rank: usize,
    peer: Option<usize>,
    accept: bool,
) -> (Option<SendComm>, Option<RecvComm>) {
    let listen = if accept {
        let (h, l) = n.listen(0).unwrap();
        publish(dir, rank, &h);
        Some(l)
    } else {
        None
    };
    let mut handle = peer.map(|p| fetch(dir, p));
    let (mut s, mut r) = (None, None);
    let deadline = Instant::now() + WAIT;
    while (handle.is_some() && s.is_none()) || (listen.is_some() && r.is_none()) {
        if let (Some(h), None) = (handle.as_mut(), s) {
            s = n.connect_step(0, h).unwrap();
        }
        if let (Some(l), None) = (listen, r) {
            r = n.accept_step(l).unwrap();
        }
        assert!(Instant::now() < deadline, "wire-up timed out");
    }
    if let Some(l) = listen {
        n.close_listen(l).unwrap();
    }
    handle.take();
    (s, r)
}

fn value(rank: usize, i: usize) -> u32 {
    (rank as u32 + 1)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(i as u32 * 7)
}

fn ring(rank: usize, nranks: usize, dir: PathBuf, version: u32, sizes: &[usize]) {
    let n = Net::ready(Some(version));
    let (s, r) = wire_up(&n, &dir, rank, Some((rank + 1) % nranks), true);
    let (s, r) = (s.unwrap(), r.unwrap());
    let verbose = std::env::var_os("HARNESS_VERBOSE").is_some();
    for &bytes in sizes {
        let count = bytes / 4;
        let mut data: Vec<u32> = (0..count).map(|i| value(rank, i)).collect();
        let seg = count.div_ceil(nranks);
        let bounds = |k: usize| (k * seg).min(count)..((k + 1) * seg).min(count);
        let mut inbox = vec![0u32; seg.max(1)];
        let mut exchange = |data: &mut Vec<u32>, send_seg: usize, recv_seg: usize, reduce: bool| {
            let sb = bounds(send_seg);
            let rb = bounds(recv_seg);
            let out: Vec<u8> = data[sb].iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut inb = vec![0u8; rb.len() * 4];
            // SAFETY: both buffers outlive the waits below.
            let rq = unsafe { n.irecv(r, inb.as_mut_ptr(), inb.len(), false) }
                .unwrap()
                .unwrap();
            // SAFETY: as above: what the call reads and writes outlives it.
            let sq = unsafe { n.isend(s, out.as_ptr(), out.len()) }
                .unwrap()
                .unwrap();
            n.wait(sq, WAIT).unwrap();
            assert_eq!(n.wait(rq, WAIT).unwrap() as usize, inb.len());
            for (k, c) in inb.chunks_exact(4).enumerate() {
                inbox[k] = u32::from_le_bytes(c.try_into().unwrap());
            }
            for (k, i) in rb.enumerate() {
                data[i] = if reduce {
                    data[i].wrapping_add(inbox[k])
                } else {
                    inbox[k]
                };
            }
        };
        let started = Instant::now();
        for step in 0..nranks - 1 {
            let send_seg = (rank + nranks - step) % nranks;
            let recv_seg = (rank + nranks - step - 1) % nranks;
            exchange(&mut data, send_seg, recv_seg, true);
        }
        for step in 0..nranks - 1 {
            let send_seg = (rank + 1 + nranks - step) % nranks;
            let recv_seg = (rank + nranks - step) % nranks;
            exchange(&mut data, send_seg, recv_seg, false);
        }
        let elapsed = started.elapsed();
        for (i, v) in data.iter().enumerate() {
            let want = (0..nranks).fold(0u32, |a, k| a.wrapping_add(value(k, i)));
            assert_eq!(
                *v, want,
                "rank {rank}: element {i} of {bytes}-byte all-reduce"
            );
        }
        if verbose && rank == 0 {
            let us = elapsed.as_secs_f64() * 1e6;
            let busbw = 2.0 * (nranks - 1) as f64 / nranks as f64 * bytes as f64 / us / 1e3;
            println!("{bytes:>12} B  {us:>10.1} us  busbw {busbw:>7.3} GB/s  (checked)");
        }
    }
    if verbose && std::env::var_os("NCCL_BPF_NET_POLICY").is_some() {
        // What the verified net policy counted, read from shared memory as a tool would.
        match ncclbpf_harness::read_conn_stats(std::process::id()) {
            Ok(stats) => {
                for c in stats {
                    let lat: u64 = c.lat_hist.iter().sum();
                    let p50 = median_bucket(&c.lat_hist);
                    println!(
                        "rank {rank}: policy net_stats: conn {:#018x} sent {} B in {} msgs, received {} B in {} msgs, {} errors, median latency < {} us ({} timed)",
                        c.conn_id,
                        c.send_bytes,
                        c.sends,
                        c.recv_bytes,
                        c.recvs,
                        c.errors,
                        2u64 << p50,
                        lat
                    );
                }
            }
            Err(e) => println!("rank {rank}: policy maps unreadable: {e}"),
        }
    }
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
    if verbose {
        for line in ncclbpf_harness::log_text()
            .lines()
            .filter(|l| l.contains("closed "))
        {
            let msg = line.split("NET/BPF ").nth(1).unwrap_or(line);
            println!("rank {rank}: {msg}");
        }
    }
    println!("rank {rank} ok");
}

/// The log2 bucket holding the median of a histogram.
fn median_bucket(h: &[u64; 16]) -> u32 {
    let total: u64 = h.iter().sum();
    let mut acc = 0;
    for (i, c) in h.iter().enumerate() {
        acc += c;
        if acc * 2 >= total {
            return i as u32;
        }
    }
    15
}

fn send_forever(dir: PathBuf, version: u32) {
    let n = Net::ready(Some(version));
    let (s, _) = wire_up(&n, &dir, 1, Some(0), false);
    let s = s.unwrap();
    let data = pattern(64 << 20, 1);
    loop {
        // SAFETY: data lives for the whole process.
        if let Some(q) = unsafe { n.isend(s, data.as_ptr(), data.len()) }.unwrap() {
            n.wait(q, Duration::from_secs(3600)).unwrap();
        }
    }
}

fn recv_forever(dir: PathBuf, version: u32) {
    let n = Net::ready(Some(version));
    let (_, r) = wire_up(&n, &dir, 0, None, true);
    let r = r.unwrap();
    let mut buf = vec![0u8; 64 << 20];
    loop {
        // SAFETY: buf lives for the whole process.
        if let Some(q) = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }.unwrap() {
            n.wait(q, Duration::from_secs(3600)).unwrap();
        }
    }
}

/// `stall-recv`: see the header. Prints `ready` once both connections are up and `stuck`
/// once the receive that never completes is posted; runs until killed.
fn stall_recv(dir: PathBuf) {
    let n = Net::ready(None);
    let listen = |rank| {
        let (h, l) = n.listen(0).unwrap();
        publish(&dir, rank, &h);
        l
    };
    let (l0, l1) = (listen(0), listen(1));
    let (mut moving, mut stalling) = (None, None);
    let deadline = Instant::now() + WAIT;
    while moving.is_none() || stalling.is_none() {
        if moving.is_none() {
            moving = n.accept_step(l0).unwrap();
        }
        if stalling.is_none() {
            stalling = n.accept_step(l1).unwrap();
        }
        assert!(Instant::now() < deadline, "wire-up timed out");
    }
    n.close_listen(l0).unwrap();
    n.close_listen(l1).unwrap();
    let (moving, stalling) = (moving.unwrap(), stalling.unwrap());
    println!("ready");
    let mut once = vec![0u8; 4096];
    // SAFETY: `once` outlives the wait.
    let q = unsafe { n.irecv(stalling, once.as_mut_ptr(), once.len(), false) }
        .unwrap()
        .unwrap();
    n.wait(q, WAIT).unwrap();
    let mut never = vec![0u8; 4096];
    // SAFETY: `never` lives until the process is killed.
    let stuck = unsafe { n.irecv(stalling, never.as_mut_ptr(), never.len(), false) }
        .unwrap()
        .unwrap();
    println!("stuck");
    let mut buf = vec![0u8; 1 << 20];
    // Until the peer goes away (the test kills it first): then quietly.
    let gone = |e: ncclnet_headers::NcclResult| -> ! {
        println!("peer gone: {}", e.name());
        std::process::exit(0)
    };
    loop {
        // SAFETY: buf lives for the whole process.
        let q = unsafe { n.irecv(moving, buf.as_mut_ptr(), buf.len(), false) }
            .unwrap_or_else(|e| gone(e))
            .expect("a free request slot");
        // Progressed as NCCL's proxy would: the stuck request is tested too.
        while n.test(q, false).unwrap_or_else(|e| gone(e)).is_none() {
            let done = n.test(stuck, false).unwrap_or_else(|e| gone(e));
            assert!(done.is_none(), "nothing was sent");
        }
    }
}

/// `stall-send`: see the header.
fn stall_send(dir: PathBuf) {
    let n = Net::ready(None);
    let connect = |rank| {
        let mut h = fetch(&dir, rank);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(s) = n.connect_step(0, &mut h).unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "connect timed out");
        }
    };
    let (moving, stalling) = (connect(0), connect(1));
    let once = pattern(4096, 2);
    // SAFETY: `once` outlives the wait.
    let q = unsafe { n.isend(stalling, once.as_ptr(), once.len()) }
        .unwrap()
        .unwrap();
    n.wait(q, WAIT).unwrap();
    println!("ready");
    let data = pattern(1 << 20, 1);
    loop {
        // SAFETY: data lives for the whole process.
        if let Some(q) = unsafe { n.isend(moving, data.as_ptr(), data.len()) }.unwrap() {
            n.wait(q, Duration::from_secs(3600)).unwrap();
        }
    }
}

fn cycles(count: usize) {
    let mut n = Net::ready(None);
    // Warm up once so lazily created process-wide state is not counted as a leak.
    let (s, r) = n.connect_pair(0).unwrap();
    n.transfer(s, r, &pattern(1 << 20, 0), 1 << 20).unwrap();
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
    let before = fds_and_threads();
    for i in 0..count {
        let (s, r) = n.connect_pair(0).unwrap();
        if i % 10 == 0 {
            // Start the helper threads too, so their teardown is exercised.
            n.transfer(s, r, &pattern(300_000, i as u64), 300_000)
                .unwrap();
        }
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
    n.finalize().unwrap();
    let after = fds_and_threads();
    println!("before fds={} threads={}", before.0, before.1);
    println!("after fds={} threads={}", after.0, after.1);
}

fn probe() {
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).unwrap();
    for (i, size) in [100usize, 2 << 20, 0].into_iter().enumerate() {
        let data = pattern(size, i as u64);
        assert!(n.transfer(s, r, &data, data.len()).unwrap() == data);
    }
    println!("transfer ok");
    if ["NCCL_BPF_NET_POLICY", "NCCL_BPF_POLICY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        // Read what the net policy counted before closing (its close hook forgets the conn).
        match ncclbpf_harness::read_conn_stats(std::process::id()) {
            Ok(stats) => {
                for c in stats {
                    println!(
                        "conn_stats send_bytes={} recv_bytes={} sends={} recvs={} errors={} timed={}",
                        c.send_bytes,
                        c.recv_bytes,
                        c.sends,
                        c.recvs,
                        c.errors,
                        c.lat_hist.iter().sum::<u64>()
                    );
                }
            }
            Err(e) => println!("conn_stats unreadable: {e}"),
        }
        // Every other map the policy filled, entry 0, as u64 words.
        for v in shared_maps::MapView::open_all(std::process::id()).unwrap_or_default() {
            if v.name == "net_conn_stats" {
                continue;
            }
            if let Some((_, vals)) = v.entries().into_iter().next() {
                let words: Vec<String> = vals[0]
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()).to_string())
                    .collect();
                println!("map {} [0] = {}", v.name, words.join(" "));
            }
        }
    }
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
    print!("{}", ncclbpf_harness::log_text());
}

/// NCCL-like costs: every combination usable, Simple cheapest, then LL128, then LL.
pub fn tune_costs(num_algo: usize, num_proto: usize) -> Vec<f32> {
    (0..num_algo * num_proto)
        .map(|i| 10.0 + (i / num_proto) as f32 + (num_proto - 1 - i % num_proto) as f32)
        .collect()
}

fn tune(version: u32, nranks: usize, nnodes: usize) {
    let mut t =
        ncclbpf_harness::Tuner::open((version > 0).then_some(version), nranks, nnodes).unwrap();
    let (na, np) = (7, 3);
    let costs = tune_costs(na, np);
    println!("tuner v{} ({nranks} ranks, {nnodes} nodes)", t.version);
    for bytes in [1024usize, 65536, 1 << 20, 16 << 20, 256 << 20] {
        let c = t.coll_info(bytes, &costs, na, np).unwrap();
        let (a, p) = c.picked(np).unwrap();
        let changed = c.table.iter().zip(&costs).filter(|(x, y)| x != y).count();
        println!(
            "decision bytes={bytes} algo={a} proto={p} nchannels={} changed={changed}",
            c.nchannels
        );
    }
    t.finalize().unwrap();
    print!("{}", ncclbpf_harness::log_text());
}

/// The collective and size of call `i` of `decide` (the same sequence in every process).
pub fn decide_call(i: usize) -> (ncclnet_headers::NcclFunc, usize) {
    use ncclnet_headers::NcclFunc as F;
    let colls = [
        F::ALL_REDUCE,
        F::ALL_GATHER,
        F::REDUCE_SCATTER,
        F::ALL_REDUCE,
        F::BROADCAST,
    ];
    (colls[i % colls.len()], 8 << ((i * 7) % 28))
}

/// `decide`: contexts for `comms` (several of one id: one process holding several ranks), the
/// same sequence of collectives on each, one call of another size if asked; prints `ready`,
/// waits for a line (or the end) on stdin, finalizes, prints the log.
fn decide(calls: usize, comms: &str, change: Option<&String>) {
    let parse = |s: &str| {
        s.strip_prefix("0x")
            .map_or_else(|| s.parse(), |h| u64::from_str_radix(h, 16))
            .unwrap_or_else(|e| panic!("{s:?}: {e}"))
    };
    let mut tuners: Vec<ncclbpf_harness::Tuner> = comms
        .split(',')
        .map(|c| ncclbpf_harness::Tuner::open_comm(Some(5), parse(c), 8, 2).unwrap())
        .collect();
    let change: Option<(usize, usize)> = change.map(|c| {
        let (at, bytes) = c.split_once(':').expect("<at>:<bytes>");
        (at.parse().unwrap(), bytes.parse().unwrap())
    });
    let (na, np) = (7, 3);
    let costs = tune_costs(na, np);
    for i in 0..calls {
        let (f, mut bytes) = decide_call(i);
        if let Some((at, b)) = change
            && at == i
        {
            bytes = b;
        }
        for t in &tuners {
            t.coll_info_for(f, bytes, 1, 0, &costs, na, np).unwrap();
        }
    }
    println!("ready pid={}", std::process::id());
    use std::io::BufRead;
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    for t in &mut tuners {
        t.finalize().unwrap();
    }
    print!("{}", ncclbpf_harness::log_text());
}

/// `constants V`: tuner init (v5/v6) with recognisable constants (entry i = i + 0.5); prints
/// every entry the plugin changed, then the log.
fn constants(version: u32) {
    const N: usize = 144;
    let mut a = [0f64; N];
    for (i, v) in a.iter_mut().enumerate() {
        *v = i as f64 + 0.5;
    }
    // SAFETY: TunerConstantsV5 is 144 doubles, #[repr(C)] (layout pinned by ncclnet-headers).
    let mut c: ncclnet_headers::tuner::TunerConstantsV5 = unsafe { std::mem::transmute(a) };
    let mut t = ncclbpf_harness::Tuner::open_with_constants(Some(version), 8, 4, &mut c).unwrap();
    // SAFETY: as above.
    let after: [f64; N] = unsafe { std::mem::transmute(c) };
    for i in 0..N {
        if after[i].to_bits() != a[i].to_bits() {
            println!("constant {i} {} -> {}", a[i], after[i]);
        }
    }
    t.finalize().unwrap();
    print!("{}", ncclbpf_harness::log_text());
}

/// `chunk`: getChunkSize (v6) for a few collectives; prints in and out sizes, then the log.
fn chunk() {
    let mut t = ncclbpf_harness::Tuner::open(Some(6), 8, 4).unwrap();
    // (protocol, bytes, NCCL's chunk)
    for (proto, bytes, chunk) in [
        (2, 128usize << 20, 524288usize),
        (2, 1 << 20, 131072),
        (0, 1024, 4096),
        (1, 64 << 20, 122880),
    ] {
        let out = t.chunk_size(4, bytes, 1, proto, 2, chunk).unwrap().unwrap();
        println!("chunk proto={proto} bytes={bytes} in={chunk} out={out}");
    }
    t.finalize().unwrap();
    print!("{}", ncclbpf_harness::log_text());
}

fn job(nranks: usize, version: &str, sizes: &[String]) {
    let dir = std::env::temp_dir().join(format!("ncclbpf-job-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "ring all-reduce, {nranks} ranks over loopback through the plugin (net ABI v{version}):"
    );
    let policy = std::env::var_os("NCCL_BPF_NET_POLICY")
        .or_else(|| ncclbpf_harness::shipped_policy("net_stats").map(Into::into));
    if let Some(p) = &policy {
        println!(
            "net policy: {} (verified, JIT-compiled in every rank)",
            p.to_string_lossy()
        );
    }
    let me = std::env::current_exe().unwrap();
    if let Some(tp) = std::env::var_os("NCCL_BPF_TUNER_POLICY")
        .or_else(|| ncclbpf_harness::shipped_policy("size_aware").map(Into::into))
    {
        // The tuner half of the library, as NCCL would call it for this job's all-reduces.
        let out = std::process::Command::new(&me)
            .args(["tune", "0", &nranks.to_string(), &nranks.to_string()])
            .env("NCCL_BPF_TUNER_POLICY", &tp)
            .output()
            .unwrap();
        println!(
            "tuner policy: {} — decisions for all_reduce (algo 0 tree, 1 ring; proto 0 LL, 1 LL128, 2 Simple):",
            tp.to_string_lossy()
        );
        for l in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("decision "))
        {
            println!("  {}", &l["decision ".len()..]);
        }
    }
    let kids: Vec<_> = (0..nranks)
        .map(|r| {
            std::process::Command::new(&me)
                .args([
                    "ring",
                    &r.to_string(),
                    &nranks.to_string(),
                    dir.to_str().unwrap(),
                    version,
                ])
                .args(sizes)
                .env("HARNESS_VERBOSE", "1")
                .envs(policy.iter().map(|p| ("NCCL_BPF_NET_POLICY", p.clone())))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ok = true;
    for k in kids {
        let out = k.wait_with_output().unwrap();
        print!("{}", String::from_utf8_lossy(&out.stdout));
        ok &= out.status.success();
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "a rank failed");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| {
        args.get(i)
            .unwrap_or_else(|| panic!("missing argument {i}; see the source header"))
    };
    match a(0).as_str() {
        "ring" => ring(
            a(1).parse().unwrap(),
            a(2).parse().unwrap(),
            a(3).into(),
            a(4).parse().unwrap(),
            &args[5..]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect::<Vec<usize>>(),
        ),
        "send-forever" => send_forever(a(1).into(), a(2).parse().unwrap()),
        "recv-forever" => recv_forever(a(1).into(), a(2).parse().unwrap()),
        "stall-recv" => stall_recv(a(1).into()),
        "stall-send" => stall_send(a(1).into()),
        "cycles" => cycles(a(1).parse().unwrap()),
        "probe" => probe(),
        "tune" => tune(
            a(1).parse().unwrap(),
            a(2).parse().unwrap(),
            a(3).parse().unwrap(),
        ),
        "constants" => constants(a(1).parse().unwrap()),
        "chunk" => chunk(),
        "decide" => decide(a(1).parse().unwrap(), a(2), args.get(3)),
        "job" => job(a(1).parse().unwrap(), a(2), &args[3..]),
        "agree" => agree(
            a(1).parse().unwrap(),
            a(2).parse().unwrap(),
            a(3).into(),
            a(4).parse().unwrap(),
            a(5).parse().unwrap(),
            &args[6..],
        ),
        m => panic!("unknown mode {m}"),
    }
}

/// The communicator of `agree` ranks.
const AGREE_COMM: u64 = 0xa9ee;

/// `agree`: see the header. Prints `failed at call N: …` if a decision returned an error
/// (then stops), the log, and `rank R ok`.
fn agree(rank: usize, nranks: usize, dir: PathBuf, calls: usize, bytes: usize, opts: &[String]) {
    let opt = |k: &str| -> u64 {
        opts.iter()
            .find_map(|o| o.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0)
    };
    let (ahead, slow, lat, alone) = (
        opt("ahead") as usize,
        opt("slow"),
        opt("lat"),
        opt("alone") == 1,
    );
    let mut n = Net::open(Some(11)).expect("open plugin");
    n.init(AGREE_COMM).expect("init");
    assert!(n.devices().expect("devices") >= 1);
    let ends = (!alone).then(|| {
        let (s, r) = wire_up(&n, &dir, rank, Some((rank + 1) % nranks), true);
        (s.unwrap(), r.unwrap())
    });
    // alone=1 with nranks=N: a tuner context of an N-rank communicator whose peers never come.
    let tuner_ranks = match opt("nranks") as usize {
        0 => nranks,
        n => n,
    };
    let mut t =
        ncclbpf_harness::Tuner::open_comm(Some(5), AGREE_COMM, tuner_ranks, tuner_ranks).unwrap();
    let (na, np) = (7, 3);
    let costs = tune_costs(na, np);
    let size = |i: usize| if i < calls / 2 { bytes } else { bytes * 16 };
    let mut out = vec![0u8; bytes * 16];
    let mut inb = vec![0u8; bytes * 16];
    let mut decided = 0;
    let mut lines = String::new();
    let mut failed = None;
    'calls: for i in 0..calls {
        while decided < calls && decided <= i + ahead {
            match t.coll_info(size(decided), &costs, na, np) {
                Ok(c) => {
                    let (a, p) = c.picked(np).map_or((-1, -1), |(a, p)| (a as i32, p as i32));
                    lines.push_str(&format!("{} {a} {p} {}\n", decided + 1, c.nchannels));
                }
                Err(e) => {
                    failed = Some(format!("failed at call {}: {}", decided + 1, e.name()));
                    break 'calls;
                }
            }
            decided += 1;
        }
        if let Some((s, r)) = ends {
            let len = size(i);
            for (k, b) in out[..len].iter_mut().enumerate() {
                *b = (k + i + rank) as u8;
            }
            // SAFETY: both buffers outlive the waits below.
            let rq = unsafe { n.irecv(r, inb.as_mut_ptr(), len, false) }
                .unwrap()
                .unwrap();
            if lat > 0 {
                std::thread::sleep(Duration::from_micros(lat));
            }
            // SAFETY: `out` outlives the wait below too.
            let sq = unsafe { n.isend(s, out.as_ptr(), len) }.unwrap().unwrap();
            let done = n.wait(sq, WAIT).and_then(|_| n.wait(rq, WAIT));
            let got = done.unwrap_or_else(|e| {
                print!("{}", ncclbpf_harness::log_text());
                panic!("rank {rank}: step {i}: {}", e.name());
            });
            assert_eq!(got as usize, len);
            let from = (rank + nranks - 1) % nranks;
            assert!(
                inb[..len]
                    .iter()
                    .enumerate()
                    .all(|(k, &b)| b == (k + i + from) as u8),
                "rank {rank}: step {i} corrupted"
            );
        }
        if slow > 0 {
            std::thread::sleep(Duration::from_micros(slow));
        }
    }
    std::fs::write(dir.join(format!("decisions.{rank}")), &lines).unwrap();
    if let Some(f) = &failed {
        println!("{f}");
    }
    t.finalize().unwrap();
    if let Some((s, r)) = ends {
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
    print!("{}", ncclbpf_harness::log_text());
    println!("rank {rank} ok");
}
