//! Connection setup: `listen`, `connect` and `accept`, none of which ever blocks.
//!
//! `connect` opens `nstreams + 1` non-blocking TCP connections to the listener (data streams,
//! then the control stream) and sends a [`Hello`] on each. Its progress lives in a table keyed
//! by a number it writes into the handle, since NCCL passes the same handle buffer on every
//! retry; a garbage handle simply fails to decode. `accept` collects incoming streams, reads
//! their hellos, drops strangers and returns a comm once all streams of one connection are in.

use crate::comm::Comm;
use crate::error::{NetError, NetResult};
use crate::wire::{HANDLE_SIZE, HELLO_SIZE, Handle, Hello, Shape};
use shared_maps::ConnDirection;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// A connect that has not completed within this time fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// An accepted stream that has not sent its hello within this time is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Streams waiting for their hello, per listener; beyond this the oldest is dropped, so a
/// flood of silent connections cannot hold every descriptor.
const MAX_PENDING: usize = 256;
/// A connection whose streams have not all arrived within this time is dropped.
const GROUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A random 64-bit number (nonces, connection ids, connect keys).
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
    Ok(s)
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

// ---------------------------------------------------------------- listen / accept

struct Incoming {
    stream: TcpStream,
    hello: [u8; HELLO_SIZE],
    got: usize,
    since: Instant,
}

struct Group {
    streams: Vec<Option<TcpStream>>,
    count: usize,
    since: Instant,
}

/// The device and communicator a connection serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub dev: u32,
    /// The communicator's hash (net v11+), 0 when NCCL gives none.
    pub comm_id: u64,
}

pub struct ListenComm {
    endpoint: Endpoint,
    listener: TcpListener,
    nonce: u64,
    shape: Shape,
    incoming: Vec<Incoming>,
    groups: HashMap<u64, Group>,
}

/// Opens a listener on `bind` and fills the 128-byte handle for the peer.
pub fn listen(
    endpoint: Endpoint,
    bind: SocketAddr,
    shape: Shape,
    handle: &mut [u8; HANDLE_SIZE],
) -> NetResult<Box<ListenComm>> {
    let sock = stream_socket(&bind).map_err(|e| NetError::io("socket", e))?;
    sock.bind(&SockAddr::from(bind))
        .map_err(|e| NetError::io("bind", e))?;
    sock.listen(16384).map_err(|e| NetError::io("listen", e))?;
    let listener: TcpListener = sock.into();
    let addr = listener
        .local_addr()
        .map_err(|e| NetError::io("getsockname", e))?;
    let nonce = random_u64();
    Handle { nonce, addr, shape }.encode(handle);
    Ok(Box::new(ListenComm {
        endpoint,
        listener,
        nonce,
        shape,
        incoming: Vec::new(),
        groups: HashMap::new(),
    }))
}

/// Errors of `accept` that pass: no descriptor, buffer or memory right now.
fn transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
    )
}

/// One log line per second at most for transient accept errors.
fn log_transient(e: &io::Error) {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        *last = Some(Instant::now());
        crate::nlog!(
            WARN,
            NET,
            "accept: {e} (transient: the connection waits in the backlog and is taken later)"
        );
    }
}

impl ListenComm {
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Makes progress; returns a comm once every stream of one connection has arrived.
    pub fn accept(&mut self) -> NetResult<Option<Box<Comm>>> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    stream
                        .set_nonblocking(true)
                        .map_err(|e| NetError::io("set_nonblocking", e))?;
                    let _ = stream.set_nodelay(true);
                    dead_peer_timeout(&socket2::SockRef::from(&stream));
                    self.incoming.push(Incoming {
                        stream,
                        hello: [0; HELLO_SIZE],
                        got: 0,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted) => {}
                Err(e) if transient_accept_error(&e) => {
                    // Out of descriptors or buffers for now: the connection stays in the
                    // kernel's backlog and is taken on a later call.
                    log_transient(&e);
                    break;
                }
                Err(e) => return Err(NetError::io("accept", e)),
            }
        }
        if self.incoming.len() > MAX_PENDING {
            // Oldest first: a real peer sends its hello at once.
            self.incoming.sort_by_key(|i| std::cmp::Reverse(i.since));
            self.incoming.truncate(MAX_PENDING);
        }
        self.groups.retain(|_, g| g.since.elapsed() < GROUP_TIMEOUT);
        let mut i = 0;
        while i < self.incoming.len() {
            let inc = &mut self.incoming[i];
            let keep = match inc.stream.read(&mut inc.hello[inc.got..]) {
                Ok(0) => false,
                Ok(n) => {
                    inc.got += n;
                    true
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    inc.since.elapsed() < HELLO_TIMEOUT
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
                Err(_) => false,
            };
            if !keep {
                self.incoming.swap_remove(i);
                continue;
            }
            if inc.got < HELLO_SIZE {
                i += 1;
                continue;
            }
            let inc = self.incoming.swap_remove(i);
            match Hello::decode(&inc.hello) {
                Some(h) if h.nonce == self.nonce && h.nstreams == self.shape.nstreams => {
                    let g = self.groups.entry(h.conn_id).or_insert_with(|| Group {
                        streams: (0..=h.nstreams).map(|_| None).collect(),
                        count: 0,
                        since: Instant::now(),
                    });
                    let slot = &mut g.streams[h.index as usize];
                    if slot.is_none() {
                        *slot = Some(inc.stream);
                        g.count += 1;
                    } else {
                        // First come: a second stream for the same index never replaces the
                        // one already admitted.
                        crate::nlog!(
                            INFO,
                            NET,
                            "dropped a duplicate stream {} of connection {:#x}",
                            h.index,
                            h.conn_id
                        );
                    }
                }
                _ => crate::nlog!(
                    INFO,
                    NET,
                    "dropped a connection that is not an ncclbpf stream for this listener"
                ),
            }
        }
        let ready = self
            .groups
            .iter()
            .find(|(_, g)| g.count == g.streams.len())
            .map(|(id, _)| *id);
        let Some(conn_id) = ready else {
            return Ok(None);
        };
        let g = self.groups.remove(&conn_id).expect("found above");
        let mut streams: Vec<TcpStream> = g
            .streams
            .into_iter()
            .map(|s| s.expect("complete group"))
            .collect();
        let control = streams.pop().expect("control stream is last");
        Comm::new(
            ConnDirection::Recv,
            conn_id,
            self.endpoint,
            self.shape,
            control,
            streams,
        )
        .map(Some)
    }
}

