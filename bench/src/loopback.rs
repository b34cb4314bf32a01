//! `ncclbpf-bench loopback`: latency and throughput of the plugin (with `conn_counter`, with no
//! policy) against raw TCP over the same streams, blocking and busy-polling, in one run.
//!
//! Every measurement is one child process of this binary (`ncclbpf-bench arm ...`), so each
//! arm gets its own plugin settings (the plugin reads them once per process). Within a round
//! the arms of one size run back to back, in an order that rotates from size to size and round
//! to round, so that a busy moment of a shared machine does not always hit the same arm.

use crate::common::{self, Results, cell, human, spread};
use crate::transport::{Arm, Test, depth_for};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub const LAT_SIZES: [usize; 8] = [
    8,
    64,
    1 << 10,
    8 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    1 << 20,
];
pub const TPUT_SIZES: [usize; 9] = [
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
];
const QUICK_LAT: [usize; 2] = [8, 1 << 20];
const QUICK_TPUT: [usize; 2] = [64 << 10, 4 << 20];

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Rounds of every measurement (each arm once per round); the table shows the median and
    /// the min–max over rounds. Default 5, or 1 with --quick.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// A smoke run of a few seconds: 2 latency and 2 throughput sizes, short measurements.
    #[arg(long)]
    pub quick: bool,
    /// Data streams per connection for the plugin (NCCL_BPF_NSTREAMS, unless the environment
    /// sets it) and the raw TCP arms.
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// MiB moved per throughput measurement (at least two in-flight windows). Default 512, or
    /// 16 with --quick.
    #[arg(long)]
    pub total_mib: Option<usize>,
    /// Milliseconds of ping-pong per latency measurement. Default 300, or 20 with --quick.
    #[arg(long)]
    pub budget_ms: Option<u64>,
    /// Only the latency table.
    #[arg(long, conflicts_with = "tput_only")]
    pub lat_only: bool,
    /// Only the throughput table.
    #[arg(long)]
    pub tput_only: bool,
}

/// What one child measures.
#[derive(clap::Args, Clone, Debug)]
pub struct ArmArgs {
    #[arg(long, value_enum)]
    pub arm: Arm,
    #[arg(long, value_enum)]
    pub test: Test,
    #[arg(long)]
    pub size: usize,
    #[arg(long, default_value_t = 300)]
    pub budget_ms: u64,
    #[arg(long, default_value_t = 512 << 20)]
    pub total: usize,
}

/// The child: measures one figure and prints it as `@result value <figure>`.
pub fn arm_main(a: &ArmArgs) -> Result<(), String> {
    let n = if a.arm.is_plugin() {
        let n = ncclbpf_harness::Net::ready(None);
        let attached = ncclbpf_harness::log_text().contains("attached to net/complete");
        common::emit("policy", attached);
        Some(n)
    } else {
        None
    };
    let v = crate::transport::measure(
        a.arm,
        n.as_ref(),
        a.test,
        a.size,
        Duration::from_millis(a.budget_ms),
        a.total,
    )?;
    common::emit("value", v);
    Ok(())
}

/// The environment of a child of `arm`: `policy` attached for the hooks arm, no policy for the
/// others.
pub fn arm_env(
    arm: Arm,
    policy: &std::path::Path,
    streams: u32,
) -> Vec<(&'static str, Option<String>)> {
    let mut env = common::plugin_env(Some(streams));
    env.push(("NCCL_BPF_NET_POLICY", None));
    env.push((
        "NCCL_BPF_POLICY",
        (arm == Arm::Hooks).then(|| policy.display().to_string()),
    ));
    env
}

/// Figures of one (test, size): per arm, one value per round (`None`: that round failed).
type Figures = BTreeMap<(Test, usize), BTreeMap<&'static str, Vec<Option<f64>>>>;

