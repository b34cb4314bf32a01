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
    /// The comm failed earlier; every later operation reports the first error, with its code.
    Broken { msg: String, code: NcclResult },
    /// The OS refused a helper thread (`ncclSystemError`): EAGAIN under a pid or thread limit,
    /// ENOMEM. The message says which thread, of which connection, and what to change.
    Spawn(String),
    /// A helper thread panicked while moving a chunk (`ncclInternalError`); the panic was
    /// caught in that thread, which carries on failing its requests.
    HelperPanic(String),
    /// A panic was caught at the C ABI (`ncclInternalError`).
    Panic(String),
    /// The inner plugin (`NCCL_BPF_NET_INNER`) could not be used (`ncclSystemError`): NCCL
    /// moves on to its next network.
    Backend(String),
    /// The inner plugin's call failed; NCCL gets its code unchanged.
    Inner { op: &'static str, code: NcclResult },
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
            NetError::Inner { code, .. } => *code,
            NetError::Io { .. }
            | NetError::NoDevice(_)
            | NetError::Spawn(_)
            | NetError::Backend(_) => NcclResult::SYSTEM_ERROR,
            NetError::PeerClosed { .. }
            | NetError::PeerUnreachable { .. }
            | NetError::Handshake(_) => NcclResult::REMOTE_ERROR,
            NetError::Broken { code, .. } => *code,
            NetError::Truncated { .. } | NetError::BadHandle(_) => NcclResult::INVALID_USAGE,
            NetError::Misuse(_) | NetError::Panic(_) | NetError::HelperPanic(_) => {
                NcclResult::INTERNAL_ERROR
            }
            NetError::InvalidArgument(_) => NcclResult::INVALID_ARGUMENT,
        }
    }

    /// A copy of this error (message and code) to report.
    pub fn same(&self) -> NetError {
        NetError::Broken {
            msg: self.to_string(),
            code: self.code(),
        }
    }

    /// The same error for a later operation on a comm that already failed: its message and
    /// its code (a local failure such as a refused thread stays `ncclSystemError`, it does not
    /// turn into the peer's fault).
    pub fn as_broken(&self) -> NetError {
        NetError::Broken {
            msg: format!("connection failed earlier: {self}"),
            code: self.code(),
        }
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
            NetError::Broken { msg, .. } => write!(f, "{msg}"),
            NetError::Spawn(m) => write!(f, "{m}"),
            NetError::HelperPanic(m) => write!(f, "{m}"),
            NetError::Panic(m) => write!(f, "internal panic caught at the C ABI: {m}"),
            NetError::Backend(m) => write!(f, "{m}"),
            NetError::Inner { op, code } => {
                write!(f, "the inner plugin's {op} returned {}", code.name())
            }
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

    #[test]
    fn later_calls_keep_the_first_errors_code() {
        let first = NetError::Spawn("cannot start helper thread 2 of 4".into());
        let later = first.as_broken();
        assert_eq!(later.code(), NcclResult::SYSTEM_ERROR);
        assert!(
            later
                .to_string()
                .contains("cannot start helper thread 2 of 4")
        );
        assert_eq!(later.as_broken().code(), NcclResult::SYSTEM_ERROR);
        let peer = NetError::io("recv", io::Error::from_raw_os_error(libc::ECONNRESET));
        assert_eq!(peer.as_broken().code(), NcclResult::REMOTE_ERROR);
        let panic = NetError::HelperPanic("helper thread panicked".into());
        assert_eq!(panic.as_broken().code(), NcclResult::INTERNAL_ERROR);
    }
}