// ---------------------------------------------------------------- connect

enum Dial {
    Connecting(Socket),
    SendingHello(TcpStream, usize),
    Ready(TcpStream),
}

struct PendingConnect {
    handle: Handle,
    conn_id: u64,
    streams: Vec<Dial>,
    started: Instant,
}

static PENDING: LazyLock<Mutex<HashMap<u64, PendingConnect>>> = LazyLock::new(Default::default);

fn pending() -> std::sync::MutexGuard<'static, HashMap<u64, PendingConnect>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Number of connects in progress (for tests of resource cleanup).
pub fn pending_connects() -> usize {
    pending().len()
}

/// One step of a non-blocking connect. `Ok(None)`: call again with the same handle.
pub fn connect(endpoint: Endpoint, handle: &mut [u8; HANDLE_SIZE]) -> NetResult<Option<Box<Comm>>> {
    let key = Handle::connect_key(handle);
    let taken = {
        let mut table = pending();
        // Connects NCCL gave up on are forgotten (their sockets closed) after a while.
        table.retain(|_, p| p.started.elapsed() < CONNECT_TIMEOUT * 2);
        table.remove(&key)
    };
    let (key, pc) = match taken {
        Some(pc) => (key, pc),
        None => {
            let pc = start_connect(Handle::decode(handle)?)?;
            let key = random_u64();
            Handle::set_connect_key(handle, key);
            (key, pc)
        }
    };
    let PendingConnect {
        handle: h,
        conn_id,
        streams,
        started,
    } = pc;
    if started.elapsed() > CONNECT_TIMEOUT {
        return Err(NetError::Io {
            op: "connect",
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no connection to {} within {:?}", h.addr, CONNECT_TIMEOUT),
            ),
        });
    }
    let streams = streams
        .into_iter()
        .enumerate()
        .map(|(i, d)| step(d, &h, conn_id, i as u32))
        .collect::<NetResult<Vec<_>>>()?;
    if !streams.iter().all(|d| matches!(d, Dial::Ready(_))) {
        pending().insert(
            key,
            PendingConnect {
                handle: h,
                conn_id,
                streams,
                started,
            },
        );
        return Ok(None);
    }
    let mut streams: Vec<TcpStream> = streams
        .into_iter()
        .filter_map(|d| match d {
            Dial::Ready(s) => Some(s),
            _ => None,
        })
        .collect();
    let control = streams.pop().expect("control stream is last");
    Comm::new(
        ConnDirection::Send,
        conn_id,
        endpoint,
        h.shape,
        control,
        streams,
    )
    .map(Some)
}

fn start_connect(h: Handle) -> NetResult<PendingConnect> {
    let addr = SockAddr::from(h.addr);
    let mut streams = Vec::with_capacity(h.shape.nstreams as usize + 1);
    for _ in 0..=h.shape.nstreams {
        let s = stream_socket(&h.addr).map_err(|e| NetError::io("socket", e))?;
        match s.connect(&addr) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(connect_error(&h, e)),
        }
        streams.push(Dial::Connecting(s));
    }
    Ok(PendingConnect {
        handle: h,
        conn_id: random_u64(),
        streams,
        started: Instant::now(),
    })
}

fn connect_error(h: &Handle, e: io::Error) -> NetError {
    let why = if e.kind() == io::ErrorKind::ConnectionRefused {
        " (the listener is gone: was the peer's listen comm closed?)"
    } else {
        ""
    };
    NetError::Io {
        op: "connect",
        source: io::Error::new(e.kind(), format!("to {}: {e}{why}", h.addr)),
    }
}

/// Advances one stream of a pending connect as far as it can go without blocking.
fn step(mut d: Dial, h: &Handle, conn_id: u64, index: u32) -> NetResult<Dial> {
    loop {
        d = match d {
            Dial::Connecting(s) => {
                if let Some(e) = s.take_error().map_err(|e| NetError::io("getsockopt", e))? {
                    return Err(connect_error(h, e));
                }
                match s.peer_addr() {
                    Ok(_) => Dial::SendingHello(s.into(), 0),
                    Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                        return Ok(Dial::Connecting(s));
                    }
                    Err(e) => return Err(connect_error(h, e)),
                }
            }
            Dial::SendingHello(mut s, mut sent) => {
                let hello = Hello {
                    nonce: h.nonce,
                    conn_id,
                    index,
                    nstreams: h.shape.nstreams,
                }
                .encode();
                match s.write(&hello[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Ok(Dial::SendingHello(s, sent));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(connect_error(h, e)),
                }
                if sent == HELLO_SIZE {
                    Dial::Ready(s)
                } else {
                    Dial::SendingHello(s, sent)
                }
            }
            ready @ Dial::Ready(_) => return Ok(ready),
        }
    }
}
