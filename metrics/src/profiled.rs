//! The profiler's figures: `ncclbpf_collectives` (per communicator, rank, collective, size,
//! algorithm and protocol) and `ncclbpf_profiler` (the profiler's own counters), read by
//! their documented layouts (`profiler/src/stats.rs`, `profiler/src/counters.rs`), not through
//! the profiler crate.

use crate::expo::{Exposition, Kind, Labels};
use shared_maps::{MapType, MapView};

pub const COLLECTIVES_MAP: &str = "ncclbpf_collectives";
pub const PROFILER_MAP: &str = "ncclbpf_profiler";

pub const DURATION: &str = "nccl_collective_duration_seconds";
pub const BUS_BYTES: &str = "nccl_collective_bus_bytes_total";
pub const BYTES: &str = "nccl_collective_bytes_total";
pub const BUS_BW: &str = "nccl_collective_bus_bandwidth_bytes_per_second";
pub const UNTIMED: &str = "nccl_collective_untimed_total";
pub const EVENTS: &str = "ncclbpf_profiler_events_total";
pub const MISUSE: &str = "ncclbpf_profiler_misuse_total";
pub const OPEN: &str = "ncclbpf_profiler_open";
pub const OPS: &str = "ncclbpf_profiler_operations_total";

/// Families, for the exposition's declarations.
pub const FAMILIES: [(&str, Kind, &str); 9] = [
    (
        DURATION,
        Kind::Histogram,
        "GPU execution time of each collective or p2p operation (first channel's start to last channel's end, GPU clock), from the profiler, by communicator, rank, collective, size bucket, algorithm and protocol.",
    ),
    (
        BUS_BYTES,
        Kind::Counter,
        "Bus bytes of the timed operations (bytes x nccl-tests' bus factor): rate(bus bytes) / rate(duration _sum) is the bus bandwidth.",
    ),
    (BYTES, Kind::Counter, "Bytes of the timed operations."),
    (
        BUS_BW,
        Kind::Gauge,
        "Bus bandwidth of the timed operations since the communicator began: bus bytes / execution time.",
    ),
    (
        UNTIMED,
        Kind::Counter,
        "Operations counted without a GPU time (kernel-channel events masked out or missing).",
    ),
    (
        EVENTS,
        Kind::Counter,
        "Profiler events NCCL started, by outcome (followed: given a handle; ignored: a type the profiler does not follow; orphaned: a kernel-channel event whose collective was no longer pending).",
    ),
    (
        MISUSE,
        Kind::Counter,
        "Profiler calls ignored because what they named was not valid (unknown, stale or doubly stopped handles, finalized or unknown contexts, parents of another communicator, no room), by reason.",
    ),
    (OPEN, Kind::Gauge, "Profiler events and contexts open now."),
    (
        OPS,
        Kind::Counter,
        "Operations the profiler completed, by outcome (timed, untimed, reclaimed: still waiting for GPU times at finalize or past the pending limit).",
    ),
];

const FORMAT: u64 = 1;
/// `ncclbpf_collectives` format 1: 36 words; format 2 adds word 36, the entry's user tag,
/// and the tag slot in the key's bucket word (bits 16 and up).
const WORDS: usize = 36;
const FORMAT_TAGGED: u64 = 2;
const WORDS_TAGGED: usize = 37;
const TAG_SHIFT: u32 = 16;
/// The slot every user tag past the process's bound shares (`profiler/src/stats.rs`).
const TAG_OTHER: u32 = 17;
const HIST_AT: usize = 10;
const HIST: usize = 26;
const SIZE_BUCKETS: u32 = 41;

const FUNCS: [&str; 16] = [
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "allreduce",
    "sendrecv",
    "send",
    "recv",
    "alltoall",
    "scatter",
    "gather",
    "other",
    "other",
    "other",
    "other",
    "other",
];
const ALGOS: [&str; 8] = [
    "unknown",
    "tree",
    "ring",
    "collnetdirect",
    "collnetchain",
    "nvls",
    "nvlstree",
    "pat",
];
const PROTOS: [&str; 4] = ["unknown", "ll", "ll128", "simple"];