/// Runs one measurement in a child; checks that the hooks arm really had its policy.
pub fn run_child(
    arm: Arm,
    test: Test,
    size: usize,
    budget_ms: u64,
    total: usize,
    env: &[(&'static str, Option<String>)],
    errors: &mut Vec<String>,
) -> Option<f64> {
    let args: Vec<String> = [
        "arm",
        "--arm",
        arm.name(),
        "--test",
        match test {
            Test::Lat => "lat",
            Test::Tput => "tput",
        },
        "--size",
        &size.to_string(),
        "--budget-ms",
        &budget_ms.to_string(),
        "--total",
        &total.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let r: Result<Results, String> = common::child(&args, env, Duration::from_secs(300));
    match r {
        Ok(r) => {
            if arm == Arm::Hooks && r.get("policy").map(String::as_str) != Some("true") {
                errors.push(format!(
                    "{}: the policy did not attach (NCCL_BPF_POLICY)",
                    args.join(" ")
                ));
                return None;
            }
            if arm == Arm::Off && r.get("policy").map(String::as_str) != Some("false") {
                errors.push(format!("{}: a policy is attached", args.join(" ")));
                return None;
            }
            match r.get("value").and_then(|v| v.parse().ok()) {
                Some(v) => Some(v),
                None => {
                    errors.push(format!("{}: no value", args.join(" ")));
                    None
                }
            }
        }
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

pub fn run(a: &Args) -> Result<(), String> {
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 5 }).max(1);
    let total = a.total_mib.unwrap_or(if a.quick { 16 } else { 512 }) << 20;
    let budget = a.budget_ms.unwrap_or(if a.quick { 20 } else { 300 });
    let (lat, tput): (&[usize], &[usize]) = if a.quick {
        (&QUICK_LAT, &QUICK_TPUT)
    } else {
        (&LAT_SIZES, &TPUT_SIZES)
    };
    let lat = if a.tput_only { &[][..] } else { lat };
    let tput = if a.lat_only { &[][..] } else { tput };
    let policy = common::policy("conn_counter")?;
    let shape = common::shape(Some(a.streams));
    let env_of = |arm| arm_env(arm, &policy, a.streams);
    let t0 = Instant::now();
    let load0 = common::load();
    let mut figs: Figures = BTreeMap::new();
    let mut errors = vec![];
    let tests: Vec<(Test, usize)> = lat
        .iter()
        .map(|&s| (Test::Lat, s))
        .chain(tput.iter().map(|&s| (Test::Tput, s)))
        .collect();
    for round in 0..rounds {
        for (i, &(test, size)) in tests.iter().enumerate() {
            common::progress(Some(format_args!(
                "round {}/{rounds}: {} {}",
                round + 1,
                if test == Test::Lat {
                    "latency"
                } else {
                    "throughput"
                },
                human(size)
            )));
            for k in 0..Arm::ALL.len() {
                let arm = Arm::ALL[(k + i + round) % Arm::ALL.len()];
                let v = run_child(arm, test, size, budget, total, &env_of(arm), &mut errors);
                figs.entry((test, size))
                    .or_default()
                    .entry(arm.name())
                    .or_default()
                    .push(v);
            }
        }
    }
    common::progress(None);

    println!(
        "ncclbpf-bench loopback: {}; plugin {}; {} data stream(s), inline ≤ {}, min chunk {}; \
         {rounds} round(s), median (min–max) over rounds; {:.0} s, load average {load0} at \
         start, {} at end",
        common::machine(),
        ncclbpf_harness::plugin_path().display(),
        shape.nstreams,
        human(shape.inline_bytes as usize),
        human(shape.min_chunk as usize),
        t0.elapsed().as_secs_f64(),
        common::load()
    );
    println!(
        "arms: `hooks` = plugin with {} attached (NCCL_BPF_POLICY), `off` = plugin with no \
         policy (per-connection counters still on: no setting turns them off), raw TCP over \
         the same streams blocking and busy-polling (one polling thread per side, yielding \
         after an idle pass as NCCL's proxy does)",
        policy.display()
    );
    if common::cores() <= 4 {
        println!(
            "note: {} cores, shared with other work (see the load average): every arm keeps a \
             sender and a receiver thread busy (the plugin's also hand large messages to helper \
             threads), so each arm needs both cores and figures vary between rounds",
            common::cores()
        );
    }
    if !lat.is_empty() {
        println!(
            "\n#### Latency, one way (µs, ping-pong, {budget} ms per measurement; speed = best \
             TCP latency / plugin latency, higher is better)\n"
        );
        table(&figs, Test::Lat, lat, 1);
    }
    if !tput.is_empty() {
        println!(
            "\n#### Throughput (GB/s, {} MiB per measurement or two windows; speed = plugin / \
             best TCP)\n",
            total >> 20
        );
        table(&figs, Test::Tput, tput, 2);
    }
    println!(
        "\nspeed and hook cost: of the medians, and in brackets the least and greatest of one \
         round's pair (the arms of one size run back to back); hook cost = extra time of \
         `hooks` over `off` (latency: hooks / off − 1; throughput: off / hooks − 1); each figure \
         is the median of 10 timed parts of its measurement"
    );
    common::failures(&errors)
}

fn table(figs: &Figures, test: Test, sizes: &[usize], prec: usize) {
    let tput = test == Test::Tput;
    print!("| size |");
    if tput {
        print!(" depth |");
    }
    for a in Arm::ALL {
        print!(" {} |", a.title());
    }
    println!(" speed vs best TCP | hook cost |");
    print!("|---:|");
    if tput {
        print!("---:|");
    }
    println!("{}", "---:|".repeat(Arm::ALL.len() + 2));
    for &size in sizes {
        let Some(f) = figs.get(&(test, size)) else {
            continue;
        };
        let get = |a: Arm| f.get(a.name()).cloned().unwrap_or_default();
        let ok = |v: &[Option<f64>]| v.iter().flatten().copied().collect::<Vec<f64>>();
        print!("| {} |", human(size));
        if tput {
            print!(" {} |", depth_for(size));
        }
        for a in Arm::ALL {
            print!(" {} |", cell(&ok(&get(a)), prec));
        }
        // The better raw arm by median; per round: its figure over the plugin's.
        let better = |x: f64, y: f64| if tput { x > y } else { x < y };
        let mut best: Option<(Arm, f64)> = None;
        for a in [Arm::TcpBlock, Arm::TcpPoll] {
            let v = ok(&get(a));
            if v.is_empty() {
                continue;
            }
            let m = spread(&v).0;
            if best.is_none_or(|(_, b)| better(m, b)) {
                best = Some((a, m));
            }
        }
        let hooks = get(Arm::Hooks);
        let speed = best.map(|(a, _)| {
            let name = if a == Arm::TcpPoll {
                "busy-poll"
            } else {
                "blocking"
            };
            let f = |h: f64, t: f64| if tput { h / t } else { t / h };
            match ratio(&hooks, &get(a), &f) {
                Some((m, lo, hi)) => format!("{m:.2}× ({lo:.2}–{hi:.2}) {name}"),
                None => "–".into(),
            }
        });
        let f = |h: f64, o: f64| 100.0 * if tput { o / h - 1.0 } else { h / o - 1.0 };
        let cost = match ratio(&hooks, &get(Arm::Off), &f) {
            Some((m, lo, hi)) => format!("{m:+.1}% ({lo:+.1}…{hi:+.1})"),
            None => "–".into(),
        };
        println!(" {} | {cost} |", speed.unwrap_or_else(|| "–".into()));
    }
}

/// `f` of the medians of `a` and `b`, and the least and greatest `f` of one round's pair.
pub fn ratio(
    a: &[Option<f64>],
    b: &[Option<f64>],
    f: &dyn Fn(f64, f64) -> f64,
) -> Option<(f64, f64, f64)> {
    let pairs: Vec<f64> = a
        .iter()
        .zip(b)
        .filter_map(|(x, y)| Some(f((*x)?, (*y)?)))
        .collect();
    let (xs, ys): (Vec<f64>, Vec<f64>) = (
        a.iter().flatten().copied().collect(),
        b.iter().flatten().copied().collect(),
    );
    if pairs.is_empty() {
        return None;
    }
    let (_, lo, hi) = spread(&pairs);
    Some((f(spread(&xs).0, spread(&ys).0), lo, hi))
}
