//! `ncclbpf status PID...|--all [--stall-after SECONDS] [--json | --watch [--interval
//! SECONDS]]`: what runs at each net hook of running processes (asked through their control
//! sockets, [`crate::reload`]) and every connection they have open, read from shared memory
//! (`ncclbpf_conns`, [`shared_maps::conn_table`]): direction, peer, communicator, bytes,
//! requests pending, seconds since the last progress. Connections with requests pending and no progress for
//! longer than `--stall-after` are named, one `STALLED` line each.
//!
//! The connections come from shared memory alone, so they are shown while a process is stuck
//! inside a collective or stopped (SIGSTOP), when its control socket does not answer: each
//! socket gets [`SOCKET_TIMEOUT`] to answer, the tables are read meanwhile.
//!
//! `--watch` keeps the same on screen, refreshed: [`crate::watch`], which reuses the pieces
//! here (`pids_in`, [`Proc`], `stalls`, `stall_line_naming`).
//!
//! Exit status (without `--watch`): 0 when every process was read (socket or shared memory)
//! and no connection stalled; 1 when a stalled connection was named; 2 on a usage error or a
//! process that could be neither asked nor read (2 wins). `--watch`: 0 when quit, 2 on a usage
//! or terminal error.

use crate::reload::{self, Targets};
use ncclbpf_control::{ClientError, Reply};
use serde_json::{Value, json};
use shared_maps::conn_table::{self, ProcessConns};
use shared_maps::{ConnDirection, ConnSnapshot};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// How long a control socket may take to answer `status`: a stopped process never answers,
/// and its connections are shown without its hooks.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(3);

/// Every process read, no connection stalled.
pub const OK: u8 = 0;
/// A stalled connection was named.
pub const STALLED: u8 = 1;
/// Usage error, or a process that could be neither asked nor read.
pub const FAILED: u8 = 2;

/// What runs at each net hook of running processes, and their connections.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ncclbpf status 12345
  ncclbpf status --all --stall-after 30
  ncclbpf status --all --json | jq '.stalled'
  ncclbpf status --all --watch --interval 2

Per process: what runs at each net hook and each communicator's decision count (asked through
the control socket), then every open connection, read from shared memory (so shown also while
the process is stuck inside a collective, or stopped, and its socket does not answer):

  DIR   PEER              LOCAL  COMM                CONN                  BYTES  MSGS  ERRS  PENDING  IDLE_S  WAIT_S

PEER is the other end of the connection's control stream (address:port) and LOCAL this end's
port, so the two ends of a connection show each other's ports (both ends also have the same
CONN id; `(pid N)` names the other end when it is among the processes read). PENDING counts
requests posted and not yet completed, IDLE_S the seconds since the connection last made
progress (a completed request, or a chunk of a message moved), WAIT_S, while requests are
pending, the seconds they have waited with no progress. A connection whose requests have waited
longer than --stall-after gets a line

  STALLED recv connection 0x… from 10.0.0.2:40001 (pid 4243), comm 0x…: 1 request(s) pending, no progress for 12.3 s

A receive that stalls waits for a peer that stopped sending; a send, for a peer that stopped
receiving. Either way, look at the peer next (`ncclbpf status` on its host).

--watch keeps a live view of the same open in the terminal, refreshed every --interval seconds:
per process its rank (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID in its environment,
where set) and whether its control socket answers; per connection its bytes, throughput (bytes/s
between two refreshes), requests pending and seconds since progress; STALLED connections in red,
with their peer (address, pid and rank where known) listed at the bottom. A process that does not
answer is shown as such and does not hold up the view. q, Esc, Ctrl-C, SIGTERM or SIGHUP quits
and restores the terminal; arrows and PgUp/PgDn scroll. --watch needs a terminal (exit 2
otherwise) and does not go with --json.

Exit status:
  0  every process was read and no connection stalled
  1  a stalled connection was named
  2  usage error, or a process that could be neither asked nor read")]
