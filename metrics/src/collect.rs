//! What the metrics say, read from the registry of the current user: every process's
//! connection table ([`shared_maps::conn_table`]), its tuner contexts' decision records
//! (`ncclbpf_decisions`) and its policies' maps, all through read-only mappings of shared
//! memory. Nothing here asks a process anything, so a process stuck inside a collective, or
//! stopped, is read like any other.
//!
//! See `docs/guide/metrics.md` for every family, its labels and the bounds on cardinality.

use crate::expo::{Exposition, Kind, Labels};
use shared_maps::conn_table::{self, ConnTableView, ProcessConns};
use shared_maps::{ConnDirection, MapType, MapView};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

/// The tuner's decision records (`tuner/src/sequence.rs`): read here by their documented
/// layout, not through the tuner crate.
const DECISIONS_MAP: &str = "ncclbpf_decisions";
/// Format 2: words 0-39 as format 1, 40-47 the agreement, 48 on the counts.
const DECISIONS_FORMAT: u64 = 2;
const DECISIONS_FLAG_POLICY: u64 = 1;
const DECISIONS_FLAG_FINALIZED: u64 = 2;
/// Word 40: the agreement words' version (odd while they change); 41-47 state, epoch in use,
/// current epoch, epoch waited for, waiting since (Unix ns), K, D.
const AGREEMENT_AT: usize = 40;
/// "None" in the agreement's epoch words.
const NO_EPOCH: u64 = u64::MAX;
/// Word 48 on: counts by ((collective × 9 + algorithm + 1) × 5 + protocol + 1) × 2 + applied.
const COUNTS_AT: usize = 48;
/// Collective buckets' labels: NCCL's `ncclFunc_t` 0-7 as NCCL's logs spell them, lowercase,
/// then any other.
const COLLECTIVES: [&str; 9] = [
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "allreduce",
    "sendrecv",
    "send",
    "recv",
    "other",
];
/// Algorithm buckets' labels: -1 (the policy left it to NCCL), NCCL's 0-6, any other.
const ALGORITHMS: [&str; 9] = [
    "nccl",
    "tree",
    "ring",
    "collnetdirect",
    "collnetchain",
    "nvls",
    "nvlstree",
    "pat",
    "other",
];
/// Protocol buckets' labels: -1, NCCL's 0-2, any other.
const PROTOCOLS: [&str; 5] = ["nccl", "ll", "ll128", "simple", "other"];
const COUNT_WORDS: usize = COLLECTIVES.len() * ALGORITHMS.len() * PROTOCOLS.len() * 2;
const DECISIONS_WORDS: usize = COUNTS_AT + COUNT_WORDS;
/// Agreement state word values' labels.
const AGREEMENT_STATES: [&str; 5] = ["none", "starting", "deciding", "waiting", "stopped"];

/// Bounds on what one scrape exports.
#[derive(Clone, Debug)]
pub struct Options {
    /// Connection ends with their own series, over all processes of the scrape (in pid, then
    /// slot order); the rest are counted in `ncclbpf_exporter_connections_dropped` (and still
    /// in `nccl_net_connections`).
    pub max_connections: usize,
    /// Non-zero entries exported per policy map; the rest are counted in
    /// `ncclbpf_map_entries_dropped`.
    pub map_entries: usize,
    /// The `host` label.
    pub host: String,
}

/// Connection ends exported per scrape by default: a whole table of one process (4096) is
/// far below it; 10,000 ends give about 80,000 samples (see `docs/guide/metrics.md`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Policy map entries exported per map by default.
pub const DEFAULT_MAP_ENTRIES: usize = 64;
/// Words (of 8 or 4 bytes) of a map value exported; longer values are left out (counted as
/// dropped).
pub const MAX_VALUE_WORDS: usize = 32;

impl Default for Options {
    fn default() -> Options {
        Options {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            map_entries: DEFAULT_MAP_ENTRIES,
            host: hostname(),
        }
    }
}

/// This machine's name (the `host` label), `unknown` if it has none.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(s) if rc == 0 && !s.is_empty() => s.to_string(),
        _ => "unknown".into(),
    }
}

/// Live processes of this user that registered maps in `dir`, ascending. A registry file
/// that another user owns is skipped (the directory is this user's, mode 0700; the check
/// also covers a `NCCL_BPF_SHM_DIR` pointed elsewhere).
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut out: Vec<u32> = rd
        .flatten()
        .filter_map(|e| {
            let pid = e
                .file_name()
                .to_str()?
                .strip_suffix(".maps")?
                .parse::<u32>()
                .ok()?;
            let md = e.metadata().ok()?;
            (md.uid() == me && shared_maps::pid_alive(pid)).then_some(pid)
        })
        .collect();
    out.sort_unstable();
    out
}

/// The rank of process `pid` as its launcher set it in the environment it started with
/// (`RANK`, else `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`); `None` when none is set
/// or the environment cannot be read. This is the job's global rank, not a rank within a
/// particular communicator (NCCL does not tell the net plugin those).
pub fn launcher_rank(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    const VARS: [&str; 4] = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"];
    let mut found: [Option<&[u8]>; 4] = [None; 4];
    for kv in env.split(|&b| b == 0) {
        for (i, v) in VARS.iter().enumerate() {
            if let Some(rest) = kv.strip_prefix(v.as_bytes())
                && let Some(val) = rest.strip_prefix(b"=")
            {
                found[i] = Some(val);
            }
        }
    }
    let v = found.into_iter().flatten().next()?;
    let s = std::str::from_utf8(v).ok()?;
    (!s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.into())
}

fn hex(v: u64) -> String {
    format!("{v:#018x}")
}

/// Little-endian words of `b` (8 bytes each when the size allows, else 4), `None` otherwise.
fn words(b: &[u8]) -> Option<Vec<u64>> {
    let w = if !b.is_empty() && b.len().is_multiple_of(8) {
        8
    } else if !b.is_empty() && b.len().is_multiple_of(4) {
        4
    } else {
        return None;
    };
    Some(
        b.chunks_exact(w)
            .map(|c| {
                let mut x = [0u8; 8];
                x[..w].copy_from_slice(c);
                u64::from_le_bytes(x)
            })
            .collect(),
    )
}

