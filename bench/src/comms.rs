//! `ncclbpf-bench comms`: what N open connections cost a process: threads, file descriptors and
//! CPU time while idle.
//!
//! Each count runs in a child process of this binary (`ncclbpf-bench comms-child`), which opens
//! N send/recv comm pairs through the plugin's C ABI (listen, then connect and accept polled
//! as NCCL's proxies do), pushes one large message (data streams, helper threads) and one
//! small one through each, counts `/proc/self/task` and `/proc/self/fd`, sleeps 1 s and takes
//! the CPU time its other threads used meanwhile (`/proc/self/task/*/schedstat`), then closes
//! everything and counts again. A limit met on the way (threads, descriptors) ends that count's opening early and is
//! reported in its row; a child that dies is a row too.

use crate::common::{self, human};
use ncclbpf_harness::{Net, fds_and_threads};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Comm pairs (one send and one receive end each) per row.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    pub counts: Vec<usize>,
    /// Data streams per connection (NCCL_BPF_NSTREAMS, unless the environment sets it).
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// Bytes of the large message pushed through every comm (above the inline limit, so that
    /// it travels on the data streams).
    #[arg(long, default_value_t = 1 << 20)]
    pub big: usize,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ChildArgs {
    #[arg(long)]
    pub count: usize,
    #[arg(long)]
    pub big: usize,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one; returns the limit now in force.
fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        }
    }
    r.rlim_cur
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// This process's open descriptors and what each one is (`readlink /proc/self/fd/N`).
fn fd_targets() -> std::collections::BTreeMap<String, String> {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let t = std::fs::read_link(e.path())
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|_| "?".into());
                    (e.file_name().to_string_lossy().into_owned(), t)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// CPU time (ns, `/proc/self/task/TID/schedstat`) and name of every thread of this process.
fn thread_times() -> std::collections::HashMap<String, (String, u64)> {
    let mut out = std::collections::HashMap::new();
    let Ok(d) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in d.flatten() {
        let p = e.path();
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if let Some(ns) = ns {
            let tid = e.file_name().to_string_lossy().into_owned();
            out.insert(tid, (name.trim().to_string(), ns));
        }
    }
    out
}

pub fn child_main(a: &ChildArgs) -> Result<(), String> {
    let limit = raise_nofile();
    common::emit("nofile", limit);
    let n = Net::ready(None);
    let (fd0, th0) = fds_and_threads();
    let fds_before = fd_targets();
    common::emit("fds0", fd0);
    common::emit("threads0", th0);
    let mut pairs = vec![];
    let mut fail = None;
    let t = Instant::now();
    for i in 0..a.count {
        match catch_unwind(AssertUnwindSafe(|| n.connect_pair(0))) {
            Ok(Ok(p)) => pairs.push(p),
            Ok(Err(e)) => {
                fail = Some(format!("comm {i}: connect/accept returned {e:?}"));
                break;
            }
            Err(p) => {
                fail = Some(format!("comm {i}: connect/accept: {}", panic_text(p)));
                break;
            }
        }
    }
    common::emit("open_s", t.elapsed().as_secs_f64());
    let big = ncclbpf_harness::pattern(a.big, 1);
    let small = ncclbpf_harness::pattern(8, 2);
    let t = Instant::now();
    let mut moved = 0;
    if fail.is_none() {
        for (i, &(s, r)) in pairs.iter().enumerate() {
            let res = catch_unwind(AssertUnwindSafe(|| {
                n.transfer(s, r, &big, big.len())
                    .map_err(|e| format!("{} message: {e:?}", human(a.big)))?;
                n.transfer(s, r, &small, small.len())
                    .map_err(|e| format!("8 B message: {e:?}"))
            }));
            match res {
                Ok(Ok(_)) => moved += 1,
                Ok(Err(e)) => fail = Some(format!("comm {i}: {e}")),
                Err(p) => fail = Some(format!("comm {i}: {}", panic_text(p))),
            }
            if fail.is_some() {
                break;
            }
        }
    }
    common::emit("traffic_s", t.elapsed().as_secs_f64());
    common::emit("opened", pairs.len());
    common::emit("moved", moved);
    let (fd1, th1) = fds_and_threads();
    common::emit("fds1", fd1);
    common::emit("threads1", th1);
    // CPU time of every thread over 1 s of sleep, from the scheduler's own per-thread figures
    // (`getrusage` would sum over every thread while the clock runs: milliseconds at 8,000
    // threads). This thread only sleeps; what it spends is the measuring, left out.
    let me = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()));
    let before = thread_times();
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let wall = t.elapsed().as_secs_f64();
    let mut by_name: std::collections::BTreeMap<String, (u64, usize)> = Default::default();
    let mut total = 0;
    for (tid, (name, ns)) in thread_times() {
        if me.as_deref() == Some(tid.as_str()) {
            continue;
        }
        let used = ns.saturating_sub(before.get(&tid).map_or(0, |b| b.1));
        total += used;
        let e = by_name.entry(name).or_default();
        e.0 += used;
        e.1 += 1;
    }
    common::emit("idle_cpu_ms", total as f64 / 1e6 / wall);
    // Who used it: per thread name, the busiest names first.
    let mut names: Vec<_> = by_name.into_iter().filter(|(_, (ns, _))| *ns > 0).collect();
    names.sort_by_key(|(_, (ns, _))| std::cmp::Reverse(*ns));
    let top: Vec<String> = names
        .iter()
        .take(3)
        .map(|(n, (ns, k))| format!("{n} ×{k} {:.2} ms", *ns as f64 / 1e6))
        .collect();
    common::emit("idle_top", top.join(", "));
    for &(s, r) in &pairs {
        if let Err(e) = n.close_send(s).and_then(|_| n.close_recv(r)) {
            fail.get_or_insert_with(|| format!("close: {e:?}"));
        }
    }
    // Closing joins the helpers; a moment for anything the plugin ends asynchronously.
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut fd2, mut th2) = fds_and_threads();
    while (fd2 > fd0 || th2 > th0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        (fd2, th2) = fds_and_threads();
    }
    common::emit("fds2", fd2);
    // Descriptors the plugin opened on the way and kept (anything not there before, but the
    // listing of /proc/self/fd itself).
    let kept: Vec<String> = fd_targets()
        .into_iter()
        .filter(|(fd, t)| fds_before.get(fd) != Some(t) && !t.starts_with("/proc/"))
        .map(|(_, t)| t)
        .collect();
    if !kept.is_empty() {
        common::emit("fds_kept", kept.join(", "));
    }
    common::emit("threads2", th2);
    if let Some(f) = fail {
        common::emit("fail", f);
    }
    Ok(())
}