/// Counter words of `ncclbpf_profiler` (word = position + 1), as `profiler/src/counters.rs`
/// numbers them.
const COUNTER_NAMES: [&str; 21] = [
    "contexts_opened",
    "contexts_finalized",
    "events_followed",
    "events_ignored",
    "ops_timed",
    "ops_untimed",
    "null_handle",
    "unknown_handle",
    "stale_handle_stopped",
    "stale_handle_finalized",
    "stale_handle_reclaimed",
    "unknown_context",
    "foreign_parent",
    "table_full",
    "reclaimed_pending",
    "stats_dropped",
    "policy_runs",
    "open_at_finalize",
    "orphans",
    "open_events",
    "open_contexts",
];

/// The counters that count misuses (`ncclbpf_profiler_misuse_total{reason}`).
pub const MISUSE_REASONS: [&str; 9] = [
    "null_handle",
    "unknown_handle",
    "stale_handle_stopped",
    "stale_handle_finalized",
    "stale_handle_reclaimed",
    "unknown_context",
    "foreign_parent",
    "table_full",
    "stats_dropped",
];

fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// One entry of `ncclbpf_collectives`, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub comm: u64,
    /// The rank in the communicator.
    pub rank: u32,
    pub collective: &'static str,
    /// The caller's per-call profiler tag (NCCL 2.31+), in decimal; "other" for the tags past
    /// the process's bound; `None` when untagged.
    pub user_tag: Option<String>,
    /// Upper bound of the power-of-two size bucket, bytes.
    pub size_bytes: u64,
    pub algorithm: &'static str,
    pub protocol: &'static str,
    /// Timed operations, their GPU time summed (ns), bytes, bus bytes, shortest and longest.
    pub count: u64,
    pub sum_ns: u64,
    pub bytes: u64,
    pub bus_bytes: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub untimed: u64,
    /// Timed operations per duration bucket (bound [`bound_ns`]), not cumulative.
    pub hist: [u64; HIST],
}

/// The upper bound of duration bucket `i` (ns); `None` for the last (above every bound).
pub fn bound_ns(i: usize) -> Option<u64> {
    (i + 1 < HIST).then(|| 1000u64 << i)
}

impl Entry {
    /// The bound of the bucket that holds quantile `q` (0–1) of the timed operations: "at
    /// most this long" (`None` above the last bound or with nothing timed).
    pub fn quantile_bound_ns(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let want = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut cum = 0;
        for (i, n) in self.hist.iter().enumerate() {
            cum += n;
            if cum >= want {
                return bound_ns(i);
            }
        }
        None
    }
}

/// Every readable entry of a process's `ncclbpf_collectives` (at most `limit`); an entry of
/// another format or shape is skipped.
pub fn entries(v: &MapView, limit: usize) -> Vec<Entry> {
    let s = &v.spec;
    let (format, nwords) = match s.value_size as usize {
        n if n == WORDS * 8 => (FORMAT, WORDS),
        n if n == WORDS_TAGGED * 8 => (FORMAT_TAGGED, WORDS_TAGGED),
        _ => return vec![],
    };
    if s.kind != MapType::Hash || s.key_size != 16 {
        return vec![];
    }
    let mut out = vec![];
    for (k, vals) in v.entries().into_iter().take(limit) {
        let Some(w) = vals.first().map(|x| words(x)) else {
            continue;
        };
        if w.len() != nwords || w[0] != format || k.len() != 16 {
            continue;
        }
        let b = u32::from_le_bytes(k[12..].try_into().expect("4 bytes"));
        let user_tag = match (format, b >> TAG_SHIFT) {
            (FORMAT, _) | (_, 0) => None,
            (_, TAG_OTHER) => Some("other".to_string()),
            _ => Some(w[WORDS].to_string()),
        };
        let b = b & ((1 << TAG_SHIFT) - 1);
        let (p, a) = ((b % 4) as usize, ((b / 4) % 8) as usize);
        let size = (b / 32) % SIZE_BUCKETS;
        let func = ((b / 32) / SIZE_BUCKETS).min(15) as usize;
        out.push(Entry {
            comm: u64::from_le_bytes(k[..8].try_into().expect("8 bytes")),
            rank: u32::from_le_bytes(k[8..12].try_into().expect("4 bytes")),
            collective: FUNCS[func],
            user_tag,
            size_bytes: 1u64 << size,
            algorithm: ALGOS[a],
            protocol: PROTOS[p],
            count: w[1],
            sum_ns: w[2],
            bytes: w[3],
            bus_bytes: w[4],
            min_ns: w[5],
            max_ns: w[6],
            untimed: w[7],
            hist: std::array::from_fn(|i| w[HIST_AT + i]),
        });
    }
    out
}