/// A key as a label: its words in decimal joined by `,` (at most 4), else hex bytes.
fn key_text(k: &[u8]) -> String {
    match words(k) {
        Some(w) if w.len() <= 4 => w.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
        _ => k.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// Per-CPU copies summed word by word (wrapping at the word's width).
fn summed(vals: &[Vec<u8>]) -> Option<Vec<u64>> {
    let first = words(vals.first()?)?;
    let width = vals[0].len() / first.len();
    let mask = if width == 8 {
        u64::MAX
    } else {
        u32::MAX as u64
    };
    let mut total = first;
    for v in &vals[1..] {
        for (t, x) in total.iter_mut().zip(words(v)?) {
            *t = t.wrapping_add(x) & mask;
        }
    }
    Some(total)
}

// Family names and help, declared in one place so an empty scrape lists them all.
const SENT: &str = "nccl_net_sent_bytes_total";
const RECEIVED: &str = "nccl_net_received_bytes_total";
const SEND_OPS: &str = "nccl_net_send_ops_total";
const RECV_OPS: &str = "nccl_net_recv_ops_total";
const INFLIGHT: &str = "nccl_net_inflight_requests";
const PROGRESS: &str = "nccl_net_last_progress_timestamp_seconds";
const WAITING: &str = "nccl_net_waiting_seconds";
const OPENED: &str = "nccl_net_connection_opened_timestamp_seconds";
const ERRORS: &str = "nccl_net_errors_total";
const CONNECTIONS: &str = "nccl_net_connections";
const CAPACITY: &str = "ncclbpf_conn_table_capacity";
const TABLE_OK: &str = "ncclbpf_conn_table_readable";
const RUNS: &str = "ncclbpf_policy_runs_total";
const RELOADS: &str = "ncclbpf_policy_reloads_total";
const DURATION_HIST: &str = "nccl_net_op_duration_seconds";
const CONTEXTS: &str = "ncclbpf_tuner_contexts";
const DECISIONS: &str = "nccl_tuner_decisions_total";
const AGREE_STATE: &str = "ncclbpf_agreement_state";
const AGREE_EPOCH: &str = "ncclbpf_agreement_epoch";
const AGREE_LAG: &str = "ncclbpf_agreement_lag_epochs";
const AGREE_WAITING: &str = "ncclbpf_agreement_waiting_seconds";
const AGREE_K: &str = "ncclbpf_agreement_epoch_collectives";
const AGREE_D: &str = "ncclbpf_agreement_delay_epochs";
const MAP_VALUE: &str = "ncclbpf_map_value";
const MAP_ENTRIES: &str = "ncclbpf_map_entries";
const MAP_DROPPED: &str = "ncclbpf_map_entries_dropped";
const PROC_UP: &str = "ncclbpf_process_readable";
const PROCS: &str = "ncclbpf_exporter_processes";
const CONN_DROPPED: &str = "ncclbpf_exporter_connections_dropped";
const DURATION: &str = "ncclbpf_exporter_scrape_duration_seconds";

fn declare(e: &mut Exposition) {
    for (n, k, h) in FAMILIES.iter().chain(&crate::profiled::FAMILIES) {
        e.family(n, *k, h);
    }
}

const FAMILIES: [(&str, Kind, &str); 30] = [
    (
        SENT,
        Kind::Counter,
        "Bytes sent by completed requests of a connection end.",
    ),
    (
        RECEIVED,
        Kind::Counter,
        "Bytes received by completed requests of a connection end.",
    ),
    (
        SEND_OPS,
        Kind::Counter,
        "Send requests completed on a connection end.",
    ),
    (
        RECV_OPS,
        Kind::Counter,
        "Receive requests completed on a connection end.",
    ),
    (
        INFLIGHT,
        Kind::Gauge,
        "Requests posted and neither completed nor failed.",
    ),
    (
        PROGRESS,
        Kind::Gauge,
        "When the connection end last made progress (a completion or a chunk moved; the opening before any), Unix seconds.",
    ),
    (
        WAITING,
        Kind::Gauge,
        "While requests are pending: seconds they have waited with no progress (0 when none is pending). A stall is a large value.",
    ),
    (
        OPENED,
        Kind::Gauge,
        "When the connection end opened, Unix seconds.",
    ),
    (
        ERRORS,
        Kind::Counter,
        "Failed requests of a connection end, by kind.",
    ),
    (
        CONNECTIONS,
        Kind::Gauge,
        "Open connection ends of a process with a record in its table.",
    ),
    (
        CAPACITY,
        Kind::Gauge,
        "Slots of a process's connection table (ends beyond it are not counted).",
    ),
    (
        RUNS,
        Kind::Counter,
        "Runs of a policy program, by hook (tuner: decisions a tuner context made with a policy).",
    ),
    (
        CONTEXTS,
        Kind::Gauge,
        "Tuner contexts of a process with a decision record, by state (unreadable: a record of a format this build does not read, only when there is one).",
    ),
    (
        DECISIONS,
        Kind::Counter,
        "Decisions of a tuner context with a policy, by collective, algorithm and protocol the policy chose (nccl: left to NCCL; other: out of NCCL's range) and whether the choice was applied to NCCL's cost table.",
    ),
    (
        AGREE_STATE,
        Kind::Gauge,
        "1 for the state a tuner context's agreement is in (starting: no epoch applied yet, deciding, waiting: for every rank's record of an epoch, stopped: ranks differ or a wait timed out), 0 for the others.",
    ),
    (
        AGREE_EPOCH,
        Kind::Gauge,
        "The agreed epoch a tuner context's decisions use (absent while it has none).",
    ),
    (
        AGREE_LAG,
        Kind::Gauge,
        "Epochs between the one a tuner context is in and the one its decisions use; D (ncclbpf_agreement_delay_epochs) is normal.",
    ),
    (
        AGREE_WAITING,
        Kind::Gauge,
        "While a tuner context waits for the other ranks' records of an epoch: seconds it has waited (0 when not waiting).",
    ),
    (
        AGREE_K,
        Kind::Gauge,
        "Collectives per epoch of a tuner context's agreement (K).",
    ),
    (
        AGREE_D,
        Kind::Gauge,
        "Epochs between posting an epoch's record and deciding from it (D).",
    ),
    (
        RELOADS,
        Kind::Counter,
        "Policy reloads a process answered (ncclbpf reload, also staged), by result.",
    ),
    (
        DURATION_HIST,
        Kind::Histogram,
        "Post to completion of each request of a connection, from the net_stats policy's log2 histogram (only while a policy with it is loaded; no _sum: the policy keeps none).",
    ),
    (
        MAP_VALUE,
        Kind::Gauge,
        "A word of a policy map's value (per-CPU copies summed), by map, key and word index.",
    ),
    (
        MAP_ENTRIES,
        Kind::Gauge,
        "Non-zero entries of a policy map.",
    ),
    (
        MAP_DROPPED,
        Kind::Gauge,
        "Non-zero entries of a policy map left out of this scrape (over the per-map limit, or values too long).",
    ),
    (
        TABLE_OK,
        Kind::Gauge,
        "1 when the process's connection table was read, 0 when its layout is one this build does not know (another ncclbpf version); absent when it has none.",
    ),
    (
        PROC_UP,
        Kind::Gauge,
        "1 when the process's maps could be read, 0 when not.",
    ),
    (
        PROCS,
        Kind::Gauge,
        "Processes of this user in the registry, by whether they could be read.",
    ),
    (
        CONN_DROPPED,
        Kind::Gauge,
        "Connection ends left without their own series in this scrape (over --max-connections).",
    ),
    (
        DURATION,
        Kind::Gauge,
        "Seconds this scrape took to read and render.",
    ),
];

/// Renders the metrics of `pids` (every process of the registry in `dir` when `None`).
pub fn render(dir: &Path, pids: Option<&[u32]>, opts: &Options) -> String {
    let t = Instant::now();
    let listed;
    let pids = match pids {
        Some(p) => p,
        None => {
            listed = processes_in(dir);
            &listed
        }
    };
    let mut e = Exposition::new();
    declare(&mut e);
    let mut budget = opts.max_connections;
    let mut dropped = 0u64;
    let (mut ok, mut bad) = (0u64, 0u64);
    for &pid in pids {
        let base = base_labels(pid, &opts.host);
        match MapView::open_all_in(dir, pid) {
            Ok(views) => {
                ok += 1;
                e.add(PROC_UP, Kind::Gauge, "", base.clone(), 1u64);
                match ConnTableView::find(&views, pid) {
                    Ok(Some(t)) => {
                        let conns = ProcessConns {
                            capacity: t.capacity(),
                            clock: t.clock(),
                            now_ns: t.now_ns(),
                            conns: t.snapshot(),
                        };
                        e.add(TABLE_OK, Kind::Gauge, "", base.clone(), 1u64);
                        dropped += conn_metrics(&mut e, &base, &conns, &mut budget);
                        let (ok, failed) = t.reloads();
                        for (r, n) in [("ok", ok), ("failed", failed)] {
                            let mut l = base.clone();
                            l.push(("result", r.into()));
                            e.add(RELOADS, Kind::Counter, "", l, n);
                        }
                    }
                    Ok(None) => {}
                    // A layout this build does not know: said, and its maps still exported.
                    Err(_) => e.add(TABLE_OK, Kind::Gauge, "", base.clone(), 0u64),
                }
                // Two maps listed under one name (a private map of a program reloaded while
                // the old one lives on) get `name#2`, … so no two samples share their labels.
                let mut seen: HashMap<&str, usize> = HashMap::new();
                for v in &views {
                    let n = seen.entry(v.name.as_str()).or_insert(0);
                    *n += 1;
                    let shown = if *n == 1 {
                        v.name.clone()
                    } else {
                        format!("{}#{n}", v.name)
                    };
                    if v.name == DECISIONS_MAP {
                        decision_metrics(&mut e, &base, v);
                        continue;
                    }
                    if v.name == crate::profiled::COLLECTIVES_MAP {
                        crate::profiled::collective_metrics(&mut e, &base, v, opts.map_entries);
                        continue;
                    }
                    if v.name == crate::profiled::PROFILER_MAP {
                        crate::profiled::counter_metrics(&mut e, &base, v);
                        continue;
                    }
                    if v.name == NET_STATS_MAP {
                        duration_metrics(&mut e, &base, v, opts.max_connections);
                    }
                    if v.name != conn_table::TABLE_NAME
                        && !v.name.starts_with(shared_maps::RUNTIME_PREFIX)
                        && !v.name.ends_with(".rodata")
                    {
                        map_metrics(&mut e, &base, v, &shown, opts.map_entries);
                    }
                }
            }
            // A live process that registered nothing yet (the in-process endpoint before the
            // first connection): read, with nothing in it.
            Err(err)
                if err.kind() == std::io::ErrorKind::NotFound && shared_maps::pid_alive(pid) =>
            {
                ok += 1;
                e.add(PROC_UP, Kind::Gauge, "", base, 1u64);
            }
            Err(_) => {
                bad += 1;
                e.add(PROC_UP, Kind::Gauge, "", base, 0u64);
            }
        }
    }
    let host = vec![("host", opts.host.clone())];
    let with = |k: &'static str, v: &str| {
        let mut l = host.clone();
        l.push((k, v.to_string()));
        l
    };
    e.add(PROCS, Kind::Gauge, "", with("state", "read"), ok);
    e.add(PROCS, Kind::Gauge, "", with("state", "unreadable"), bad);
    e.add(CONN_DROPPED, Kind::Gauge, "", host.clone(), dropped);
    e.add(DURATION, Kind::Gauge, "", host, t.elapsed().as_secs_f64());
    e.render()
}

fn base_labels(pid: u32, host: &str) -> Labels {
    let mut l: Labels = vec![("pid", pid.to_string()), ("host", host.to_string())];
    if let Some(r) = launcher_rank(pid) {
        l.push(("rank", r));
    }
    l
}

fn secs(ns: u64) -> f64 {
    // Milliseconds are plenty (the clock is coarse); fewer digits in the text.
    (ns / 1_000_000) as f64 / 1e3
}

/// Per-connection series for up to `budget` ends; returns how many were left out.
fn conn_metrics(e: &mut Exposition, base: &Labels, t: &ProcessConns, budget: &mut usize) -> u64 {
    let mut dropped = 0;
    let (mut sends, mut recvs) = (0u64, 0u64);
    let mut conns: Vec<_> = t.conns.iter().collect();
    conns.sort_by_key(|c| c.slot);
    for c in conns {
        match c.direction {
            ConnDirection::Send => sends += 1,
            ConnDirection::Recv => recvs += 1,
        }
        if *budget == 0 {
            dropped += 1;
            continue;
        }
        *budget -= 1;
        let mut l = base.clone();
        l.extend([
            ("comm", hex(c.comm_id)),
            ("conn", hex(c.conn_id)),
            ("direction", c.direction.name().to_string()),
            (
                "peer_addr",
                c.peer_ip.map_or(String::new(), |a| a.to_string()),
            ),
            ("peer_port", c.peer_port.to_string()),
            ("device", c.dev.to_string()),
        ]);
        let (bytes, ops) = match c.direction {
            ConnDirection::Send => (SENT, SEND_OPS),
            ConnDirection::Recv => (RECEIVED, RECV_OPS),
        };
        e.add(bytes, Kind::Counter, "", l.clone(), c.bytes);
        e.add(ops, Kind::Counter, "", l.clone(), c.messages);
        e.add(INFLIGHT, Kind::Gauge, "", l.clone(), c.inflight);
        e.add(
            PROGRESS,
            Kind::Gauge,
            "",
            l.clone(),
            secs(t.clock.wall_ns(c.last_progress_ns)),
        );
        e.add(
            WAITING,
            Kind::Gauge,
            "",
            l.clone(),
            secs(c.waiting_ns(t.now_ns).unwrap_or(0)),
        );
        e.add(
            OPENED,
            Kind::Gauge,
            "",
            l.clone(),
            secs(t.clock.wall_ns(c.opened_ns)),
        );
        // Policy runs at this end's hooks, where a program ran (no series otherwise).
        let post = match c.direction {
            ConnDirection::Send => "net/isend",
            ConnDirection::Recv => "net/irecv",
        };
        for (hook, n) in [(post, c.post_runs), ("net/complete", c.complete_runs)] {
            if n > 0 {
                let mut hl = l.clone();
                hl.push(("hook", hook.into()));
                e.add(RUNS, Kind::Counter, "", hl, n);
            }
        }
        l.push(("kind", "request".into()));
        e.add(ERRORS, Kind::Counter, "", l, c.errors);
    }
    for (d, n) in [("send", sends), ("recv", recvs)] {
        let mut l = base.clone();
        l.push(("direction", d.into()));
        e.add(CONNECTIONS, Kind::Gauge, "", l, n);
    }
    e.add(CAPACITY, Kind::Gauge, "", base.clone(), t.capacity as u64);
    dropped
}

/// `ncclbpf_decisions`: key (comm id, context number), value words 0 format, 1 2×seq, 3
/// calls decided outside the sequence, 7 flags (the same in formats 1 and 2), then in format 2
/// the agreement words and the counts. A record of another format is counted as unreadable.
fn decision_metrics(e: &mut Exposition, base: &Labels, v: &MapView) {
    if v.spec.kind != MapType::Hash || v.spec.key_size != 16 || v.spec.value_size < 64 {
        return;
    }
    let (mut live, mut finalized, mut unreadable) = (0u64, 0u64, 0u64);
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Two reads, as `ncclbpf decisions --compare` takes them: the agreement words are trusted
    // when their version word is the same even number in both.
    let (first, second) = (v.entries(), v.entries());
    let again: HashMap<&[u8], &[u8]> = second.iter().map(|(k, x)| (&k[..], &x[0][..])).collect();
    for (k, vals) in &first {
        let (Some(k), Some(w)) = (words(k), vals.first().and_then(|x| words(x))) else {
            continue;
        };
        let v2 = w.len() == DECISIONS_WORDS && w[0] == DECISIONS_FORMAT;
        if k.len() != 2 || w.len() < 8 || !(v2 || (w[0] == 1 && w.len() == AGREEMENT_AT)) {
            unreadable += 1;
            continue;
        }
        if w[7] & DECISIONS_FLAG_FINALIZED != 0 {
            finalized += 1;
        } else {
            live += 1;
        }
        if w[7] & DECISIONS_FLAG_POLICY == 0 {
            continue;
        }
        let mut l = base.clone();
        l.extend([("comm", hex(k[0])), ("context", k[1].to_string())]);
        let mut runs = l.clone();
        runs.insert(base.len(), ("hook", "tuner".to_string()));
        // seq counts the decisions in order (word 1 is odd while one is being written: the
        // count before it); word 3 those decided outside the sequence.
        e.add(
            RUNS,
            Kind::Counter,
            "",
            runs,
            (w[1] >> 1).wrapping_add(w[3]),
        );
        if !v2 {
            continue;
        }
        for (i, &n) in w[COUNTS_AT..].iter().enumerate() {
            if n == 0 {
                continue;
            }
            let (applied, rest) = (i % 2 == 1, i / 2);
            let (p, rest) = (rest % PROTOCOLS.len(), rest / PROTOCOLS.len());
            let (a, c) = (rest % ALGORITHMS.len(), rest / ALGORITHMS.len());
            let mut dl = l.clone();
            dl.extend([
                ("collective", COLLECTIVES[c].to_string()),
                ("algorithm", ALGORITHMS[a].to_string()),
                ("protocol", PROTOCOLS[p].to_string()),
                ("applied", applied.to_string()),
            ]);
            e.add(DECISIONS, Kind::Counter, "", dl, n);
        }
        let later = again
            .get(&k_bytes(k[0], k[1])[..])
            .and_then(|x| words(x))
            .filter(|x| x.len() == DECISIONS_WORDS);
        let Some(later) = later else { continue };
        // A finalized context's agreement words are its last moment's, not a state.
        if w[7] & DECISIONS_FLAG_FINALIZED != 0 {
            continue;
        }
        let version = w[AGREEMENT_AT];
        if version % 2 == 1 || later[AGREEMENT_AT] != version {
            continue;
        }
        agreement_metrics(e, &l, &w[AGREEMENT_AT + 1..COUNTS_AT], now_ns);
    }
    for (s, n) in [
        ("live", live),
        ("finalized", finalized),
        ("unreadable", unreadable),
    ] {
        if s == "unreadable" && n == 0 {
            continue;
        }
        let mut l = base.clone();
        l.push(("state", s.into()));
        e.add(CONTEXTS, Kind::Gauge, "", l, n);
    }
}

fn k_bytes(comm: u64, context: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&comm.to_le_bytes());
    k[8..].copy_from_slice(&context.to_le_bytes());
    k
}

