//! The connecting side: opens the streams the handle asks for and runs the connector's half
//! of the admission handshake on each. NCCL calls `connect` again with the same handle until
//! it returns a comm, so progress lives in a table keyed by a number written into the handle.

use super::{Endpoint, random_u64, stream_socket};
use crate::comm::Comm;
use crate::error::{NetError, NetResult};
use crate::handshake::{self, PROOF_SIZE, REPLY_SIZE, Xfer};
use crate::wire::{HANDLE_SIZE, HELLO_SIZE, Handle, Hello};
use shared_maps::ConnDirection;
use socket2::{SockAddr, Socket};
use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// A connect that has not completed within this time fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// One stream of a pending connect, as far as it has got.
enum Dial {
    Connecting(Socket),
    Hello(TcpStream, Xfer<HELLO_SIZE>),
    Reply(TcpStream, Xfer<REPLY_SIZE>),
    Proof(TcpStream, Xfer<PROOF_SIZE>),
    Ready(TcpStream),
}

struct Stream {
    index: u32,
    hello: [u8; HELLO_SIZE],
    dial: Dial,
}

struct PendingConnect {
    handle: Handle,
    conn_id: u64,
    streams: Vec<Stream>,
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
    let (key, mut pc) = match taken {
        Some(pc) => (key, pc),
        None => {
            let pc = start_connect(Handle::decode(handle)?)?;
            let key = random_u64();
            Handle::set_connect_key(handle, key);
            (key, pc)
        }
    };
    if pc.started.elapsed() > CONNECT_TIMEOUT {
        return Err(NetError::Io {
            op: "connect",
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no connection to {} within {:?}",
                    pc.handle.addr, CONNECT_TIMEOUT
                ),
            ),
        });
    }
    pc.streams = std::mem::take(&mut pc.streams)
        .into_iter()
        .map(|s| {
            Ok(Stream {
                dial: step(s.dial, &pc.handle, s.index, &s.hello)?,
                ..s
            })
        })
        .collect::<NetResult<_>>()?;
    if !pc.streams.iter().all(|s| matches!(s.dial, Dial::Ready(_))) {
        pending().insert(key, pc);
        return Ok(None);
    }
    let PendingConnect {
        handle: h,
        conn_id,
        streams,
        ..
    } = pc;
    let mut streams: Vec<TcpStream> = streams
        .into_iter()
        .filter_map(|s| match s.dial {
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
    let conn_id = random_u64();
    let mut streams = Vec::with_capacity(h.shape.nstreams as usize + 1);
    for index in 0..=h.shape.nstreams {
        let s = stream_socket(&h.addr).map_err(|e| NetError::io("socket", e))?;
        match s.connect(&addr) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(connect_error(&h, e)),
        }
        let hello = Hello {
            nonce: h.nonce,
            conn_id,
            index,
            nstreams: h.shape.nstreams,
            challenge: handshake::challenge().map_err(|e| NetError::io("getrandom", e))?,
        }
        .encode();
        streams.push(Stream {
            index,
            hello,
            dial: Dial::Connecting(s),
        });
    }
    Ok(PendingConnect {
        handle: h,
        conn_id,
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
    NetError::io(
        "connect",
        io::Error::new(e.kind(), format!("to {}: {e}{why}", h.addr)),
    )
}

/// Advances one stream of a pending connect as far as it can go without blocking.
fn step(mut d: Dial, h: &Handle, index: u32, hello: &[u8; HELLO_SIZE]) -> NetResult<Dial> {
    let refused = |what: &str| {
        NetError::Handshake(format!(
            "stream {index} to {}: {what}; the process there does not take this handle (a stale handle, another process on the port, or a different ncclbpf version)",
            h.addr
        ))
    };
    loop {
        d = match d {
            Dial::Connecting(s) => {
                if let Some(e) = s.take_error().map_err(|e| NetError::io("getsockopt", e))? {
                    return Err(connect_error(h, e));
                }
                match s.peer_addr() {
                    Ok(_) => Dial::Hello(s.into(), Xfer::outgoing(*hello)),
                    Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                        return Ok(Dial::Connecting(s));
                    }
                    Err(e) => return Err(connect_error(h, e)),
                }
            }
            Dial::Hello(mut s, mut x) => match x.write_to(&mut s) {
                Ok(true) => Dial::Reply(s, Xfer::incoming()),
                Ok(false) => return Ok(Dial::Hello(s, x)),
                Err(e) => return Err(connect_error(h, e)),
            },
            Dial::Reply(mut s, mut x) => match x.read_from(&mut s) {
                Ok(true) => match h.secret.answer(hello, &x.buf) {
                    Some(proof) => Dial::Proof(s, Xfer::outgoing(proof)),
                    None => return Err(refused("no proof of the handle's secret")),
                },
                Ok(false) => return Ok(Dial::Reply(s, x)),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(refused(
                        "closed during the handshake (or its NCCL_BPF_HANDSHAKE_TIMEOUT passed)",
                    ));
                }
                Err(e) => return Err(connect_error(h, e)),
            },
            Dial::Proof(mut s, mut x) => match x.write_to(&mut s) {
                Ok(true) => Dial::Ready(s),
                Ok(false) => return Ok(Dial::Proof(s, x)),
                Err(e) => return Err(connect_error(h, e)),
            },
            ready @ Dial::Ready(_) => return Ok(ready),
        }
    }
}
