//! The in-process metrics endpoint: with `NCCL_BPF_METRICS_ADDR=host:port` set, a thread of
//! this process serves `GET /metrics`, the same exposition as `ncclbpf exporter`
//! ([`ncclbpf_metrics`]) for this process alone.
//!
//! * The host defaults to loopback: `9464` and `:9464` mean `127.0.0.1:9464`; any other host
//!   must be named (`0.0.0.0:9464`).
//! * Several ranks per node: with a port other than 0 and `LOCAL_RANK` set, each rank listens
//!   on port + `LOCAL_RANK`; with port 0 each gets a free port, written (as `host:port` and a
//!   line feed) to `<registry dir>/<pid>.metrics` (mode 0600) for tools to find.
//! * Started when the first of the net plugin, the tuner and the profiler holds the host
//!   ([`crate::life`]); stopped, its thread joined and its port file removed when the last of
//!   their contexts is finalized (a later `init` starts it again), so nothing of it runs when
//!   NCCL could unload the library (which is also linked `-z nodelete`). Net v7-v10 have no
//!   finalize: with them it runs until the process exits.
//! * A child forked after the endpoint started (a data loader worker) serves nothing and leaves
//!   the parent's endpoint and port file alone; an `init` of its own starts its own endpoint.
//! * An address that cannot be parsed or bound is one warning in NCCL's log and the job goes
//!   on without the endpoint; a panic here is caught and logged, never reaches NCCL.

use ncclbpf_metrics::collect::{self, Options};
use ncclbpf_metrics::http::{self, Response, Server};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The variable.
pub const VAR: &str = "NCCL_BPF_METRICS_ADDR";

#[derive(Default)]
struct State {
    server: Option<Server>,
    /// The process that started it: a forked child (a data loader worker) has no such thread
    /// and must neither join it nor remove the parent's port file.
    owner: u32,
    port_file: Option<PathBuf>,
    /// The value last refused (warned once, not on every init).
    refused: Option<String>,
}

