//! `ncclbpf-bench hooks`: what the net hooks cost per operation, `conn_counter` attached
//! against no policy.
//!
//! Two views, each arm in its own child process (the plugin attaches its policy once per
//! process), arms alternating over rounds:
//!
//! * in-process, isolated: the hook calls one operation makes on one connection end, as
//!   `Comm::isend`/`irecv` and `test` make them (the clock read when a completion program
//!   wants latencies, `on_post`, `on_complete`: the per-connection counters, then the program),
//!   through the plugin crate's `ConnHooks`, timed over millions of calls; send and receive
//!   ends alike;
//! * end to end, through the library's C ABI: a stream of 8 B messages with 8 in flight
//!   (ns per message), 8 B ping-pong latency, 64 KiB throughput.
//!
//! The tuner's path (getCollInfo with and without a policy) has its own benchmark, a C caller:
//! `scripts/tuner-bench.sh` (`bench/c/tuner_bench.c`), in BENCHMARKS.md "Tuner: getCollInfo per call".

use crate::common::{self, cell};
use crate::loopback::{arm_env, ratio, run_child};
use crate::transport::{Arm, Test};
use ncclbpf_netplugin::hooks::{ConnHooks, ConnInfo};
use shared_maps::ConnDirection;
use std::hint::black_box;
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Rounds (each arm once per round). Default 5, or 1 with --quick.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// A smoke run of a few seconds.
    #[arg(long)]
    pub quick: bool,
    /// 8 B messages per end-to-end measurement. Default 200000, or 20000 with --quick.
    #[arg(long)]
    pub ops: Option<usize>,
    /// Data streams per connection (NCCL_BPF_NSTREAMS, unless the environment sets it).
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
}

#[derive(clap::Args, Clone, Debug)]
pub struct DirectArgs {
    /// Calls per timing; the child prints the best of 7.
    #[arg(long, default_value_t = 2_000_000)]
    pub calls: u64,
}

/// The child of the in-process view: ns per operation (post and completion hooks of one end),
/// best of 7 timings, send and receive ends alternating.
pub fn direct_main(a: &DirectArgs) -> Result<(), String> {
    ncclbpf_netplugin::hooks::init_policies();
    let open = |direction, conn_id| {
        ConnHooks::on_open(ConnInfo {
            direction,
            conn_id,
            peer_port: 1,
            dev: 0,
            comm_id: 0x5eed,
            nstreams: 4,
        })
    };
    let mut ends = [
        open(ConnDirection::Send, 0xbe_0001),
        open(ConnDirection::Recv, 0xbe_0002),
    ];
    common::emit("policy", ends[0].has_programs());
    // Requests are timed only for a completion program that reads latency_ns.
    let timed = ends[0].wants_time();
    common::emit("timed", timed);
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        for i in 0..a.calls {
            let h = &mut ends[(i & 1) as usize];
            let bytes = black_box(8 + (i & 7) as usize);
            // What Comm::isend / irecv and then test do around one request.
            let posted = h.wants_time().then(Instant::now);
            h.on_post(bytes);
            h.on_complete(bytes, posted);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / a.calls as f64);
    }
    for h in &mut ends {
        h.on_close();
    }
    common::emit("value", best);
    // What of it is the clock: a completion program gets the request's latency, so the comm
    // reads the clock at the post and at the completion.
    let mut clock = f64::MAX;
    for _ in 0..7 {
        let t = Instant::now();
        for _ in 0..a.calls {
            let posted = black_box(Instant::now());
            black_box(posted.elapsed().as_nanos() as u64);
        }
        clock = clock.min(t.elapsed().as_nanos() as f64 / a.calls as f64);
    }
    common::emit("clock", clock);
    Ok(())
}

