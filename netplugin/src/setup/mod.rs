//! Connection setup: `listen`, `connect` and `accept`, none of which ever blocks.
//!
//! `connect` opens `nstreams + 1` non-blocking TCP connections to the listener (data streams,
//! then the control stream); on each, the two ends run the admission handshake of
//! [`crate::handshake`]. `accept` collects incoming streams, admits those that prove they hold
//! the listener's secret, turns every other away, and returns a comm once all streams of one
//! connection are in. The connecting side lives in [`connect`], the listening side in
//! [`accept`].

pub(crate) mod accept;
mod connect;

pub use accept::{ListenComm, listen, listen_with};
pub use connect::{CONNECT_TIMEOUT, connect, pending_connects};

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The device and communicator a connection serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub dev: u32,
    /// The communicator's hash (net v11+), 0 when NCCL gives none.
    pub comm_id: u64,
    /// A side channel beside an inner plugin's connection (`inner::side`): no connection
    /// record, no hooks (the wrapped connection has those); it carries control frames only.
    pub quiet: bool,
}

/// A random 64-bit number (listener and connection ids, connect keys). Not a secret: ids only
/// need to be distinct (secrets come from [`crate::handshake::Secret::random`]).
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    let mut v = u64::from_le_bytes(b);
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        v = (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32);
    }
    // Mixing in a counter keeps values distinct even if the random source repeats.
    (v ^ COUNTER
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15))
    .max(1)
}

fn stream_socket(addr: &SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    dead_peer_timeout(&socket2::SockRef::from(&s));
    congestion_control(&socket2::SockRef::from(&s));
    Ok(s)
}

/// `NCCL_BPF_TCP_CONGESTION` on a stream (both ends: the connecting side here, the accepting
/// side in `accept.rs`). A name the kernel refuses (not built, or not in
/// `net.ipv4.tcp_allowed_congestion_control` for an unprivileged process) is reported once and
/// the stream keeps the system's.
fn congestion_control(s: &socket2::SockRef<'_>) {
    let Some(name) = crate::plugin::get()
        .ok()
        .and_then(|p| p.config.tcp_congestion.clone())
    else {
        return;
    };
    if let Err(e) = set_congestion(s, &name) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            crate::nlog!(
                WARN,
                NET,
                "NCCL_BPF_TCP_CONGESTION={name}: {e} (not built into this kernel, or not in net.ipv4.tcp_allowed_congestion_control); streams keep the system's congestion control"
            )
        });
    }
}

fn set_congestion(s: &socket2::SockRef<'_>, name: &str) -> io::Result<()> {
    s.set_tcp_congestion(name.as_bytes())
}

/// Keepalive and `TCP_USER_TIMEOUT` from `NCCL_BPF_TIMEOUT`, so that a peer host that died or
/// a link that went down fails the stream (and its requests) instead of leaving it pending.
fn dead_peer_timeout(s: &socket2::SockRef<'_>) {
    let secs = crate::plugin::get().map_or(120, |p| p.config.timeout_s);
    if secs == 0 {
        return;
    }
    let total = Duration::from_secs(u64::from(secs));
    // Probes start after a quarter of the timeout, then every eighth: about 3/4 in all.
    let ka = socket2::TcpKeepalive::new()
        .with_time((total / 4).max(Duration::from_secs(1)))
        .with_interval((total / 8).max(Duration::from_secs(1)))
        .with_retries(4);
    if let Err(e) = s
        .set_tcp_keepalive(&ka)
        .and_then(|()| s.set_tcp_user_timeout(Some(total)))
    {
        crate::nlog!(
            WARN,
            NET,
            "NCCL_BPF_TIMEOUT: cannot set keepalive/TCP_USER_TIMEOUT: {e}"
        );
    }
}

/// `NCCL_BPF_HANDSHAKE_TIMEOUT`, as a duration.
fn handshake_timeout() -> Duration {
    let secs = crate::plugin::get().map_or(10, |p| p.config.handshake_timeout_s);
    Duration::from_secs(u64::from(secs.max(1)))
}

#[cfg(test)]
mod congestion_tests {
    use super::set_congestion;
    use socket2::{Domain, Protocol, SockRef, Socket, Type};

    #[test]
    fn a_stream_takes_the_named_congestion_control_or_says_why_not() {
        let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        // reno is always built in.
        set_congestion(&SockRef::from(&s), "reno").unwrap();
        assert_eq!(
            s.tcp_congestion()
                .unwrap()
                .split(|&b| b == 0)
                .next()
                .unwrap(),
            b"reno"
        );
        let e = set_congestion(&SockRef::from(&s), "nosuchcc").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        assert_eq!(
            s.tcp_congestion()
                .unwrap()
                .split(|&b| b == 0)
                .next()
                .unwrap(),
            b"reno",
            "unchanged"
        );
    }
}
#[cfg(test)]
mod flood_tests;
