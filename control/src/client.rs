//! The client side: which processes have a control socket, and asking one of them.

use crate::protocol::{Reply, Request};
use crate::socket_path_in;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a process could not be asked (as opposed to a reply that says `error:`).
#[derive(Debug)]
pub enum ClientError {
    /// No such process (its stale socket, if any, was removed).
    NoProcess(u32),
    /// The process lives but has no control socket here.
    NoSocket {
        pid: u32,
        path: PathBuf,
    },
    Connect {
        path: PathBuf,
        source: io::Error,
    },
    /// The server turned us away (`refused: …`).
    Refused(String),
    /// Sending, or reading the reply.
    Io(io::Error),
    /// A request that cannot be sent, or a reply that cannot be read.
    Protocol(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NoProcess(pid) => write!(f, "process {pid} does not exist"),
            ClientError::NoSocket { pid, path } => write!(
                f,
                "process {pid} has no control socket ({} does not exist: not an ncclbpf process, \
                 one where NCCL has not initialised our net plugin, tuner or profiler yet, one started with \
                 NCCL_BPF_CONTROL=0, or one with another NCCL_BPF_SHM_DIR or user)",
                path.display()
            ),
            ClientError::Connect { path, source } => {
                write!(f, "cannot connect to {}: {source}", path.display())
            }
            ClientError::Refused(l) => write!(f, "{l}"),
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Protocol(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Processes with a control socket in `dir`, by pid, ascending. Sockets of processes that are
/// gone are removed on the way.
pub fn live_processes_in(dir: &Path) -> io::Result<Vec<u32>> {
    let mut out = vec![];
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".ctl"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if shared_maps::pid_alive(pid) {
            out.push(pid);
        } else {
            let _ = std::fs::remove_file(e.path());
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// [`live_processes_in`] this user's registry dir.
pub fn live_processes() -> io::Result<Vec<u32>> {
    live_processes_in(&shared_maps::registry_dir())
}

/// Sends `req` to process `pid` (socket in `dir`) and reads its reply; `timeout` bounds each
/// read and write (a reload verifies and compiles before it answers).
pub fn request_in(
    dir: &Path,
    pid: u32,
    req: &Request,
    timeout: Duration,
) -> Result<Reply, ClientError> {
    let path = socket_path_in(dir, pid);
    if !shared_maps::pid_alive(pid) {
        let _ = std::fs::remove_file(&path);
        return Err(ClientError::NoProcess(pid));
    }
    if std::fs::symlink_metadata(&path).is_err() {
        return Err(ClientError::NoSocket { pid, path });
    }
    request_at(&path, req, timeout)
}

/// [`request_in`] this user's registry dir.
pub fn request(pid: u32, req: &Request, timeout: Duration) -> Result<Reply, ClientError> {
    request_in(&shared_maps::registry_dir(), pid, req, timeout)
}

/// Sends `req` to the socket at `path`.
pub fn request_at(path: &Path, req: &Request, timeout: Duration) -> Result<Reply, ClientError> {
    let line = req.to_line().map_err(ClientError::Protocol)?;
    let s = UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(timeout)).map_err(ClientError::Io)?;
    s.set_write_timeout(Some(timeout))
        .map_err(ClientError::Io)?;
    // A server that refuses us may close before reading: then the refusal is still there to
    // read, and says more than the failed write.
    let sent = (&s).write_all(&line);
    let _ = s.shutdown(Shutdown::Write);
    let mut lines = vec![];
    for l in BufReader::new(&s).lines() {
        let l = match (l, &sent) {
            (Ok(l), _) => l,
            (Err(_), Err(w)) => {
                return Err(ClientError::Io(io::Error::new(w.kind(), w.to_string())));
            }
            (Err(e), Ok(())) => return Err(ClientError::Io(e)),
        };
        if lines.is_empty() && l.starts_with("refused:") {
            return Err(ClientError::Refused(l));
        }
        let last = l == "ok" || l.starts_with("error: ");
        lines.push(l);
        if last {
            break;
        }
    }
    if let Err(w) = sent
        && lines.is_empty()
    {
        return Err(ClientError::Io(w));
    }
    Reply::parse(&lines).map_err(ClientError::Protocol)
}
