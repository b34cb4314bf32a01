//! `ncclbpf exporter [--listen ADDR]`: serves Prometheus metrics of every ncclbpf process of
//! this user on the node, read from shared memory at each scrape ([`ncclbpf_metrics`]).
//!
//! Each scrape lists the registry again (processes come and go), maps every process's
//! connection table and maps read-only and renders what they hold. No process is asked
//! anything, so metrics keep coming while a process is stuck inside a collective or stopped.

use ncclbpf_metrics::collect::{self, DEFAULT_MAP_ENTRIES, DEFAULT_MAX_CONNECTIONS};
use ncclbpf_metrics::http::{self, Response, Server};
use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// The default address: loopback, port 9464 (the port OpenTelemetry's Prometheus exporter
/// uses; any other with --listen).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// Serve Prometheus metrics of this user's ncclbpf processes on this node.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ncclbpf exporter                          # http://127.0.0.1:9464/metrics
  ncclbpf exporter --listen 0.0.0.0:9464    # reachable from other hosts (see below)
  ncclbpf exporter --once | promtool check metrics

Every scrape reads the registry ($NCCL_BPF_SHM_DIR, default /dev/shm/ncclbpf-<uid>) again, so
processes that start or end are noticed, and reads each process's connection table and maps
from shared memory without asking the process: a rank stopped (SIGSTOP) or stuck inside a
collective is still served, its in-flight requests and seconds waiting with it. Only this
user's processes are read (their registry files and memory are owner-only).

Per connection end: nccl_net_{sent,received}_bytes_total, nccl_net_{send,recv}_ops_total,
nccl_net_inflight_requests, nccl_net_waiting_seconds, nccl_net_last_progress_timestamp_seconds,
nccl_net_errors_total{kind}, policy runs per net hook, nccl_net_op_duration_seconds while the
net_stats policy is loaded; per process nccl_net_connections, tuner policy runs, reloads by
result and every policy map (ncclbpf_map_value{map,key,word}, the first --map-entries non-zero
entries per map).
docs/guide/metrics.md lists every family, its labels, and what 10,000 connections cost.

The listener is loopback unless --listen says otherwise; anyone who can reach it reads the
metrics (peer addresses, communicator ids, map contents), so bind other addresses only on a
trusted network. Stop it with Ctrl-C or SIGTERM.

Exit status:
  0  --once printed the metrics
  2  usage error, or the address cannot be bound")]
pub struct Args {
    /// Address to listen on (host:port; port 0 picks a free one, printed at start).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// Connection ends with their own series per scrape (all processes together); the rest
    /// are counted in ncclbpf_exporter_connections_dropped.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Non-zero entries exported per policy map (the rest counted in
    /// ncclbpf_map_entries_dropped).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAP_ENTRIES)]
    pub map_entries: usize,
    /// Print the metrics once to stdout and exit, without listening.
    #[arg(long)]
    pub once: bool,
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let mut it = addr.to_socket_addrs().map_err(|e| {
        format!("--listen {addr:?}: {e} (expected host:port, e.g. {DEFAULT_LISTEN})")
    })?;
    it.next()
        .ok_or_else(|| format!("--listen {addr:?}: no address"))
}

/// The page at `/`: where the metrics are.
const INDEX: &str = "ncclbpf exporter: metrics at /metrics\n";

pub fn run(a: &Args) -> ExitCode {
    let dir: PathBuf = shared_maps::registry_dir();
    let opts = collect::Options {
        max_connections: a.max_connections,
        map_entries: a.map_entries,
        host: collect::hostname(),
    };
    if a.once {
        let text = collect::render(&dir, None, &opts);
        let mut out = std::io::stdout().lock();
        return match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ncclbpf exporter: cannot write the metrics: {e}");
                ExitCode::from(2)
            }
        };
    }
    let addr = match resolve(&a.listen) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ncclbpf exporter: {e}");
            return ExitCode::from(2);
        }
    };
    let handler_dir = dir.clone();
    let handler: Arc<http::Handler> = Arc::new(move |path: &str| match path {
        "/metrics" => Some(Response {
            status: 200,
            content_type: http::PROMETHEUS_TEXT,
            body: collect::render(&handler_dir, None, &opts),
        }),
        "/" => Some(Response::text(200, INDEX)),
        _ => None,
    });
    let server = match Server::start(addr, "ncclbpf-exporter", handler) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ncclbpf exporter: cannot listen on {addr}: {e}");
            return ExitCode::from(2);
        }
    };
    let bound = server.local_addr();
    if !bound.ip().is_loopback() {
        eprintln!(
            "ncclbpf exporter: warning: listening on {bound}, not loopback: whoever reaches it \
             reads these metrics"
        );
    }
    // The first line says where (tests read it when the port was 0).
    println!(
        "ncclbpf exporter: serving http://{bound}/metrics (registry {})",
        dir.display()
    );
    let _ = std::io::stdout().flush();
    server.wait();
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_resolved_or_refused() {
        assert_eq!(resolve("127.0.0.1:9464").unwrap().port(), 9464);
        assert!(resolve("localhost:0").unwrap().ip().is_loopback());
        let e = resolve("nope").unwrap_err();
        assert!(e.contains("expected host:port"), "{e}");
    }
}