pub struct Args {
    /// Process ids (or --all).
    pub pids: Vec<u32>,
    /// Every live process of this user with a control socket or a connection table.
    #[arg(long)]
    pub all: bool,
    /// Name connections with requests pending and no progress for longer than this.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = seconds)]
    pub stall_after: f64,
    /// Print one JSON document: {stall_after_s, processes: [{pid, verdict, error, items,
    /// metrics, connections, connections_error, conn_table_capacity}], stalled: [...]}.
    #[arg(long)]
    pub json: bool,
    /// Keep a live view open in the terminal, refreshed every --interval seconds (q, Esc or
    /// Ctrl-C quits).
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
    /// Seconds between refreshes of --watch (0.1 to 3600).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = interval, requires = "watch")]
    pub interval: f64,
}

fn interval(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if (0.1..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "{v:?} is not a refresh interval (0.1 to 3600 seconds)"
        )),
    }
}

fn seconds(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(format!("{v:?} is not a number of seconds (0 or more)")),
    }
}

/// `ncclbpf status`: prints to stdout, usage errors to stderr.
pub fn run(a: &Args) -> ExitCode {
    if a.watch && !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        eprintln!(
            "ncclbpf status: --watch needs a terminal, and standard output is not one \
             (`ncclbpf status` prints once, --json for scripts)"
        );
        return ExitCode::from(FAILED);
    }
    let targets = match Targets::new(a.pids.clone(), a.all) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ncclbpf status: {e}");
            return ExitCode::from(FAILED);
        }
    };
    let dir = shared_maps::registry_dir();
    if a.watch {
        return ExitCode::from(crate::watch::run(&dir, targets, a.stall_after, a.interval));
    }
    let mut out = std::io::stdout().lock();
    ExitCode::from(run_in(&dir, &targets, a.stall_after, a.json, &mut out))
}

/// `--all`: live processes with a control socket or a connection table in `dir`.
pub(crate) fn pids_in(dir: &Path, targets: &Targets) -> Result<Vec<u32>, String> {
    match targets {
        Targets::Pids(p) => Ok(p.clone()),
        Targets::All => {
            let mut p = ncclbpf_control::live_processes_in(dir)
                .map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            p.extend(conn_table::processes_with_table_in(dir));
            p.sort_unstable();
            p.dedup();
            if p.is_empty() {
                return Err(format!(
                    "no process with a control socket or a connection table in {}",
                    dir.display()
                ));
            }
            Ok(p)
        }
    }
}

/// What was learnt about one process.
pub(crate) struct Proc {
    pub pid: u32,
    pub answer: Result<Reply, ClientError>,
    /// `Ok(None)`: it registered no connection table.
    pub table: Result<Option<ProcessConns>, String>,
    /// Its in-process metrics endpoint (`NCCL_BPF_METRICS_ADDR`), from `<dir>/<pid>.metrics`.
    pub metrics: Option<String>,
}

impl Proc {
    /// Neither its socket answered nor its table could be read.
    pub(crate) fn unread(&self) -> bool {
        self.answer.is_err() && !matches!(self.table, Ok(Some(_)))
    }
}

/// One connection with requests pending and no progress for longer than the threshold.
pub(crate) struct Stall<'a> {
    pub pid: u32,
    pub conn: &'a ConnSnapshot,
    pub waiting_ns: u64,
    pub since_progress_ns: u64,
    pub peer_pid: Option<u32>,
}

