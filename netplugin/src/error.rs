//! Errors of the net plugin, each mapped to the `ncclResult_t` NCCL expects.

use ncclnet_headers::NcclResult;
use std::fmt;
use std::io;

#[derive(Debug)]
pub enum NetError {
    /// A system call failed (`ncclSystemError`).
    Io { op: &'static str, source: io::Error },
    /// The peer closed the connection or reset it (`ncclRemoteError`).
    PeerClosed { op: &'static str, detail: String },
    /// The peer stopped answering at the TCP level: its host died or the link went down
    /// (keepalive or `TCP_USER_TIMEOUT` from `NCCL_BPF_TIMEOUT`, or no route) (`ncclRemoteError`).
    PeerUnreachable { op: &'static str, detail: String },
    /// An incoming message is larger than the posted receive buffer (`ncclInvalidUsage`).
    Truncated { incoming: u64, posted: usize },
    /// The process at the handle's address did not prove it holds the listener's secret
    /// (`ncclRemoteError`): another process took the port, or the handle is stale.
    Handshake(String),
    /// The connection handle is not one of ours or is corrupt (`ncclInvalidUsage`).
    BadHandle(String),
    /// NCCL called us in a way the ABI does not allow (`ncclInternalError`).
    Misuse(String),
    /// An argument no call may carry: a size over `maxP2pBytes`, NULL data with a non-zero
    /// size (`ncclInvalidArgument`). The comm stays usable.
    InvalidArgument(String),
    /// No usable device or a bad device index (`ncclSystemError` / `ncclInternalError`).
    NoDevice(String),
    /// The comm failed earlier; every later operation reports the first error.
    Broken(String),
    /// A panic was caught at the C ABI (`ncclInternalError`).
    Panic(String),
}

impl NetError {
    pub fn io(op: &'static str, source: io::Error) -> Self {
        use io::ErrorKind::*;
        match source.kind() {
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                NetError::PeerClosed {
                    op,
                    detail: source.to_string(),
                }
            }
            // A dead peer host or link (keepalive, TCP_USER_TIMEOUT) is the peer's failure too.
            TimedOut | HostUnreachable | NetworkUnreachable => NetError::PeerUnreachable {
                op,
                detail: source.to_string(),
            },
            _ => NetError::Io { op, source },
        }
    }

    pub fn code(&self) -> NcclResult {
        match self {
            NetError::Io { .. } | NetError::NoDevice(_) => NcclResult::SYSTEM_ERROR,
            NetError::PeerClosed { .. }
            | NetError::PeerUnreachable { .. }
            | NetError::Broken(_)
            | NetError::Handshake(_) => NcclResult::REMOTE_ERROR,
            NetError::Truncated { .. } | NetError::BadHandle(_) => NcclResult::INVALID_USAGE,
            NetError::Misuse(_) | NetError::Panic(_) => NcclResult::INTERNAL_ERROR,
            NetError::InvalidArgument(_) => NcclResult::INVALID_ARGUMENT,
        }
    }

    /// The same error for a later operation on a comm that already failed.
    pub fn as_broken(&self) -> NetError {
        NetError::Broken(format!("connection failed earlier: {self}"))
    }
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetError::Io { op, source } => write!(f, "{op}: {source}"),
            NetError::PeerClosed { op, detail } => {
                write!(f, "{op}: connection closed by remote peer ({detail})")
            }
            NetError::PeerUnreachable { op, detail } => write!(
                f,
                "{op}: the peer stopped answering: its host is down or the link is lost ({detail}; keepalive and TCP_USER_TIMEOUT come from NCCL_BPF_TIMEOUT)"
            ),
            NetError::Truncated { incoming, posted } => write!(
                f,
                "message truncated: peer sent {incoming} bytes but the receive buffer holds {posted}"
            ),
            NetError::Handshake(m) => write!(f, "admission handshake failed: {m}"),
            NetError::BadHandle(m) => write!(f, "bad connection handle: {m}"),
            NetError::Misuse(m) => write!(f, "invalid call: {m}"),
            NetError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            NetError::NoDevice(m) => write!(f, "{m}"),
            NetError::Broken(m) => write!(f, "{m}"),
            NetError::Panic(m) => write!(f, "internal panic caught at the C ABI: {m}"),
        }
    }
}

impl std::error::Error for NetError {}

pub type NetResult<T> = Result<T, NetError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_peers_are_remote_errors() {
        for errno in [
            libc::ECONNRESET,
            libc::EPIPE,
            libc::ETIMEDOUT,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
        ] {
            let e = NetError::io("recv", io::Error::from_raw_os_error(errno));
            assert_eq!(e.code(), NcclResult::REMOTE_ERROR, "errno {errno}");
        }
        let e = NetError::io("socket", io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(e.code(), NcclResult::SYSTEM_ERROR);
    }
}
