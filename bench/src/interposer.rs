//! `ncclbpf-bench interposer`: the wrapper's own cost per request (issue 33, item 7), with no
//! network underneath.
//!
//! The inner plugin is `bench/c/null_net.c` (compiled here with `cc` into the target
//! directory): every request it gets is complete the moment it is posted. Three arms, each in
//! its own child process (the plugin reads its settings once per process), alternated over
//! rounds:
//!
//! * `direct`: the null plugin loaded by the harness as NCCL loads a plugin;
//! * `wrapped`: ncclbpf with `NCCL_BPF_NET_INNER=<null plugin>`, no policy;
//! * `wrapped + conn_counter`: the same with `NCCL_BPF_POLICY=conn_counter.o`.
//!
//! A child times `irecv`, `isend`, `test` (send), `test` (receive) on one connection pair over
//! the C ABI (v12), best of 7, and reports ns per request (a request = its post and its one
//! `test`). The wrapper's cost is the wrapped figure less the direct one.

use crate::common::{self, cell};
use ncclbpf_harness::{Net, log_text};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Rounds (each arm once per round). Default 5, or 1 with --quick.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// A smoke run of a second or two.
    #[arg(long)]
    pub quick: bool,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ChildArgs {
    /// Request pairs (one send, one receive) per timing; the child reports the best of 7.
    #[arg(long, default_value_t = 1_000_000)]
    pub pairs: u64,
    /// Request pairs in flight: the oldest is tested once this many are posted.
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
}

/// The child: ns per request over the plugin the environment names.
pub fn child_main(a: &ChildArgs) -> Result<(), String> {
    let n = Net::ready(Some(12));
    let (s, r) = n
        .connect_pair(0)
        .map_err(|e| format!("connect_pair: {e:?}"))?;
    let log = log_text();
    common::emit(
        "wrapped",
        log.contains("traffic carried by inner net plugin 'Null'"),
    );
    common::emit(
        "policy",
        log.contains("net policy: 'conn_counter_complete' attached"),
    );
    let depth = a.depth.clamp(1, 32);
    let sbuf = [7u8; 64];
    let mut rbufs = vec![[0u8; 64]; depth];
    let mut queue = std::collections::VecDeque::with_capacity(depth);
    let check = |sq, rq| -> Result<(), String> {
        let sd = n.test(sq, true).map_err(|e| format!("test: {e:?}"))?;
        let rd = n.test(rq, true).map_err(|e| format!("test: {e:?}"))?;
        if sd != Some(8) || rd != Some(64) {
            return Err(format!("completions {sd:?} {rd:?}, not Some(8) Some(64)"));
        }
        Ok(())
    };
    // One pair posted; the oldest pair tested once `depth` pairs are in flight.
    let mut step = |i: u64, queue: &mut std::collections::VecDeque<_>| -> Result<(), String> {
        let rb = rbufs[i as usize % depth].as_mut_ptr();
        // SAFETY: the buffers outlive the requests, all tested before the buffers go; a
        // receive buffer is reused only after its earlier request was tested.
        let rq = unsafe { n.irecv(r, rb, 64, false) }
            .map_err(|e| format!("irecv: {e:?}"))?
            .ok_or("irecv: no request")?;
        // SAFETY: as above.
        let sq = unsafe { n.isend(s, sbuf.as_ptr(), 8) }
            .map_err(|e| format!("isend: {e:?}"))?
            .ok_or("isend: no request")?;
        queue.push_back((sq, rq));
        if queue.len() >= depth {
            let (sq, rq) = queue.pop_front().expect("a pair in flight");
            check(sq, rq)?;
        }
        Ok(())
    };
    let mut best = f64::MAX;
    for i in 0..a.pairs.min(10_000) {
        step(i, &mut queue)?;
    }
    for _ in 0..7 {
        let t = Instant::now();
        for i in 0..a.pairs {
            step(i, &mut queue)?;
        }
        best = best.min(t.elapsed().as_nanos() as f64 / (2 * a.pairs) as f64);
    }
    while let Some((sq, rq)) = queue.pop_front() {
        check(sq, rq)?;
    }
    common::emit("value", best);
    n.close_send(s).map_err(|e| format!("closeSend: {e:?}"))?;
    n.close_recv(r).map_err(|e| format!("closeRecv: {e:?}"))?;
    Ok(())
}