/// [`run`] with the registry dir and the output given (tests).
pub fn run_in(
    dir: &Path,
    targets: &Targets,
    stall_after_s: f64,
    json: bool,
    out: &mut dyn Write,
) -> u8 {
    let pids = match pids_in(dir, targets) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ncclbpf status: {e}");
            return FAILED;
        }
    };
    // The sockets are asked while the tables are read: a process that does not answer costs
    // SOCKET_TIMEOUT once, whatever the number of processes.
    let (answers, tables) = std::thread::scope(|s| {
        let asking = s.spawn(|| reload::status_answers(dir, &pids, SOCKET_TIMEOUT));
        let tables: Vec<_> = pids
            .iter()
            .map(|&p| conn_table::read_process_in(dir, p))
            .collect();
        let answers = asking.join().unwrap_or_else(|_| {
            pids.iter()
                .map(|&p| (p, Err(ClientError::Protocol("the request panicked".into()))))
                .collect()
        });
        (answers, tables)
    });
    let procs: Vec<Proc> = answers
        .into_iter()
        .zip(tables)
        .map(|((pid, answer), table)| Proc {
            pid,
            answer: answer.map_err(silent),
            table,
            metrics: metrics_addr(dir, pid),
        })
        .collect();
    let text = report(&procs, stall_after_s, json);
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    if procs.iter().any(Proc::unread) {
        FAILED
    } else if has_stalls(&procs, stall_after_s) {
        STALLED
    } else {
        OK
    }
}

/// The address a process's metrics endpoint wrote (`host:port`), if it runs one.
pub(crate) fn metrics_addr(dir: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(format!("{pid}.metrics"))).ok()?;
    let addr: std::net::SocketAddr = text.trim().parse().ok()?;
    Some(addr.to_string())
}

/// A socket that did not answer in time says so (rather than "resource temporarily
/// unavailable").
pub(crate) fn silent(e: ClientError) -> ClientError {
    match e {
        ClientError::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            ClientError::Protocol(format!(
                "no answer within {} s (the process is stopped, or its control thread is busy)",
                SOCKET_TIMEOUT.as_secs()
            ))
        }
        e => e,
    }
}

pub(crate) fn after_ns(stall_after_s: f64) -> u64 {
    (stall_after_s * 1e9).min(u64::MAX as f64) as u64
}

fn has_stalls(procs: &[Proc], stall_after_s: f64) -> bool {
    !stalls(procs, &ends(procs), after_ns(stall_after_s)).is_empty()
}

/// Where each connection id was seen: (pid, direction), for naming the other end.
pub(crate) type Ends = HashMap<u64, Vec<(u32, ConnDirection)>>;

pub(crate) fn ends(procs: &[Proc]) -> Ends {
    let mut m: Ends = HashMap::new();
    for p in procs {
        if let Ok(Some(t)) = &p.table {
            for c in &t.conns {
                m.entry(c.conn_id).or_default().push((p.pid, c.direction));
            }
        }
    }
    m
}

/// The process holding the other end of `c` (same id, the other direction), if read.
pub(crate) fn peer_pid(ends: &Ends, c: &ConnSnapshot) -> Option<u32> {
    ends.get(&c.conn_id)?
        .iter()
        .find(|(_, d)| *d != c.direction)
        .map(|(p, _)| *p)
}

pub(crate) fn stalls<'a>(procs: &'a [Proc], ends: &Ends, after: u64) -> Vec<Stall<'a>> {
    let mut out = vec![];
    for p in procs {
        let Ok(Some(t)) = &p.table else { continue };
        for c in &t.conns {
            if c.stalled(t.now_ns, after) {
                out.push(Stall {
                    pid: p.pid,
                    conn: c,
                    waiting_ns: c.waiting_ns(t.now_ns).unwrap_or(0),
                    since_progress_ns: c.since_progress_ns(t.now_ns),
                    peer_pid: peer_pid(ends, c),
                });
            }
        }
    }
    out
}

pub(crate) fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Seconds with three decimals, for JSON.
fn jsecs(ns: u64) -> Value {
    json!((secs(ns) * 1000.0).round() / 1000.0)
}

pub(crate) fn hex(v: u64) -> String {
    format!("{v:#018x}")
}

