//! `ncclbpf collectives`: what the profiler measured in a running (or hung) process, per
//! communicator, rank, collective, size, algorithm and protocol, read-only from shared memory.

use crate::exit::{Failure, Outcome, Verdict};
use crate::out::{Out, outln};
use ncclbpf_metrics::profiled::{self, Entry};
use serde_json::{Value, json};
use shared_maps::MapView;

/// Show the profiler's per-collective GPU times and bus bandwidth of a running process.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ncclbpf collectives 12345
  ncclbpf collectives --json 12345 | jq '.collectives[] | select(.collective == \"allreduce\")'

The process must have loaded the plugin as its NCCL profiler (NCCL >= 2.28 finds it in the net
library; docs/guide/profiler.md) and belong to the same user. Times are the GPU's, first channel start
to last channel end; p50 and p99 are the bounds of the power-of-two histogram buckets that hold
them (\"at most\"); bus bandwidth is bus bytes over GPU time, as nccl-tests counts it. Entries
of communicators that were finalized stay until their room is needed. With NCCL 2.31+ a
collective the application tagged (a per-call profiler tag) has rows of its own, with a tag
column: the first 16 distinct tags of a process each, every later one as \"other\".

Exit status:
  0  the figures were read (also when there are none yet)
  2  usage or I/O error (no such process, no maps registered)")]
pub struct Args {
    /// Process id of a process that loaded the plugin.
    pub pid: u32,
    /// Print one JSON document: {pid, counters: {name: value}, collectives: [{comm, rank,
    /// collective, user_tag (null when untagged), size_bytes, algorithm, protocol, count, mean_ns, min_ns, max_ns,
    /// p50_le_ns, p99_le_ns, bus_bandwidth_bytes_per_second, bytes, bus_bytes, untimed}]}.
    #[arg(long)]
    pub json: bool,
}

fn size_text(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn us(ns: Option<u64>) -> String {
    ns.map_or("-".into(), |n| format!("{:.1}", n as f64 / 1e3))
}

fn mean_ns(e: &Entry) -> Option<u64> {
    (e.count > 0).then(|| e.sum_ns / e.count)
}

fn busbw(e: &Entry) -> Option<f64> {
    (e.sum_ns > 0).then(|| e.bus_bytes as f64 / (e.sum_ns as f64 * 1e-9))
}

pub fn run(out: &mut Out, a: &Args) -> Outcome {
    let pid = a.pid;
    let views =
        MapView::open_all(pid).map_err(|e| Failure::Usage(format!("process {pid}: {e}")))?;
    let mut rows: Vec<Entry> = views
        .iter()
        .filter(|v| v.name == profiled::COLLECTIVES_MAP)
        .flat_map(|v| profiled::entries(v, usize::MAX))
        .collect();
    rows.sort_by(|x, y| {
        (
            x.comm,
            x.rank,
            x.collective,
            &x.user_tag,
            x.size_bytes,
            x.algorithm,
            x.protocol,
        )
            .cmp(&(
                y.comm,
                y.rank,
                y.collective,
                &y.user_tag,
                y.size_bytes,
                y.algorithm,
                y.protocol,
            ))
    });
    let counters = views
        .iter()
        .find(|v| v.name == profiled::PROFILER_MAP)
        .and_then(profiled::counters);
    if a.json {
        let cols: Vec<Value> = rows
            .iter()
            .map(|e| {
                json!({
                    "comm": format!("{:#018x}", e.comm),
                    "rank": e.rank,
                    "collective": e.collective,
                    "user_tag": e.user_tag,
                    "size_bytes": e.size_bytes,
                    "algorithm": e.algorithm,
                    "protocol": e.protocol,
                    "count": e.count,
                    "mean_ns": mean_ns(e),
                    "min_ns": (e.count > 0).then_some(e.min_ns),
                    "max_ns": (e.count > 0).then_some(e.max_ns),
                    "p50_le_ns": e.quantile_bound_ns(0.5),
                    "p99_le_ns": e.quantile_bound_ns(0.99),
                    "bus_bandwidth_bytes_per_second": busbw(e),
                    "bytes": e.bytes,
                    "bus_bytes": e.bus_bytes,
                    "untimed": e.untimed,
                })
            })
            .collect();
        let c: serde_json::Map<String, Value> = counters
            .iter()
            .flatten()
            .map(|(n, v)| (n.to_string(), Value::from(*v)))
            .collect();
        outln!(
            out,
            "{}",
            json!({"pid": pid, "counters": c, "collectives": cols})
        );
        return Ok(Verdict::Good);
    }
    match &counters {
        None => outln!(
            out,
            "process {pid}: no profiler figures (the plugin is not its NCCL profiler, or NCCL has not initialised it yet)"
        ),
        Some(c) => {
            let get = |n: &str| c.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
            let misuse: u64 = profiled::MISUSE_REASONS.iter().map(|n| get(n)).sum();
            outln!(
                out,
                "process {pid}: {} operations timed, {} untimed, {} reclaimed; {} events and {} communicators open; {misuse} misuses",
                get("ops_timed"),
                get("ops_untimed"),
                get("reclaimed_pending"),
                get("open_events"),
                get("open_contexts"),
            );
        }
    }
    if rows.is_empty() {
        return Ok(Verdict::Good);
    }
    // The tag column only when some collective was tagged (NCCL 2.31+).
    let tagged = rows.iter().any(|e| e.user_tag.is_some());
    let tag = |t: &Option<String>| {
        if tagged {
            format!(" {:<20}", t.as_deref().unwrap_or("-"))
        } else {
            String::new()
        }
    };
    outln!(
        out,
        "{:<18} {:>4}  {:<13}{} {:>8}  {:<9} {:<6} {:>9} {:>10} {:>9} {:>9} {:>10} {:>11} {:>8}",
        "comm",
        "rank",
        "collective",
        tag(&Some("user tag".into())),
        "size ≤",
        "algorithm",
        "proto",
        "count",
        "mean µs",
        "p50 ≤ µs",
        "p99 ≤ µs",
        "max µs",
        "busbw GB/s",
        "untimed"
    );
    for e in &rows {
        outln!(
            out,
            "{:<18} {:>4}  {:<13}{} {:>8}  {:<9} {:<6} {:>9} {:>10} {:>9} {:>9} {:>10} {:>11} {:>8}",
            format!("{:#018x}", e.comm),
            e.rank,
            e.collective,
            tag(&e.user_tag),
            size_text(e.size_bytes),
            e.algorithm,
            e.protocol,
            e.count,
            us(mean_ns(e)),
            us(e.quantile_bound_ns(0.5)),
            us(e.quantile_bound_ns(0.99)),
            us((e.count > 0).then_some(e.max_ns)),
            busbw(e).map_or("-".into(), |b| format!("{:.3}", b / 1e9)),
            e.untimed
        );
    }
    Ok(Verdict::Good)
}