pub fn run(a: &Args) -> Result<(), String> {
    let env = common::plugin_env(Some(a.streams));
    let shape = common::shape(Some(a.streams));
    let mut rows = vec![];
    let load0 = common::load();
    for &count in &a.counts {
        common::progress(Some(format_args!("comms: {count} ...")));
        let args: Vec<String> = [
            "comms-child".to_string(),
            "--count".into(),
            count.to_string(),
            "--big".into(),
            a.big.to_string(),
        ]
        .into();
        let timeout = Duration::from_secs(60 + count as u64 / 5);
        rows.push((count, common::child(&args, &env, timeout)));
    }
    common::progress(None);
    let cores = common::cores();
    println!(
        "ncclbpf-bench comms: {}; plugin {}; {} data stream(s) per connection; one {} and one \
         8 B message through every comm pair, then 1 s idle; load average {load0} at start, {} \
         at end",
        common::machine(),
        ncclbpf_harness::plugin_path().display(),
        shape.nstreams,
        human(a.big),
        common::load()
    );
    println!();
    println!(
        "| comm pairs | opened | threads: before / open / closed | helper threads | fds: before \
         / open / closed | fds per comm pair | idle CPU (ms per s) | open + traffic (s) | result |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut failed = 0;
    for (count, r) in rows {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                failed += 1;
                println!("| {count} | | | | | | | | child failed: {e} |");
                continue;
            }
        };
        let g = |k: &str| r.get(k).cloned().unwrap_or_else(|| "?".into());
        let num = |k: &str| r.get(k).and_then(|v| v.parse::<f64>().ok());
        let opened = num("opened").unwrap_or(0.0);
        let per = match (num("fds1"), num("fds0")) {
            (Some(x), Some(y)) if opened > 0.0 => format!("{:.1}", (x - y) / opened),
            _ => "–".into(),
        };
        let helpers = match (num("threads1"), num("threads0")) {
            (Some(x), Some(y)) => format!("{}", x - y),
            _ => "?".into(),
        };
        let result = match r.get("fail") {
            Some(f) => {
                failed += 1;
                format!("stopped: {f}")
            }
            None => "ok".into(),
        };
        let result = match r.get("idle_top").filter(|t| !t.is_empty()) {
            Some(t) => format!("{result}; idle CPU by thread name: {t}"),
            None => result,
        };
        let result = match r.get("fds_kept") {
            Some(k) => format!("{result}; kept open after close: {k}"),
            None => result,
        };
        println!(
            "| {count} | {} | {} / {} / {} | {helpers} | {} / {} / {} | {per} | {:.2} | {:.2} | \
             {result} |",
            g("opened"),
            g("threads0"),
            g("threads1"),
            g("threads2"),
            g("fds0"),
            g("fds1"),
            g("fds2"),
            num("idle_cpu_ms").unwrap_or(f64::NAN),
            num("open_s").unwrap_or(f64::NAN) + num("traffic_s").unwrap_or(0.0),
        );
    }
    println!(
        "\nbefore: after the plugin's init (its own threads included), open: every comm open, \
         closed: after closing them all; helper threads: open − before; idle CPU: time on a CPU \
         of every thread but the sleeping main one (schedstat) over 1 s with every comm open; \
         open + traffic (s): connect + accept and the two messages, all comms; goal for 1,000 \
         comms: ≤ 2 × {cores} cores (+ a few) helper threads, idle CPU ≈ 0"
    );
    if failed > 0 {
        // A limit met is a figure of this benchmark, not a failure of it: the row says so.
        println!("\n{failed} row(s) did not complete: see their result column");
    }
    Ok(())
}