/// A context's agreement words (state, epoch in use, current epoch, epoch waited for, waiting
/// since in Unix ns, K, D); nothing for a context without an agreement.
fn agreement_metrics(e: &mut Exposition, l: &Labels, a: &[u64], now_ns: u64) {
    let (state, used, current, since, k, d) = (a[0], a[1], a[2], a[4], a[5], a[6]);
    if state == 0 || state as usize >= AGREEMENT_STATES.len() {
        return;
    }
    for (i, name) in AGREEMENT_STATES.iter().enumerate().skip(1) {
        let mut sl = l.clone();
        sl.push(("state", name.to_string()));
        e.add(
            AGREE_STATE,
            Kind::Gauge,
            "",
            sl,
            u64::from(i as u64 == state),
        );
    }
    if used != NO_EPOCH {
        e.add(AGREE_EPOCH, Kind::Gauge, "", l.clone(), used);
        e.add(
            AGREE_LAG,
            Kind::Gauge,
            "",
            l.clone(),
            current.saturating_sub(used),
        );
    }
    let waited = if since == 0 {
        0
    } else {
        now_ns.saturating_sub(since)
    };
    e.add(AGREE_WAITING, Kind::Gauge, "", l.clone(), secs(waited));
    e.add(AGREE_K, Kind::Gauge, "", l.clone(), k);
    e.add(AGREE_D, Kind::Gauge, "", l.clone(), d);
}