/// (ns per operation, ns of the two clock reads if its requests are timed) of one
/// `hook-direct` child.
fn direct_child(
    arm: Arm,
    env: &[(&'static str, Option<String>)],
    quick: bool,
) -> Result<(f64, Option<f64>), String> {
    let calls = if quick { 200_000 } else { 2_000_000 };
    let args = vec![
        "hook-direct".to_string(),
        "--calls".into(),
        calls.to_string(),
    ];
    let r = common::child(&args, env, Duration::from_secs(120))?;
    let want = if arm == Arm::Hooks { "true" } else { "false" };
    if r.get("policy").map(String::as_str) != Some(want) {
        return Err(format!(
            "hook-direct ({}): policy attached is not {want}",
            arm.name()
        ));
    }
    let get = |k: &str| {
        r.get(k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("hook-direct: no {k}"))
    };
    let timed = r.get("timed").map(String::as_str) == Some("true");
    Ok((
        get("value")?,
        if timed { Some(get("clock")?) } else { None },
    ))
}

/// A row of the table: title, figures of (no policy, conn_counter) per round, decimals, unit of
/// the difference, whether higher is better.
type Row<'a> = (&'a str, &'a [Vec<Option<f64>>; 2], usize, &'a str, bool);

pub fn run(a: &Args) -> Result<(), String> {
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 5 }).max(1);
    let ops = a.ops.unwrap_or(if a.quick { 20_000 } else { 200_000 });
    let budget = if a.quick { 20 } else { 300 };
    let total64 = if a.quick { 16 << 20 } else { 256 << 20 };
    let policy = common::policy("conn_counter")?;
    let t0 = Instant::now();
    let load0 = common::load();
    // Rows: (title, per arm (off, hooks) one value per round, what a figure is, decimals).
    let arms = [Arm::Off, Arm::Hooks];
    let mut direct = [vec![], vec![]];
    let mut clock = vec![];
    let mut stream8 = [vec![], vec![]];
    let mut lat8 = [vec![], vec![]];
    let mut tput64 = [vec![], vec![]];
    let mut errors = vec![];
    for round in 0..rounds {
        common::progress(Some(format_args!("hooks: round {}/{rounds}", round + 1)));
        for k in 0..2 {
            // Alternate which arm goes first.
            let i = (k + round) % 2;
            let arm = arms[i];
            let env = arm_env(arm, &policy, a.streams);
            let d = direct_child(arm, &env, a.quick)
                .map_err(|e| errors.push(e))
                .ok();
            direct[i].push(d.map(|d| d.0));
            if arm == Arm::Hooks {
                clock.extend(d.and_then(|d| d.1));
            }
            // ns per message from the throughput of `ops` 8 B messages.
            let v = run_child(arm, Test::Tput, 8, budget, 8 * ops, &env, &mut errors);
            stream8[i].push(v.map(|gbs| 8.0 / gbs));
            lat8[i].push(run_child(arm, Test::Lat, 8, budget, 0, &env, &mut errors));
            tput64[i].push(run_child(
                arm,
                Test::Tput,
                64 << 10,
                budget,
                total64,
                &env,
                &mut errors,
            ));
        }
    }
    common::progress(None);
    println!(
        "ncclbpf-bench hooks: {}; plugin {}; {} vs no policy; {rounds} round(s), median \
         (min–max) over rounds; {:.0} s, load average {load0} at start, {} at end",
        common::machine(),
        ncclbpf_harness::plugin_path().display(),
        policy.display(),
        t0.elapsed().as_secs_f64(),
        common::load()
    );
    println!();
    println!("| per operation | no policy | conn_counter | conn_counter − none | extra time |");
    println!("|---|---:|---:|---:|---:|");
    // (title, figures, decimals, unit of the difference, higher is better)
    let rows: [Row; 4] = [
        (
            "hook calls of one request on one end, in-process (ns)",
            &direct,
            1,
            "ns",
            false,
        ),
        (
            "8 B messages streamed, 8 in flight (ns per message)",
            &stream8,
            0,
            "ns",
            false,
        ),
        ("8 B latency, one way (µs)", &lat8, 2, "µs", false),
        ("64 KiB throughput (GB/s)", &tput64, 2, "GB/s", true),
    ];
    for (k, (title, f, prec, unit, higher)) in rows.into_iter().enumerate() {
        let ok = |v: &Vec<Option<f64>>| v.iter().flatten().copied().collect::<Vec<f64>>();
        let one = f[0]
            .iter()
            .zip(&f[1])
            .filter(|(o, h)| o.is_some() && h.is_some())
            .count()
            == 1;
        let show = |r: Option<(f64, f64, f64)>, p: usize, unit: &str| match r {
            None => "–".to_string(),
            Some((m, _, _)) if one => format!("{m:+.p$}{unit}"),
            Some((m, lo, hi)) => format!("{m:+.p$}{unit} ({lo:+.p$}…{hi:+.p$})"),
        };
        // conn_counter − none; extra time with the policy, in percent.
        let d = show(
            ratio(&f[1], &f[0], &|h, o| h - o),
            prec.max(1),
            &format!(" {unit}"),
        );
        let pct = show(
            ratio(&f[1], &f[0], &|h, o| {
                100.0 * if higher { o / h - 1.0 } else { h / o - 1.0 }
            }),
            1,
            "%",
        );
        println!(
            "| {title} | {} | {} | {d} | {pct} |",
            cell(&ok(&f[0]), prec),
            cell(&ok(&f[1]), prec)
        );
        if k == 0 {
            let timed = if clock.is_empty() {
                "not read (the program does not read latency_ns)".to_string()
            } else {
                cell(&clock, 1)
            };
            println!(
                "| of which: the two clock reads of a timed request (post, completion; ns) \
                 | not read | {timed} | | |"
            );
        }
    }
    println!(
        "\ndifference and extra time: of the medians, and in brackets the least and greatest of \
         one round's pair; in-process: the clock read a completion program's latency needs, \
         `on_post` and `on_complete` (counters, then the program) through the plugin crate's \
         `ConnHooks`, best of 7 timings per child; end to end: through the library's C ABI, as `loopback`. \
         getCollInfo (the tuner's path) with and without a policy: `scripts/tuner-bench.sh` \
         (bench/c/tuner_bench.c), BENCHMARKS.md \"Tuner: getCollInfo per call\"."
    );
    common::failures(&errors)
}