/// The per-collective families of one process, from its `ncclbpf_collectives`.
pub fn collective_metrics(e: &mut Exposition, base: &Labels, v: &MapView, limit: usize) {
    for x in entries(v, limit) {
        let mut l = base.clone();
        // The launcher's rank (base) is the process's; this is the rank in the communicator.
        l.retain(|(n, _)| *n != "rank");
        l.extend([
            ("comm", format!("{:#018x}", x.comm)),
            ("rank", x.rank.to_string()),
            ("collective", x.collective.to_string()),
            ("size_bytes", x.size_bytes.to_string()),
            ("algorithm", x.algorithm.to_string()),
            ("protocol", x.protocol.to_string()),
        ]);
        if let Some(t) = &x.user_tag {
            l.push(("user_tag", t.clone()));
        }
        if x.untimed > 0 {
            e.add(UNTIMED, Kind::Counter, "", l.clone(), x.untimed);
        }
        if x.count == 0 {
            continue;
        }
        let mut cum = 0u64;
        for (i, n) in x.hist.iter().enumerate() {
            cum += n;
            let le = match bound_ns(i) {
                Some(b) => format!("{}", b as f64 / 1e9),
                None => "+Inf".to_string(),
            };
            let mut bl = l.clone();
            bl.push(("le", le));
            e.add_part(DURATION, "_bucket", Kind::Histogram, "", bl, cum);
        }
        let secs = x.sum_ns as f64 * 1e-9;
        e.add_part(DURATION, "_sum", Kind::Histogram, "", l.clone(), secs);
        e.add_part(DURATION, "_count", Kind::Histogram, "", l.clone(), x.count);
        e.add(BYTES, Kind::Counter, "", l.clone(), x.bytes);
        e.add(BUS_BYTES, Kind::Counter, "", l.clone(), x.bus_bytes);
        if secs > 0.0 {
            e.add(BUS_BW, Kind::Gauge, "", l, x.bus_bytes as f64 / secs);
        }
    }
}

/// The profiler's counters of a process (`ncclbpf_profiler`), by name, `None` when the map is
/// of another shape or format.
pub fn counters(v: &MapView) -> Option<Vec<(&'static str, u64)>> {
    let s = &v.spec;
    if s.kind != MapType::Hash || s.key_size != 8 || (s.value_size as usize) < 8 {
        return None;
    }
    let w = v
        .entries()
        .first()
        .and_then(|(_, x)| x.first())
        .map(|x| words(x))?;
    if w.first() != Some(&FORMAT) {
        return None;
    }
    Some(
        COUNTER_NAMES
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, w.get(i + 1).copied().unwrap_or(0)))
            .collect(),
    )
}

/// The profiler's own counters of one process, from its `ncclbpf_profiler`.
pub fn counter_metrics(e: &mut Exposition, base: &Labels, v: &MapView) {
    let Some(c) = counters(v) else { return };
    let get = |name: &str| c.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v);
    let with = |k: &'static str, v: &str| {
        let mut l = base.clone();
        l.push((k, v.to_string()));
        l
    };
    for (o, n) in [
        ("followed", "events_followed"),
        ("ignored", "events_ignored"),
        ("orphaned", "orphans"),
    ] {
        e.add(EVENTS, Kind::Counter, "", with("outcome", o), get(n));
    }
    for (o, n) in [
        ("timed", "ops_timed"),
        ("untimed", "ops_untimed"),
        ("reclaimed", "reclaimed_pending"),
    ] {
        e.add(OPS, Kind::Counter, "", with("outcome", o), get(n));
    }
    for r in MISUSE_REASONS {
        e.add(MISUSE, Kind::Counter, "", with("reason", r), get(r));
    }
    for (what, n) in [("events", "open_events"), ("contexts", "open_contexts")] {
        e.add(OPEN, Kind::Gauge, "", with("what", what), get(n));
    }
}