/// The shipped `net_stats` policy's per-connection map (`policies/src/net_stats.c`): key the
/// connection id, value send/recv bytes, sends, recvs, errors, then 16 completions counted by
/// log2 of the latency in microseconds (bucket 0: under 2 µs; bucket b: [2^b, 2^(b+1)) µs;
/// bucket 15 open-ended). Recognized by name and shape.
const NET_STATS_MAP: &str = "net_conn_stats";
const NET_STATS_WORDS: usize = 5 + 16;

/// `nccl_net_op_duration_seconds` per connection from `net_conn_stats`, for up to `limit`
/// connections.
fn duration_metrics(e: &mut Exposition, base: &Labels, v: &MapView, limit: usize) {
    let s = &v.spec;
    if s.kind != MapType::Hash || s.key_size != 8 || s.value_size as usize != NET_STATS_WORDS * 8 {
        return;
    }
    for (k, vals) in v.entries().into_iter().take(limit) {
        let (Some(k), Some(w)) = (words(&k), summed(&vals)) else {
            continue;
        };
        let hist = &w[5..NET_STATS_WORDS];
        let total: u64 = hist.iter().sum();
        if total == 0 {
            continue;
        }
        let mut l = base.clone();
        l.push(("conn", hex(k[0])));
        let mut cum = 0u64;
        for (b, n) in hist.iter().enumerate() {
            cum += n;
            let le = if b + 1 == hist.len() {
                "+Inf".to_string()
            } else {
                // Upper bound of bucket b: 2^(b+1) µs.
                format!("{}", (1u64 << (b + 1)) as f64 * 1e-6)
            };
            let mut bl = l.clone();
            bl.push(("le", le));
            e.add_part(DURATION_HIST, "_bucket", Kind::Histogram, "", bl, cum);
        }
        e.add_part(DURATION_HIST, "_count", Kind::Histogram, "", l, total);
    }
}