static STATE: Mutex<State> = Mutex::new(State {
    server: None,
    owner: 0,
    port_file: None,
    refused: None,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where to listen, from the variable's value and `LOCAL_RANK`.
pub fn listen_addr(value: &str, local_rank: Option<&str>) -> Result<SocketAddr, String> {
    let v = value.trim();
    let expected = "expected host:port, :port or port (e.g. 127.0.0.1:9464)";
    let mut addr = if let Ok(port) = v.trim_start_matches(':').parse::<u16>() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else {
        v.to_socket_addrs()
            .map_err(|e| format!("{e}; {expected}"))?
            .next()
            .ok_or_else(|| format!("no address; {expected}"))?
    };
    if addr.port() != 0
        && let Some(lr) = local_rank
    {
        let lr: u16 = lr
            .trim()
            .parse()
            .map_err(|_| format!("LOCAL_RANK={lr:?} is not a small number"))?;
        let port = addr
            .port()
            .checked_add(lr)
            .ok_or_else(|| format!("port {} + LOCAL_RANK {lr} is over 65535", addr.port()))?;
        addr.set_port(port);
    }
    Ok(addr)
}

/// At every hold of the host: starts the endpoint if the variable asks for one and it is not
/// running.
pub fn on_init() {
    let Some(value) = std::env::var_os(VAR) else {
        return;
    };
    let r = catch_unwind(AssertUnwindSafe(|| start(&value.to_string_lossy())));
    if r.is_err() {
        crate::hlog!(
            WARN,
            INIT,
            "{VAR}: the metrics endpoint failed to start (a panic, caught)"
        );
    }
}

fn start(value: &str) {
    let mut st = state();
    forget_if_forked(&mut st);
    if st.server.is_some() {
        return;
    }
    let local_rank = std::env::var("LOCAL_RANK").ok();
    let started = listen_addr(value, local_rank.as_deref())
        .and_then(|addr| serve(addr).map_err(|e| format!("cannot listen on {addr}: {e}")));
    match started {
        Ok(server) => {
            let bound = server.local_addr();
            let port_file = write_port_file(bound);
            crate::hlog!(
                INFO,
                INIT,
                "metrics at http://{bound}/metrics ({VAR}={value}{}{})",
                local_rank.map_or(String::new(), |l| format!(", LOCAL_RANK={l}")),
                match &port_file {
                    Ok(p) => format!(", port in {}", p.display()),
                    Err(e) => format!("; port file not written: {e}"),
                }
            );
            if !bound.ip().is_loopback() {
                crate::hlog!(
                    WARN,
                    INIT,
                    "{VAR}: metrics served on {bound}, not loopback: whoever reaches it reads them"
                );
            }
            st.port_file = port_file.ok();
            st.server = Some(server);
            st.owner = std::process::id();
            st.refused = None;
        }
        Err(e) => {
            if st.refused.as_deref() != Some(value) {
                crate::hlog!(WARN, INIT, "{VAR}={value:?}: {e}; no metrics endpoint");
                st.refused = Some(value.to_string());
            }
        }
    }
}

fn serve(addr: SocketAddr) -> std::io::Result<Server> {
    let dir = shared_maps::registry_dir();
    let pid = std::process::id();
    let opts = Options::default();
    let handler: Arc<http::Handler> = Arc::new(move |path: &str| match path {
        "/metrics" => Some(Response {
            status: 200,
            content_type: http::PROMETHEUS_TEXT,
            body: collect::render(&dir, Some(&[pid]), &opts),
        }),
        "/" => Some(Response::text(200, "ncclbpf: metrics at /metrics\n")),
        _ => None,
    });
    Server::start(addr, "ncclbpf-metrics", handler)
}

/// `<registry dir>/<pid>.metrics`: `host:port\n`, mode 0600 (written whole, by rename); files
/// of processes that are gone are removed first.
fn write_port_file(addr: SocketAddr) -> std::io::Result<PathBuf> {
    let dir = shared_maps::registry_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            if let Some(pid) = e
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".metrics"))
                .and_then(|p| p.parse::<u32>().ok())
                && !shared_maps::pid_alive(pid)
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let pid = std::process::id();
    let path = dir.join(format!("{pid}.metrics"));
    let tmp = dir.join(format!(".{pid}.metrics.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    std::io::Write::write_all(&mut f, format!("{addr}\n").as_bytes())?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// In a child forked after the endpoint started: the thread is not there (only the forking
/// thread is copied), so nothing is joined, the child's copy of the listener is closed and the
/// parent's port file kept.
fn forget_if_forked(st: &mut State) {
    if st.owner != std::process::id()
        && let Some(s) = st.server.take()
    {
        s.abandon_after_fork();
        st.port_file = None;
    }
}

/// The last hold of the host was released (by `by`): stops the endpoint, unless a hold came
/// in meanwhile.
pub(crate) fn stop(by: &str) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let (server, file) = {
            let mut st = state();
            forget_if_forked(&mut st);
            // Under the endpoint's lock: a hold that came after the release either sees the
            // server still running (and this keeps it) or starts a new one after this.
            if crate::life::held().iter().any(|&n| n > 0) {
                return;
            }
            (st.server.take(), st.port_file.take())
        };
        if let Some(s) = server {
            // Outside the lock: joining waits for a scrape being served.
            let addr = s.local_addr();
            s.stop();
            if let Some(f) = file {
                let _ = std::fs::remove_file(f);
            }
            crate::hlog!(
                INFO,
                INIT,
                "metrics endpoint {addr} stopped (the {by}'s last context finalized)"
            );
        }
    }));
    if r.is_err() {
        crate::hlog!(
            WARN,
            INIT,
            "{VAR}: stopping the metrics endpoint panicked (caught)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let a = |v, lr| listen_addr(v, lr).map(|a| a.to_string());
        assert_eq!(a("9464", None).unwrap(), "127.0.0.1:9464");
        assert_eq!(a(":9464", Some("3")).unwrap(), "127.0.0.1:9467");
        assert_eq!(a("0.0.0.0:9000", Some("1")).unwrap(), "0.0.0.0:9001");
        assert_eq!(a("[::1]:9000", None).unwrap(), "[::1]:9000");
        assert_eq!(
            a("127.0.0.1:0", Some("5")).unwrap(),
            "127.0.0.1:0",
            "port 0 stays 0"
        );
        assert!(a("localhost:1", None).unwrap().ends_with(":1"));
        let e = a("not an address", None).unwrap_err();
        assert!(e.contains("expected host:port"), "{e}");
        assert!(a("9464", Some("x")).unwrap_err().contains("LOCAL_RANK"));
        assert!(a("65535", Some("1")).unwrap_err().contains("over 65535"));
    }
}