fn report(procs: &[Proc], stall_after_s: f64, json: bool) -> String {
    let ends = ends(procs);
    let after = after_ns(stall_after_s);
    let stalled = stalls(procs, &ends, after);
    if json {
        let mut s = json_doc(procs, &ends, &stalled, stall_after_s, after).to_string();
        s.push('\n');
        return s;
    }
    let mut s = String::new();
    for p in procs {
        s.push_str(&reload::status_text(p.pid, &p.answer));
        if let Some(a) = &p.metrics {
            let _ = writeln!(s, "  metrics: http://{a}/metrics");
        }
        conns_text(&mut s, p, &ends, after);
    }
    let n = stalled.len();
    let rule = format!("requests pending and no progress for over {stall_after_s} s");
    let _ = if n == 0 {
        writeln!(s, "no stalled connection ({rule})")
    } else {
        let procs: std::collections::BTreeSet<u32> = stalled.iter().map(|x| x.pid).collect();
        writeln!(
            s,
            "{n} stalled connection(s) in {} process(es): {rule}",
            procs.len()
        )
    };
    s
}

fn stall_line(x: &Stall) -> String {
    stall_line_naming(
        x,
        x.peer_pid.map_or(String::new(), |p| format!(" (pid {p})")),
    )
}

/// [`stall_line`] with the peer named by `peer` (` (pid N)`, ` (pid N, rank R)`, or empty).
pub(crate) fn stall_line_naming(x: &Stall, peer: String) -> String {
    let c = x.conn;
    let (what, toward) = match c.direction {
        ConnDirection::Send => ("send", "to"),
        ConnDirection::Recv => ("recv", "from"),
    };
    format!(
        "STALLED {what} connection {} {toward} {}{peer}, comm {}: {} request(s) pending, no progress for {:.1} s",
        hex(c.conn_id),
        c.peer_text(),
        hex(c.comm_id),
        c.inflight,
        secs(x.waiting_ns)
    )
}

fn conns_text(s: &mut String, p: &Proc, ends: &Ends, after: u64) {
    let t = match &p.table {
        Ok(Some(t)) => t,
        Ok(None) => {
            let _ = writeln!(
                s,
                "  connections: none registered (no connection opened yet, or no net plugin)"
            );
            return;
        }
        Err(e) => {
            let _ = writeln!(s, "  connections: unreadable: {e}");
            return;
        }
    };
    let _ = writeln!(
        s,
        "  {} connection(s) (table of {}, read from shared memory):",
        t.conns.len(),
        t.capacity
    );
    if t.conns.is_empty() {
        return;
    }
    let mut conns: Vec<&ConnSnapshot> = t.conns.iter().collect();
    conns.sort_by_key(|c| (c.comm_id, c.direction.name(), c.peer_port, c.conn_id));
    let head = [
        "DIR", "PEER", "LOCAL", "COMM", "CONN", "BYTES", "MSGS", "ERRS", "PENDING", "IDLE_S",
        "WAIT_S",
    ];
    let mut rows: Vec<[String; 11]> = vec![head.map(String::from)];
    let mut lines = vec![];
    for c in conns {
        let mut peer = c.peer_text();
        if let Some(pp) = peer_pid(ends, c) {
            peer.push_str(&format!(" (pid {pp})"));
        }
        rows.push([
            c.direction.name().into(),
            peer,
            c.local_port.to_string(),
            hex(c.comm_id),
            hex(c.conn_id),
            c.bytes.to_string(),
            c.messages.to_string(),
            c.errors.to_string(),
            c.inflight.to_string(),
            format!("{:.1}", secs(c.since_progress_ns(t.now_ns))),
            c.waiting_ns(t.now_ns)
                .map_or("-".into(), |w| format!("{:.1}", secs(w))),
        ]);
        if c.stalled(t.now_ns, after) {
            lines.push((
                rows.len() - 1,
                stall_line(&Stall {
                    pid: p.pid,
                    conn: c,
                    waiting_ns: c.waiting_ns(t.now_ns).unwrap_or(0),
                    since_progress_ns: c.since_progress_ns(t.now_ns),
                    peer_pid: peer_pid(ends, c),
                }),
            ));
        }
    }
    // Text columns left-aligned, numbers right-aligned, each as wide as its widest cell.
    let width: Vec<usize> = (0..head.len())
        .map(|k| rows.iter().map(|r| r[k].chars().count()).max().unwrap_or(0))
        .collect();
    for (n, r) in rows.iter().enumerate() {
        let mut l = String::from("   ");
        for (k, cell) in r.iter().enumerate() {
            let w = width[k];
            let _ = if matches!(k, 0 | 1 | 3 | 4) {
                write!(l, " {cell:<w$}")
            } else {
                write!(l, " {cell:>w$}")
            };
            if k + 1 < r.len() {
                l.push(' ');
            }
        }
        if lines.iter().any(|(row, _)| *row == n) {
            l.push_str("  STALLED");
        }
        let _ = writeln!(s, "{}", l.trim_end());
    }
    for (_, l) in lines {
        let _ = writeln!(s, "  {l}");
    }
}