/// A policy map: its first `limit` non-zero entries, one sample per word of the value.
fn map_metrics(e: &mut Exposition, base: &Labels, v: &MapView, name: &str, limit: usize) {
    let mut nonzero = 0u64;
    let mut exported = 0usize;
    let mut dropped = 0u64;
    for (k, vals) in v.entries() {
        if !vals.iter().any(|x| x.iter().any(|&b| b != 0)) {
            continue;
        }
        nonzero += 1;
        let w = match summed(&vals) {
            Some(w) if w.len() <= MAX_VALUE_WORDS && exported < limit => w,
            _ => {
                dropped += 1;
                continue;
            }
        };
        exported += 1;
        let key = key_text(&k);
        for (i, x) in w.iter().enumerate() {
            let mut l = base.clone();
            l.extend([
                ("map", name.to_string()),
                ("key", key.clone()),
                ("word", i.to_string()),
            ]);
            e.add(MAP_VALUE, Kind::Gauge, "", l, *x);
        }
    }
    let mut l = base.clone();
    l.push(("map", name.to_string()));
    e.add(MAP_ENTRIES, Kind::Gauge, "", l.clone(), nonzero);
    e.add(MAP_DROPPED, Kind::Gauge, "", l, dropped);
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_maps::{ConnLabels, ConnTable, MapSpec, Registry};

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ncclbpf-metrics-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn sample<'a>(text: &'a str, name: &str, has: &[&str]) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && has.iter().all(|h| l.contains(h)))
            .collect()
    }

    #[test]
    fn renders_a_process_read_from_shared_memory() {
        let dir = scratch("proc");
        let r = Registry::new(dir.clone());
        let t = ConnTable::shared(&r, 8).unwrap();
        let l = ConnLabels {
            direction: ConnDirection::Send,
            conn_id: 0x42,
            comm_id: 0xa9ee,
            dev: 1,
            peer_ip: Some("127.0.0.1".parse().unwrap()),
            peer_port: 41000,
            local_port: 42000,
        };
        let g = t.register(&l).unwrap();
        g.posted();
        g.completed(4096);
        g.posted();
        g.failed();
        g.posted();
        g.ran(false);
        g.ran(false);
        g.ran(true);
        let rg = t
            .register(&ConnLabels {
                direction: ConnDirection::Recv,
                conn_id: 0x43,
                ..l
            })
            .unwrap();
        rg.posted();
        rg.completed(100);
        let m = r
            .shared(
                &MapSpec {
                    name: "counts".into(),
                    kind: MapType::Array,
                    key_size: 4,
                    value_size: 16,
                    max_entries: 100,
                },
                "p",
            )
            .unwrap();
        for k in 0..100u32 {
            let v = [u64::from(k) + 1, 7].map(u64::to_le_bytes).concat();
            m.update(&k.to_le_bytes(), &v, 0).unwrap();
        }
        // The net_stats policy's per-connection map: 3 completions under 2 µs, 1 in
        // [8, 16) µs, 2 open-ended.
        let ns = r
            .shared(
                &MapSpec {
                    name: NET_STATS_MAP.into(),
                    kind: MapType::Hash,
                    key_size: 8,
                    value_size: (NET_STATS_WORDS * 8) as u32,
                    max_entries: 16,
                },
                "net_stats",
            )
            .unwrap();
        let mut w = [0u64; NET_STATS_WORDS];
        w[0] = 4096;
        w[5] = 3;
        w[5 + 3] = 1;
        w[5 + 15] = 2;
        ns.update(&0x42u64.to_le_bytes(), &w.map(u64::to_le_bytes).concat(), 0)
            .unwrap();
        t.count_reload(true);
        t.count_reload(false);
        t.count_reload(false);
        // Two private maps under one listed name (an old and a new program's global data).
        let bss = MapSpec {
            name: ".bss".into(),
            kind: MapType::Array,
            key_size: 4,
            value_size: 8,
            max_entries: 1,
        };
        let (b1, b2) = (r.private(&bss, "p").unwrap(), r.private(&bss, "p").unwrap());
        b1.update(&0u32.to_le_bytes(), &5u64.to_le_bytes(), 0)
            .unwrap();
        b2.update(&0u32.to_le_bytes(), &6u64.to_le_bytes(), 0)
            .unwrap();
        let pid = std::process::id();
        let opts = Options {
            max_connections: 10,
            map_entries: 5,
            host: "h\"1".into(),
        };
        let text = render(&dir, None, &opts);
        let me = format!("pid=\"{pid}\"");
        assert!(sample(&text, TABLE_OK, &[&me])[0].ends_with(" 1"), "{text}");
        let s = sample(
            &text,
            SENT,
            &[&me, "conn=\"0x0000000000000042\"", "peer_port=\"41000\""],
        );
        assert_eq!(s.len(), 1, "{text}");
        assert!(s[0].ends_with(" 4096"), "{}", s[0]);
        assert!(s[0].contains("host=\"h\\\"1\""), "{}", s[0]);
        assert!(
            s[0].contains("comm=\"0x000000000000a9ee\",conn="),
            "{}",
            s[0]
        );
        assert!(s[0].contains("peer_addr=\"127.0.0.1\""), "{}", s[0]);
        let r = sample(&text, RECEIVED, &[&me]);
        assert_eq!(r.len(), 1);
        assert!(r[0].ends_with(" 100"));
        assert!(sample(&text, INFLIGHT, &["direction=\"send\""])[0].ends_with(" 1"));
        assert!(
            sample(&text, ERRORS, &["kind=\"request\"", "direction=\"send\""])[0].ends_with(" 1")
        );
        assert!(sample(&text, CONNECTIONS, &["direction=\"recv\""])[0].ends_with(" 1"));
        // Five of the hundred entries, two words each; 95 dropped.
        assert_eq!(
            sample(&text, MAP_VALUE, &["map=\"counts\""]).len(),
            10,
            "{text}"
        );
        assert!(
            sample(
                &text,
                MAP_VALUE,
                &["map=\"counts\"", "key=\"0\"", "word=\"0\""]
            )[0]
            .ends_with(" 1")
        );
        assert!(sample(&text, MAP_DROPPED, &["map=\"counts\""])[0].ends_with(" 95"));
        assert!(sample(&text, MAP_ENTRIES, &["map=\"counts\""])[0].ends_with(" 100"));
        assert!(text.contains("ncclbpf_exporter_processes{host=\"h\\\"1\",state=\"read\"} 1\n"));
        // The histogram: cumulative buckets, +Inf and _count the total.
        let b = |le: &str| {
            let l: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.starts_with("nccl_net_op_duration_seconds_bucket{")
                        && l.contains(&format!("le=\"{le}\""))
                })
                .collect();
            assert_eq!(l.len(), 1, "{le}: {text}");
            l[0].rsplit(' ').next().unwrap().parse::<u64>().unwrap()
        };
        assert_eq!((b("0.000002"), b("0.000008"), b("0.000016")), (3, 3, 4));
        assert_eq!((b("0.032768"), b("+Inf")), (4, 6));
        assert!(text.contains("conn=\"0x0000000000000042\"} 6\n"), "{text}");
        assert!(sample(&text, RELOADS, &["result=\"ok\""])[0].ends_with(" 1"));
        assert!(sample(&text, RELOADS, &["result=\"failed\""])[0].ends_with(" 2"));
        let runs = |hook: &str| sample(&text, RUNS, &[&format!("hook=\"{hook}\"")]);
        assert!(runs("net/isend")[0].ends_with(" 2"), "{text}");
        assert!(runs("net/complete")[0].ends_with(" 1"), "{text}");
        assert!(runs("net/irecv").is_empty(), "no program ran there");
        let mut bss_values: Vec<&str> = sample(&text, MAP_VALUE, &["map=\"p:.bss"])
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap())
            .collect();
        bss_values.sort_unstable();
        assert_eq!(bss_values, ["5", "6"], "{text}");
        assert_eq!(
            sample(&text, MAP_VALUE, &["map=\"p:.bss#2\""]).len(),
            1,
            "{text}"
        );
        promtool(&text);
        // The table itself is not a policy map.
        assert!(!text.contains("map=\"ncclbpf_conns\""), "{text}");

        // A budget of one connection: the other is counted as dropped.
        let one = render(
            &dir,
            Some(&[pid]),
            &Options {
                max_connections: 1,
                ..opts.clone()
            },
        );
        assert_eq!(sample(&one, INFLIGHT, &[]).len(), 1, "{one}");
        assert!(one.contains("ncclbpf_exporter_connections_dropped{host=\"h\\\"1\"} 1\n"));
        assert!(sample(&one, CONNECTIONS, &["direction=\"recv\""])[0].ends_with(" 1"));
        drop((g, rg, b1, b2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `promtool check metrics` when installed (tests/tests/metrics.rs requires it in CI).
    fn promtool(text: &str) {
        use std::io::Write;
        let Ok(mut c) = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        else {
            println!("promtool not installed: not checked");
            return;
        };
        c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = c.wait_with_output().unwrap();
        let msg = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && msg.trim().is_empty(),
            "{msg}\n{text}"
        );
    }

    #[test]
    fn an_empty_registry_lists_the_exporters_own_families() {
        let dir = scratch("empty");
        let text = render(&dir, None, &Options::default());
        promtool(&text);
        // Families without samples are not listed (the crate writes metadata with series).
        for (n, k, _) in FAMILIES {
            let own = [PROCS, CONN_DROPPED, DURATION].contains(&n);
            let kind = match k {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            assert_eq!(
                text.contains(&format!("# TYPE {n} {kind}\n")),
                own,
                "{n}: {text}"
            );
        }
        assert!(text.contains("state=\"read\"} 0\n"));
        // A live process with nothing registered is read (nothing in it); one that is gone is
        // unreadable.
        let me = std::process::id();
        let nothing = render(&dir, Some(&[me]), &Options::default());
        assert!(
            nothing.contains(&format!("ncclbpf_process_readable{{pid=\"{me}\"")),
            "{nothing}"
        );
        assert!(nothing.contains("state=\"read\"} 1\n"), "{nothing}");
        let gone = render(&dir, Some(&[999_999_999]), &Options::default());
        assert!(
            gone.contains("ncclbpf_process_readable{pid=\"999999999\""),
            "{gone}"
        );
        assert!(gone.contains("state=\"unreadable\"} 1\n"), "{gone}");
    }

    #[test]
    fn a_table_of_another_layout_is_said_and_skipped() {
        let dir = scratch("layout");
        let r = Registry::new(dir.clone());
        // A map of the table's name and shape whose header says version 1.
        let m = r.runtime(&conn_table::table_spec(2)).unwrap();
        let mut header = vec![0u8; conn_table::SLOT_BYTES as usize];
        header[..8].copy_from_slice(&conn_table::TABLE_MAGIC.to_le_bytes());
        let v1 = 1u64 | (u64::from(conn_table::SLOT_BYTES) << 32);
        header[8..16].copy_from_slice(&v1.to_le_bytes());
        m.update(&0u32.to_le_bytes(), &header, 0).unwrap();
        let text = render(&dir, None, &Options::default());
        let me = format!("pid=\"{}\"", std::process::id());
        let l = sample(&text, TABLE_OK, &[&me]);
        assert!(l.len() == 1 && l[0].ends_with(" 0"), "{text}");
        assert!(sample(&text, CONNECTIONS, &[&me]).is_empty(), "{text}");
        assert!(sample(&text, PROC_UP, &[&me])[0].ends_with(" 1"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Per-collective figures and the profiler's counters as the profiler writes them (its own
    /// tracker and `Stats`), read here by the documented layouts.
    #[test]
    fn profiler_collectives_and_counters() {
        use ncclbpf_profiler::event::{Descr, Kind as EvKind, Op, StateUpdate};
        use ncclbpf_profiler::handles::Handle;
        use ncclbpf_profiler::tracker::Tracker;
        const KERNEL_CH_STOP: i32 = 22;
        let dir = scratch("profiler");
        let r: &'static Registry = Box::leak(Box::new(Registry::new(dir.clone())));
        let t = Tracker::new(0x46, Box::leak(Box::default()), Some(r));
        let ctx = t.init(0xc0ffee, "tp", 1, 4, 2).unwrap();
        for (i, dur) in [30_000u64, 50_000, 3_000_000].into_iter().enumerate() {
            let c = t.start(
                ctx,
                &Descr {
                    kind: EvKind::Coll(Op {
                        seq: i as u64,
                        func: 4,
                        count: 1 << 18,
                        type_size: 4,
                        algo: 1,
                        proto: 2,
                        nchannels: 1,
                        root_or_peer: 0,
                        ..Op::default()
                    }),
                    parent: Handle(0),
                    rank: 2,
                },
            );
            t.stop(c);
            let k = t.start(
                ctx,
                &Descr {
                    kind: EvKind::KernelCh {
                        channel: 0,
                        start: 1_000_000,
                    },
                    parent: c,
                    rank: 2,
                },
            );
            t.record(
                k,
                StateUpdate {
                    state: KERNEL_CH_STOP,
                    arg: 1_000_000 + dur,
                },
            );
            t.stop(k);
        }
        t.stop(Handle(0xbad));
        let text = render(&dir, None, &Options::default());
        promtool(&text);
        let one = |name: &str, has: &[&str]| -> f64 {
            let l = sample(&text, name, has);
            assert_eq!(l.len(), 1, "{name} {has:?}: {text}");
            l[0].rsplit(' ').next().unwrap().parse().unwrap()
        };
        let at = [
            "comm=\"0x0000000000c0ffee\"",
            "rank=\"2\"",
            "collective=\"allreduce\"",
            "size_bytes=\"1048576\"",
            "algorithm=\"ring\"",
            "protocol=\"simple\"",
        ];
        let count = format!("{}_count", crate::profiled::DURATION);
        let sum = format!("{}_sum", crate::profiled::DURATION);
        let bucket = format!("{}_bucket", crate::profiled::DURATION);
        assert_eq!(one(&count, &at), 3.0);
        assert!((one(&sum, &at) - 3.08e-3).abs() < 1e-9, "{text}");
        let mut le = at.to_vec();
        le.push("le=\"0.000064\"");
        assert_eq!(one(&bucket, &le), 2.0, "30 and 50 µs under 64 µs");
        // 3 × 1 MiB all_reduce on 4 ranks: bus bytes 1.5 each.
        assert_eq!(one(crate::profiled::BUS_BYTES, &at), ((3 * 3) << 19) as f64);
        let bw = one(crate::profiled::BUS_BW, &at);
        assert!((bw - ((3 * 3) << 19) as f64 / 3.08e-3).abs() < 1.0, "{bw}");
        assert_eq!(
            one(crate::profiled::MISUSE, &["reason=\"unknown_handle\""]),
            1.0
        );
        assert_eq!(one(crate::profiled::OPS, &["outcome=\"timed\""]), 3.0);
        assert_eq!(one(crate::profiled::EVENTS, &["outcome=\"orphaned\""]), 0.0);
        assert_eq!(one(crate::profiled::OPEN, &["what=\"events\""]), 0.0);
        assert_eq!(one(crate::profiled::OPEN, &["what=\"contexts\""]), 1.0);
        t.finalize(ctx);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A collective with a user tag (profiler v7, NCCL 2.31+) is a series of its own with a
    /// `user_tag` label; an untagged one has none.
    #[test]
    fn a_tagged_collective_has_a_user_tag_label() {
        use ncclbpf_profiler::event::{Descr, Kind as EvKind, Op, StateUpdate};
        use ncclbpf_profiler::handles::Handle;
        use ncclbpf_profiler::tracker::Tracker;
        let dir = scratch("profiler-tag");
        let r: &'static Registry = Box::leak(Box::new(Registry::new(dir.clone())));
        let t = Tracker::new(0x46, Box::leak(Box::default()), Some(r));
        let ctx = t.init(0x7a9, "tp", 1, 2, 0).unwrap();
        for tag in [0u64, 7, 7] {
            let op = Op {
                func: 4,
                count: 256,
                type_size: 4,
                algo: 1,
                proto: 2,
                nchannels: 1,
                user_tag: tag,
                ..Op::default()
            };
            let c = t.start(
                ctx,
                &Descr {
                    kind: EvKind::Coll(op),
                    parent: Handle(0),
                    rank: 0,
                },
            );
            t.stop(c);
            let k = t.start(
                ctx,
                &Descr {
                    kind: EvKind::KernelCh {
                        channel: 0,
                        start: 100,
                    },
                    parent: c,
                    rank: 0,
                },
            );
            t.record(
                k,
                StateUpdate {
                    state: 22,
                    arg: 2_100,
                },
            );
            t.stop(k);
        }
        let text = render(&dir, None, &Options::default());
        promtool(&text);
        let count = format!("{}_count", crate::profiled::DURATION);
        let comm = "comm=\"0x00000000000007a9\"";
        let all = sample(&text, &count, &[comm]);
        assert_eq!(all.len(), 2, "{text}");
        let tagged = sample(&text, &count, &[comm, "user_tag=\"7\""]);
        assert!(tagged.len() == 1 && tagged[0].ends_with(" 2"), "{text}");
        let untagged: Vec<_> = all.iter().filter(|l| !l.contains("user_tag")).collect();
        assert!(untagged.len() == 1 && untagged[0].ends_with(" 1"), "{text}");
        t.finalize(ctx);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Decision counts and agreement words as the tuner writes them (its own `Sequence`), read
    /// here by the documented layout; a format-1 record still gives its runs, another is
    /// counted as unreadable.
    #[test]
    fn tuner_decisions_and_agreement_words() {
        use ncclbpf_tuner::decide::Decision;
        use ncclbpf_tuner::sequence::{self, AgreementWords, Sequence, agreement_state};
        let dir = scratch("decisions");
        let r = Registry::new(dir.clone());
        let (s, p) = Sequence::new(Some(&r), 0xabc, 8, 2, true);
        assert!(p.is_none() && s.published());
        let d = |algo, proto, applied| Decision {
            algo,
            proto,
            nchannels: 0,
            applied,
        };
        for _ in 0..5 {
            s.count(4, &d(1, 2, true));
        }
        for _ in 0..2 {
            s.count(2, &d(-1, -1, false));
        }
        s.count(12, &d(9, 0, true));
        s.record(4, 1024, &d(1, 2, true));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        s.publish_agreement(&AgreementWords {
            state: agreement_state::WAITING,
            used: 5,
            current: 7,
            waiting_for: 6,
            waiting_since_ns: now - 2_500_000_000,
            epoch: 32,
            delay: 2,
        });
        // A context without a policy: counted as live, no series of its own.
        let (quiet, _) = Sequence::new(Some(&r), 0xdef, 8, 2, false);
        let text = render(&dir, None, &Options::default());
        promtool(&text);
        let one = |name: &str, has: &[&str]| -> f64 {
            let l = sample(&text, name, has);
            assert_eq!(l.len(), 1, "{name} {has:?}: {text}");
            l[0].rsplit(' ').next().unwrap().parse().unwrap()
        };
        let c = "comm=\"0x0000000000000abc\"";
        assert_eq!(
            one(
                DECISIONS,
                &[
                    c,
                    "context=\"",
                    "collective=\"allreduce\"",
                    "algorithm=\"ring\"",
                    "protocol=\"simple\"",
                    "applied=\"true\""
                ]
            ),
            5.0
        );
        assert_eq!(
            one(
                DECISIONS,
                &[
                    "collective=\"allgather\"",
                    "algorithm=\"nccl\"",
                    "protocol=\"nccl\"",
                    "applied=\"false\""
                ]
            ),
            2.0
        );
        assert_eq!(
            one(
                DECISIONS,
                &[
                    "collective=\"other\"",
                    "algorithm=\"other\"",
                    "protocol=\"ll\""
                ]
            ),
            1.0
        );
        assert_eq!(
            sample(&text, DECISIONS, &[]).len(),
            3,
            "non-zero buckets only"
        );
        assert_eq!(one(RUNS, &[c, "hook=\"tuner\""]), 1.0, "one sequenced");
        for (st, v) in [
            ("starting", 0.0),
            ("deciding", 0.0),
            ("waiting", 1.0),
            ("stopped", 0.0),
        ] {
            assert_eq!(one(AGREE_STATE, &[c, &format!("state=\"{st}\"")]), v);
        }
        assert_eq!(one(AGREE_EPOCH, &[c]), 5.0);
        assert_eq!(one(AGREE_LAG, &[c]), 2.0);
        let waited = one(AGREE_WAITING, &[c]);
        assert!((2.5..10.0).contains(&waited), "{waited}");
        assert_eq!((one(AGREE_K, &[c]), one(AGREE_D, &[c])), (32.0, 2.0));
        assert!(sample(&text, AGREE_STATE, &["comm=\"0x0000000000000def\""]).is_empty());
        assert_eq!(one(CONTEXTS, &["state=\"live\""]), 2.0);
        assert!(sample(&text, CONTEXTS, &["state=\"unreadable\""]).is_empty());

        // Deciding from epoch 7 at epoch 9: no wait, lag D.
        s.publish_agreement(&AgreementWords {
            state: agreement_state::DECIDING,
            used: 7,
            current: 9,
            waiting_for: sequence::NO_EPOCH,
            waiting_since_ns: 0,
            epoch: 32,
            delay: 2,
        });
        let text = render(&dir, None, &Options::default());
        let get = |name: &str, has: &[&str]| -> f64 {
            sample(&text, name, has)[0]
                .rsplit(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        assert_eq!(get(AGREE_STATE, &[c, "state=\"deciding\""]), 1.0);
        assert_eq!((get(AGREE_EPOCH, &[c]), get(AGREE_LAG, &[c])), (7.0, 2.0));
        assert_eq!(get(AGREE_WAITING, &[c]), 0.0);
        // Finalized: its counts stay, its agreement gauges go.
        drop((s, quiet));
        let text = render(&dir, None, &Options::default());
        assert_eq!(sample(&text, DECISIONS, &[c]).len(), 3, "{text}");
        assert!(sample(&text, AGREE_STATE, &[]).is_empty(), "{text}");
        assert!(sample(&text, AGREE_WAITING, &[]).is_empty(), "{text}");

        // Another process's records, in a map of its own: format 1 (40 words) gives runs and
        // contexts only; an unknown format is counted, not read.
        let dir1 = scratch("decisions-v1");
        let r1 = Registry::new(dir1.clone());
        let m = r1
            .runtime(&MapSpec {
                name: DECISIONS_MAP.into(),
                kind: MapType::Hash,
                key_size: 16,
                value_size: 40 * 8,
                max_entries: 4,
            })
            .unwrap();
        let mut v1 = [0u64; 40];
        (v1[0], v1[1], v1[3], v1[7]) = (1, 2 * 41, 1, DECISIONS_FLAG_POLICY);
        m.update(&k_bytes(7, 0), &v1.map(u64::to_le_bytes).concat(), 0)
            .unwrap();
        v1[0] = 3;
        m.update(&k_bytes(8, 0), &v1.map(u64::to_le_bytes).concat(), 0)
            .unwrap();
        let text = render(&dir1, None, &Options::default());
        promtool(&text);
        let runs = sample(&text, RUNS, &["comm=\"0x0000000000000007\""]);
        assert!(runs.len() == 1 && runs[0].ends_with(" 42"), "{text}");
        assert!(sample(&text, RUNS, &["comm=\"0x0000000000000008\""]).is_empty());
        assert!(sample(&text, DECISIONS, &[]).is_empty());
        assert!(sample(&text, CONTEXTS, &["state=\"unreadable\""])[0].ends_with(" 1"));
        assert!(sample(&text, CONTEXTS, &["state=\"live\""])[0].ends_with(" 1"));
        drop(m);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&dir1);
    }

    #[test]
    fn keys_words_and_sums() {
        assert_eq!(key_text(&7u32.to_le_bytes()), "7");
        assert_eq!(key_text(&[1u64, 2].map(u64::to_le_bytes).concat()), "1,2");
        assert_eq!(key_text(&[1, 2, 3]), "010203");
        let a = [u32::MAX, 1, 5].map(u32::to_le_bytes).concat();
        let b = [2u32, 1, 0].map(u32::to_le_bytes).concat();
        assert_eq!(summed(&[a, b]), Some(vec![1, 2, 5]));
        assert_eq!(summed(&[vec![1, 2, 3]]), None);
    }

    #[test]
    fn launcher_rank_reads_the_environment() {
        // Our own environment: RANK is not set by cargo; a child with RANK=3 is read.
        let mut c = std::process::Command::new("sleep")
            .arg("5")
            .env("RANK", "3")
            .env("SLURM_PROCID", "9")
            .spawn()
            .unwrap();
        // Until the child has exec'd, /proc shows the environment it was forked with.
        let mut r = None;
        for _ in 0..200 {
            r = launcher_rank(c.id());
            if r.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
        assert_eq!(r.as_deref(), Some("3"));
        assert_eq!(launcher_rank(999_999_999), None);
    }
}