/// Compiles the null plugin into the target directory (next to this binary's folder).
fn null_plugin() -> Result<PathBuf, String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("c/null_net.c");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe
        .parent()
        .unwrap_or(Path::new("."))
        .join("interposer-bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let out = dir.join("libnccl-net-null.so");
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .map_err(|e| format!("cc: {e}"))?;
    if !st.success() {
        return Err(format!("cc {} failed: {st}", src.display()));
    }
    Ok(out)
}

const ARMS: [&str; 3] = ["direct", "wrapped", "wrapped + conn_counter"];

/// Pairs in flight per measurement: 1 (each pair tested before the next is posted: the
/// communicator's busy clock starts and stops with every pair) and 8 (NCCL's steps in flight
/// per connection: the clock keeps running).
const DEPTHS: [usize; 2] = [1, 8];

pub fn run(a: &Args) -> Result<(), String> {
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 5 }).max(1);
    let pairs = if a.quick { 100_000 } else { 1_000_000 };
    let null = null_plugin()?;
    let ours = ncclbpf_harness::plugin_path();
    let policy = common::policy("conn_counter")?;
    let t0 = Instant::now();
    let load0 = common::load();
    // [depth][arm] figures, [depth][wrapped arm] costs, one per round.
    let mut figs = vec![[vec![], vec![], vec![]]; DEPTHS.len()];
    let mut costs = vec![[vec![], vec![]]; DEPTHS.len()];
    for round in 0..rounds {
        common::progress(Some(format_args!(
            "interposer: round {}/{rounds}",
            round + 1
        )));
        for (di, depth) in DEPTHS.into_iter().enumerate() {
            let mut this = [None; 3];
            for k in 0..3 {
                // Rotate which arm goes first.
                let i = (k + round) % 3;
                let v = arm_child(i, depth, pairs, &null, &ours, &policy)?;
                figs[di][i].push(v);
                this[i] = Some(v);
            }
            if let [Some(d), Some(w), Some(c)] = this {
                costs[di][0].push(w - d);
                costs[di][1].push(c - d);
            }
        }
    }
    common::progress(None);
    println!(
        "ncclbpf-bench interposer: {}; plugin {}; inner {}; {rounds} round(s) of {pairs} request \
         pairs, best of 7 per child, median (min–max) over rounds; {:.0} s, load average {load0} \
         at start, {} at end",
        common::machine(),
        ours.display(),
        null.display(),
        t0.elapsed().as_secs_f64(),
        common::load()
    );
    println!();
    println!(
        "| pairs in flight | arm | ns per request (post + one test) | the wrapper's own cost (ns, − direct) |"
    );
    println!("|---:|---|---:|---:|");
    for (di, depth) in DEPTHS.into_iter().enumerate() {
        println!("| {depth} | {} | {} | |", ARMS[0], cell(&figs[di][0], 1));
        for w in 1..3 {
            println!(
                "| {depth} | {} | {} | {} |",
                ARMS[w],
                cell(&figs[di][w], 1),
                cell(&costs[di][w - 1], 1)
            );
        }
    }
    Ok(())
}

/// One child of arm `i` (see [`ARMS`]): its ns per request.
fn arm_child(
    i: usize,
    depth: usize,
    pairs: u64,
    null: &Path,
    ours: &Path,
    policy: &Path,
) -> Result<f64, String> {
    let mut env: Vec<(&str, Option<String>)> = common::plugin_env(None);
    env.push(("NCCL_BPF_NET_POLICY", None));
    env.push(("NCCL_BPF_METRICS_ADDR", None));
    if i == 0 {
        env.push(("NCCLBPF_PLUGIN", Some(null.display().to_string())));
        env.push(("NCCL_BPF_NET_INNER", None));
        env.push(("NCCL_BPF_POLICY", None));
    } else {
        env.push(("NCCLBPF_PLUGIN", Some(ours.display().to_string())));
        env.push(("NCCL_BPF_NET_INNER", Some(null.display().to_string())));
        env.push((
            "NCCL_BPF_POLICY",
            (i == 2).then(|| policy.display().to_string()),
        ));
    }
    let args = vec![
        "interposer-child".to_string(),
        "--pairs".into(),
        pairs.to_string(),
        "--depth".into(),
        depth.to_string(),
    ];
    let r = common::child(&args, &env, Duration::from_secs(120))?;
    let want = |k: &str, v: bool| {
        if r.get(k).map(String::as_str) == Some(if v { "true" } else { "false" }) {
            Ok(())
        } else {
            Err(format!("{} arm: {k} is not {v}: {r:?}", ARMS[i]))
        }
    };
    want("wrapped", i > 0)?;
    want("policy", i == 2)?;
    r.get("value")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{} arm: no value", ARMS[i]))
}