fn conn_json(c: &ConnSnapshot, t: &ProcessConns, ends: &Ends, after: u64) -> Value {
    json!({
        "slot": c.slot,
        "direction": c.direction.name(),
        "conn_id": hex(c.conn_id),
        "comm_id": hex(c.comm_id),
        "dev": c.dev,
        "peer": c.peer_addr().map(|a| a.to_string()),
        "peer_addr": c.peer_ip.map(|a| a.to_string()),
        "peer_port": c.peer_port,
        "peer_pid": peer_pid(ends, c),
        "local_port": c.local_port,
        "bytes": c.bytes,
        "messages": c.messages,
        "errors": c.errors,
        "pending": c.inflight,
        "age_s": jsecs(t.now_ns.saturating_sub(c.opened_ns)),
        "since_progress_s": jsecs(c.since_progress_ns(t.now_ns)),
        "last_progress_unix_s": jsecs(t.clock.wall_ns(c.last_progress_ns)),
        "waiting_s": c.waiting_ns(t.now_ns).map(jsecs),
        "stalled": c.stalled(t.now_ns, after),
    })
}

fn json_doc(
    procs: &[Proc],
    ends: &Ends,
    stalled: &[Stall],
    stall_after_s: f64,
    after: u64,
) -> Value {
    let processes: Vec<Value> = procs
        .iter()
        .map(|p| {
            let mut v: Value = serde_json::from_str(&reload::status_json(p.pid, &p.answer))
                .unwrap_or_else(|e| json!({ "pid": p.pid, "verdict": "error", "error": e.to_string(), "items": [] }));
            let (conns, error, capacity) = match &p.table {
                Ok(Some(t)) => (
                    Value::Array(
                        t.conns
                            .iter()
                            .map(|c| conn_json(c, t, ends, after))
                            .collect(),
                    ),
                    Value::Null,
                    json!(t.capacity),
                ),
                Ok(None) => (json!([]), Value::Null, Value::Null),
                Err(e) => (Value::Null, json!(e), Value::Null),
            };
            v["metrics"] = p.metrics.as_ref().map_or(Value::Null, |a| json!(a));
            v["connections"] = conns;
            v["connections_error"] = error;
            v["conn_table_capacity"] = capacity;
            v
        })
        .collect();
    let stalled: Vec<Value> = stalled
        .iter()
        .map(|x| {
            let c = x.conn;
            json!({
                "pid": x.pid,
                "direction": c.direction.name(),
                "conn_id": hex(c.conn_id),
                "comm_id": hex(c.comm_id),
                "peer": c.peer_addr().map(|a| a.to_string()),
                "peer_addr": c.peer_ip.map(|a| a.to_string()),
                "peer_port": c.peer_port,
                "peer_pid": x.peer_pid,
                "local_port": c.local_port,
                "pending": c.inflight,
                "waiting_s": jsecs(x.waiting_ns),
                "since_progress_s": jsecs(x.since_progress_ns),
                "line": stall_line(x),
            })
        })
        .collect();
    json!({
        "stall_after_s": stall_after_s,
        "processes": processes,
        "stalled": stalled,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use shared_maps::conn_table::TableClock;

    pub(crate) const S: u64 = 1_000_000_000;

    pub(crate) fn conn(
        id: u64,
        dir: ConnDirection,
        inflight: u64,
        busy: u64,
        progress: u64,
    ) -> ConnSnapshot {
        ConnSnapshot {
            slot: id as usize,
            direction: dir,
            conn_id: id,
            comm_id: 0xa9ee,
            dev: 0,
            peer_ip: Some("127.0.0.1".parse().unwrap()),
            peer_port: 40000 + id as u16,
            local_port: 50000 + id as u16,
            opened_ns: 0,
            bytes: 4096 * id,
            messages: id,
            errors: 0,
            inflight,
            busy_since_ns: busy,
            last_progress_ns: progress,
            post_runs: 0,
            complete_runs: 0,
        }
    }

    pub(crate) fn table(
        conns: Vec<ConnSnapshot>,
        now: u64,
    ) -> Result<Option<ProcessConns>, String> {
        Ok(Some(ProcessConns {
            capacity: 4096,
            clock: TableClock {
                mono_ref_ns: 0,
                real_ref_ns: 1_700_000_000 * S,
            },
            now_ns: now,
            conns,
        }))
    }

    pub(crate) fn stopped() -> Result<Reply, ClientError> {
        Err(ClientError::Io(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "timed out",
        )))
    }

    /// A receiver stuck for 30 s on conn 1, still moving on conn 2, and (another process) the
    /// sender of conn 1, idle, and of conn 2.
    fn job() -> Vec<Proc> {
        let now = 100 * S;
        vec![
            Proc {
                pid: 10,
                answer: stopped(),
                table: table(
                    vec![
                        conn(1, ConnDirection::Recv, 1, 70 * S, 60 * S),
                        conn(2, ConnDirection::Recv, 1, now - S / 10, now - S / 5),
                    ],
                    now,
                ),
                metrics: Some("127.0.0.1:9464".into()),
            },
            Proc {
                pid: 11,
                answer: stopped(),
                table: table(
                    vec![
                        conn(1, ConnDirection::Send, 0, 50 * S, 60 * S),
                        conn(2, ConnDirection::Send, 1, now - S, now - S / 5),
                    ],
                    now,
                ),
                metrics: None,
            },
        ]
    }

    #[test]
    fn names_the_stalled_connection_and_its_peer() {
        let procs = job();
        let text = report(&procs, 10.0, false);
        let stalled: Vec<&str> = text.lines().filter(|l| l.contains("STALLED ")).collect();
        assert_eq!(stalled.len(), 1, "{text}");
        assert_eq!(
            stalled[0].trim(),
            "STALLED recv connection 0x0000000000000001 from 127.0.0.1:40001 (pid 11), comm \
             0x000000000000a9ee: 1 request(s) pending, no progress for 30.0 s",
            "{text}"
        );
        assert!(text.contains("pid 10: not asked: timed out"), "{text}");
        assert!(
            text.contains("\n  metrics: http://127.0.0.1:9464/metrics\n"),
            "{text}"
        );
        assert_eq!(text.matches("metrics: http").count(), 1, "{text}");
        assert!(text.contains("2 connection(s) (table of 4096"), "{text}");
        assert!(
            text.ends_with("1 stalled connection(s) in 1 process(es): requests pending and no progress for over 10 s\n"),
            "{text}"
        );
        assert!(has_stalls(&procs, 10.0));
        assert!(!has_stalls(&procs, 31.0), "30 s is not over 31");
        let quiet = report(&procs, 31.0, false);
        assert!(!quiet.contains("STALLED"), "{quiet}");
        assert!(quiet.contains("no stalled connection"), "{quiet}");
    }

    #[test]
    fn the_table_is_aligned() {
        let text = report(&job(), 10.0, false);
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("    ")).collect();
        assert_eq!(rows.len(), 6, "a header and two rows per process:\n{text}");
        let header = "    DIR   PEER                      LOCAL  COMM                CONN                BYTES  MSGS  ERRS  PENDING  IDLE_S  WAIT_S";
        let stalled = "    recv  127.0.0.1:40001 (pid 11)  50001  0x000000000000a9ee  0x0000000000000001   4096     1     0        1    40.0    30.0  STALLED";
        assert_eq!(rows[0], header, "{text}");
        assert_eq!(rows[1], stalled, "{text}");
        let end = rows[0].len();
        assert!(rows[2].len() == end && rows[1].len() > end, "{text}");
    }

    #[test]
    fn json_carries_the_same() {
        let procs = job();
        let v: Value = serde_json::from_str(&report(&procs, 10.0, true)).unwrap();
        assert_eq!(v["stall_after_s"], json!(10.0));
        let st = v["stalled"].as_array().unwrap();
        assert_eq!(st.len(), 1);
        assert_eq!(st[0]["pid"], json!(10));
        assert_eq!(st[0]["peer_port"], json!(40001));
        assert_eq!(st[0]["peer"], json!("127.0.0.1:40001"));
        assert_eq!(st[0]["peer_pid"], json!(11));
        assert_eq!(st[0]["waiting_s"], json!(30.0));
        assert_eq!(st[0]["since_progress_s"], json!(40.0));
        let p = &v["processes"][0];
        assert_eq!(p["verdict"], json!("not_asked"));
        assert_eq!(p["metrics"], json!("127.0.0.1:9464"));
        assert_eq!(v["processes"][1]["metrics"], Value::Null);
        let c = p["connections"].as_array().unwrap();
        assert_eq!(c.len(), 2);
        let moving = c.iter().find(|c| c["conn_id"] == json!(hex(2))).unwrap();
        assert_eq!(moving["stalled"], json!(false));
        assert_eq!(moving["waiting_s"], json!(0.1));
        let idle = &v["processes"][1]["connections"][0];
        assert_eq!(idle["pending"], json!(0));
        assert_eq!(idle["waiting_s"], Value::Null, "nothing pending");
        assert_eq!(idle["last_progress_unix_s"], json!(1_700_000_060.0));
    }

    #[test]
    fn unreadable_processes_and_missing_tables() {
        let procs = vec![
            Proc {
                pid: 7,
                answer: stopped(),
                table: Err("no maps registered (process 7 is gone)".into()),
                metrics: None,
            },
            Proc {
                pid: 8,
                answer: stopped(),
                table: Ok(None),
                metrics: None,
            },
        ];
        assert!(procs.iter().all(Proc::unread));
        let text = report(&procs, 10.0, false);
        assert!(
            text.contains("  connections: unreadable: no maps registered"),
            "{text}"
        );
        assert!(text.contains("  connections: none registered"), "{text}");
        let v: Value = serde_json::from_str(&report(&procs, 10.0, true)).unwrap();
        assert_eq!(v["processes"][0]["connections"], Value::Null);
        assert!(v["processes"][0]["connections_error"].is_string());
        assert_eq!(v["processes"][1]["connections"], json!([]));
    }

    #[test]
    fn a_socket_that_does_not_answer_says_so() {
        let e = silent(ClientError::Io(std::io::Error::from(
            std::io::ErrorKind::WouldBlock,
        )));
        assert_eq!(
            e.to_string(),
            "no answer within 3 s (the process is stopped, or its control thread is busy)"
        );
        assert!(matches!(
            silent(ClientError::NoProcess(3)),
            ClientError::NoProcess(3)
        ));
    }

    #[test]
    fn seconds_are_checked() {
        assert_eq!(seconds("1.5"), Ok(1.5));
        assert!(seconds("-1").is_err() && seconds("nan").is_err() && seconds("x").is_err());
        assert_eq!(interval("0.5"), Ok(0.5));
        assert_eq!(interval("3600"), Ok(3600.0));
        for bad in ["0", "0.05", "3601", "-1", "nan", "inf", "x"] {
            assert!(interval(bad).is_err(), "{bad}");
        }
    }
}
