//! The listening side: `listen` draws the listener's id and secret and fills the handle;
//! `accept` takes incoming streams, runs the acceptor's half of the admission handshake on each
//! and groups the admitted streams by connection.
//!
//! What a stranger can do to a listener, and what it gets:
//! - connect and stay silent, or send anything that is not a hello: dropped after
//!   `NCCL_BPF_HANDSHAKE_TIMEOUT`, or at once; at most [`MAX_PENDING`] such streams are held
//!   (beyond, stale ones go first, then the least advanced and oldest, so a real stream in its
//!   handshake stays), and when the process is out of descriptors a stale one gives its
//!   descriptor to the next stream in the kernel's backlog, so a real connection does not wait
//!   for the strangers to time out;
//! - send a hello for another listener (an earlier job's): dropped at once;
//! - send a correct hello (the listener id is public) or replay a recorded one: it gets a fresh
//!   challenge it cannot answer without the secret, and is dropped;
//! - none of this touches a stream already admitted: groups hold admitted streams only.
//!
//! Every stream turned away is counted; one log line a second at most says how many and why.

use super::{congestion_control, dead_peer_timeout, handshake_timeout, random_u64, stream_socket};
use crate::comm::Comm;
use crate::error::{NetError, NetResult};
use crate::handshake::{self, CHALLENGE_SIZE, PROOF_SIZE, REPLY_SIZE, Secret, Xfer};
use crate::setup::Endpoint;
use crate::wire::{HANDLE_SIZE, HELLO_SIZE, Handle, Hello, Shape};
use shared_maps::ConnDirection;
use socket2::SockAddr;
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Streams in their handshake, per listener; beyond this the least advanced and oldest are
/// dropped, so a flood of silent connections cannot hold every descriptor.
pub const MAX_PENDING: usize = 256;
/// New streams taken from the kernel per `accept` call, so a flood cannot make one call long.
const ACCEPTS_PER_CALL: usize = MAX_PENDING;
/// A stream in its handshake this long is stale: a real connector sends its hello at once and
/// its proof one round trip after our reply, so only a stranger (or a peer that is gone) is
/// still there. Stale streams are the first to make room ([`keep_order`]).
const STALE: Duration = Duration::from_secs(1);

/// The order in which pending streams are kept when room must be made (the first kept first):
/// fresh streams (in their handshake for less than [`STALE`]) before stale ones, whatever they
/// sent (a stranger that sent one byte long ago must not push out a real stream whose hello
/// is still on its way); then those furthest along; then the newest.
fn keep_order(i: &Incoming) -> (bool, std::cmp::Reverse<u8>, std::cmp::Reverse<Instant>) {
    (
        i.since.elapsed() >= STALE,
        std::cmp::Reverse(i.stage.rank()),
        std::cmp::Reverse(i.since),
    )
}

/// Why a stream was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    NotOurs,
    OtherListener,
    WrongShape,
    BadProof,
    Silent,
    Closed,
    Evicted,
    Duplicate,
    NoRandom,
}

impl Refusal {
    const ALL: [Refusal; 9] = [
        Refusal::NotOurs,
        Refusal::OtherListener,
        Refusal::WrongShape,
        Refusal::BadProof,
        Refusal::Silent,
        Refusal::Closed,
        Refusal::Evicted,
        Refusal::Duplicate,
        Refusal::NoRandom,
    ];

    fn what(self) -> &'static str {
        match self {
            Refusal::NotOurs => "not an ncclbpf hello",
            Refusal::OtherListener => "for another listener (a stale handle or an earlier job)",
            Refusal::WrongShape => "a stream count other than this listener's",
            Refusal::BadProof => "failed the challenge (wrong secret or a replayed hello)",
            Refusal::Silent => "no handshake within NCCL_BPF_HANDSHAKE_TIMEOUT",
            Refusal::Closed => "closed or reset during the handshake",
            Refusal::Evicted => "dropped to stay under the pending-stream cap",
            Refusal::Duplicate => "a stream of a connection that failed (a stream index twice)",
            Refusal::NoRandom => "no randomness for a challenge",
        }
    }

    /// Worth a warning: somebody tried to pass, or a real connection failed.
    fn serious(self) -> bool {
        matches!(self, Refusal::BadProof | Refusal::Duplicate)
    }
}

/// Counts of streams turned away since the last log line.
#[derive(Default)]
struct Refusals {
    counts: [u32; Refusal::ALL.len()],
    last_peer: Option<SocketAddr>,
    last_log: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, why: Refusal, peer: Option<SocketAddr>) {
        self.counts[why as usize] += 1;
        self.last_peer = peer.or(self.last_peer);
    }

    /// Logs what was counted, at most once a second.
    fn flush(&mut self, listener: Option<SocketAddr>) {
        let total: u32 = self.counts.iter().sum();
        if total == 0
            || self
                .last_log
                .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        let reasons: Vec<String> = Refusal::ALL
            .iter()
            .filter(|r| self.counts[**r as usize] > 0)
            .map(|r| format!("{} {}", self.counts[*r as usize], r.what()))
            .collect();
        let serious = Refusal::ALL
            .iter()
            .any(|r| r.serious() && self.counts[*r as usize] > 0);
        let at = listener.map_or_else(String::new, |a| format!(" {a}"));
        let from = self
            .last_peer
            .map_or_else(String::new, |p| format!("; the last from {p}"));
        let line = format!(
            "listener{at} turned away {total} stream(s): {}{from}",
            reasons.join(", ")
        );
        if serious {
            crate::nlog!(WARN, NET, "{line}");
        } else {
            crate::nlog!(INFO, NET, "{line}");
        }
        *self = Refusals {
            last_log: Some(Instant::now()),
            ..Refusals::default()
        };
    }
}

/// How far an incoming stream has come in its handshake.
enum Stage {
    Hello(Xfer<HELLO_SIZE>),
    Reply {
        hello: [u8; HELLO_SIZE],
        challenge: [u8; CHALLENGE_SIZE],
        out: Xfer<REPLY_SIZE>,
    },
    Proof {
        hello: [u8; HELLO_SIZE],
        challenge: [u8; CHALLENGE_SIZE],
        inp: Xfer<PROOF_SIZE>,
    },
}

impl Stage {
    /// Which streams to keep first under the pending cap: those furthest along.
    fn rank(&self) -> u8 {
        match self {
            Stage::Hello(x) if !x.started() => 0,
            Stage::Hello(_) => 1,
            _ => 2,
        }
    }
}

struct Incoming {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    stage: Stage,
    since: Instant,
}

enum Step {
    Wait,
    Admitted(Hello),
    Refused(Refusal),
}

/// What a stream must prove, and by when.
struct Admission {
    nonce: u64,
    secret: Secret,
    nstreams: u32,
    timeout: Duration,
}

impl Admission {
    /// Advances one stream's handshake as far as it goes without blocking.
    fn step(&self, inc: &mut Incoming) -> Step {
        loop {
            // Ok(true): this stage's message is whole; Ok(false): nothing more for now.
            let moved = match &mut inc.stage {
                Stage::Hello(x) => x.read_from(&mut inc.stream),
                Stage::Reply { out, .. } => out.write_to(&mut inc.stream),
                Stage::Proof { inp, .. } => inp.read_from(&mut inc.stream),
            };
            match moved {
                Ok(true) => {}
                Ok(false) if inc.since.elapsed() >= self.timeout => {
                    return Step::Refused(Refusal::Silent);
                }
                Ok(false) => return Step::Wait,
                Err(_) => return Step::Refused(Refusal::Closed),
            }
            inc.stage = match &inc.stage {
                Stage::Hello(x) => match self.challenge(&x.buf) {
                    Ok(next) => next,
                    Err(why) => return Step::Refused(why),
                },
                Stage::Reply {
                    hello, challenge, ..
                } => Stage::Proof {
                    hello: *hello,
                    challenge: *challenge,
                    inp: Xfer::incoming(),
                },
                Stage::Proof {
                    hello,
                    challenge,
                    inp,
                } => {
                    return if self.secret.verify(hello, challenge, &inp.buf) {
                        Step::Admitted(Hello::decode(hello).expect("decoded before"))
                    } else {
                        Step::Refused(Refusal::BadProof)
                    };
                }
            };
        }
    }

    /// What follows a whole hello: the reply with a fresh challenge, or why not.
    fn challenge(&self, raw: &[u8; HELLO_SIZE]) -> Result<Stage, Refusal> {
        match Hello::decode(raw) {
            None => Err(Refusal::NotOurs),
            Some(h) if h.nonce != self.nonce => Err(Refusal::OtherListener),
            Some(h) if h.nstreams != self.nstreams => Err(Refusal::WrongShape),
            Some(_) => {
                let challenge = handshake::challenge().map_err(|_| Refusal::NoRandom)?;
                Ok(Stage::Reply {
                    hello: *raw,
                    challenge,
                    out: Xfer::outgoing(self.secret.reply(raw, &challenge)),
                })
            }
        }
    }
}

/// The admitted streams of one connection so far.
struct Group {
    streams: Vec<Option<TcpStream>>,
    count: usize,
    since: Instant,
}

pub struct ListenComm {
    endpoint: Endpoint,
    listener: TcpListener,
    shape: Shape,
    admission: Admission,
    incoming: Vec<Incoming>,
    groups: HashMap<u64, Group>,
    /// Connections that failed (a stream index twice), so their later streams are not taken
    /// for a new one; forgotten after the handshake timeout.
    failed: HashMap<u64, Instant>,
    refusals: Refusals,
}

/// Opens a listener on `bind` and fills the 128-byte handle for the peer.
pub fn listen(
    endpoint: Endpoint,
    bind: SocketAddr,
    shape: Shape,
    handle: &mut [u8; HANDLE_SIZE],
) -> NetResult<Box<ListenComm>> {
    let secret = Secret::random().map_err(|e| NetError::io("getrandom (listener secret)", e))?;
    listen_with(endpoint, bind, shape, secret, handle)
}

/// [`listen`] with the admission secret given (a side channel's comes from the seed its
/// trailer carries: `inner::side`).
pub fn listen_with(
    endpoint: Endpoint,
    bind: SocketAddr,
    shape: Shape,
    secret: Secret,
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
    Handle {
        nonce,
        addr,
        shape,
        secret: secret.clone(),
    }
    .encode(handle);
    Ok(Box::new(ListenComm {
        endpoint,
        listener,
        shape,
        admission: Admission {
            nonce,
            secret,
            nstreams: shape.nstreams,
            timeout: handshake_timeout(),
        },
        incoming: Vec::new(),
        groups: HashMap::new(),
        failed: HashMap::new(),
        refusals: Refusals::default(),
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

    /// Streams in their handshake now.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.incoming.len()
    }

    /// Makes progress; returns a comm once every stream of one connection has been admitted.
    pub fn accept(&mut self) -> NetResult<Option<Box<Comm>>> {
        self.take_new()?;
        self.progress_handshakes();
        self.cap_pending();
        self.expire();
        self.refusals.flush(self.local_addr());
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

    /// Takes what the kernel has queued, up to [`ACCEPTS_PER_CALL`].
    fn take_new(&mut self) -> NetResult<()> {
        for _ in 0..ACCEPTS_PER_CALL {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    stream
                        .set_nonblocking(true)
                        .map_err(|e| NetError::io("set_nonblocking", e))?;
                    let _ = stream.set_nodelay(true);
                    dead_peer_timeout(&socket2::SockRef::from(&stream));
                    congestion_control(&socket2::SockRef::from(&stream));
                    self.incoming.push(Incoming {
                        stream,
                        peer: Some(peer),
                        stage: Stage::Hello(Xfer::incoming()),
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted) => {}
                Err(e) if transient_accept_error(&e) => {
                    // Out of descriptors: a stale stream in its handshake (a silent stranger,
                    // most likely) gives its descriptor to the stream waiting in the backlog,
                    // rather than that stream waiting until the stranger's handshake times out.
                    if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
                        && self.evict_stale()
                    {
                        continue;
                    }
                    // Out of descriptors or buffers for now: the connection stays in the
                    // kernel's backlog and is taken on a later call.
                    log_transient(&e);
                    break;
                }
                Err(e) => return Err(NetError::io("accept", e)),
            }
        }
        Ok(())
    }

    fn progress_handshakes(&mut self) {
        let mut i = 0;
        while i < self.incoming.len() {
            match self.admission.step(&mut self.incoming[i]) {
                Step::Wait => i += 1,
                Step::Refused(why) => {
                    let inc = self.incoming.swap_remove(i);
                    self.refusals.note(why, inc.peer);
                }
                Step::Admitted(h) => {
                    let inc = self.incoming.swap_remove(i);
                    self.admit(h, inc.stream, inc.peer);
                }
            }
        }
    }

    /// Files an admitted stream with its connection. First come only: the same index twice
    /// fails the connection (only a holder of the secret can cause it, and then neither stream
    /// can be trusted to be the one NCCL's peer meant).
    fn admit(&mut self, h: Hello, stream: TcpStream, peer: Option<SocketAddr>) {
        if self.failed.contains_key(&h.conn_id) {
            self.refusals.note(Refusal::Duplicate, peer);
            return;
        }
        let g = self.groups.entry(h.conn_id).or_insert_with(|| Group {
            streams: (0..=h.nstreams).map(|_| None).collect(),
            count: 0,
            since: Instant::now(),
        });
        let slot = &mut g.streams[h.index as usize];
        if slot.is_none() {
            *slot = Some(stream);
            g.count += 1;
            return;
        }
        self.groups.remove(&h.conn_id);
        self.failed.insert(h.conn_id, Instant::now());
        self.refusals.note(Refusal::Duplicate, peer);
        crate::nlog!(
            WARN,
            NET,
            "connection {:#x}: stream {} arrived twice, both proving the secret; the connection is dropped (its connect fails at the first send)",
            h.conn_id,
            h.index
        );
    }

    /// Keeps at most [`MAX_PENDING`] streams in their handshake, dropping the least worth
    /// keeping ([`keep_order`]).
    fn cap_pending(&mut self) {
        if self.incoming.len() <= MAX_PENDING {
            return;
        }
        self.incoming.sort_by_key(keep_order);
        for inc in self.incoming.drain(MAX_PENDING..) {
            self.refusals.note(Refusal::Evicted, inc.peer);
        }
    }

    /// Out of descriptors: first whoever has completed the handshake is taken out of the
    /// pending list, then the stream least worth keeping is dropped if it is stale (in its
    /// handshake for [`STALE`] or more: a real connector answers within a round trip). Whether
    /// one was dropped (its descriptor is free for the next `accept`).
    fn evict_stale(&mut self) -> bool {
        self.progress_handshakes();
        let Some((at, _)) = self
            .incoming
            .iter()
            .enumerate()
            .filter(|(_, i)| i.since.elapsed() >= STALE)
            .max_by_key(|(_, i)| keep_order(i))
        else {
            return false;
        };
        let inc = self.incoming.swap_remove(at);
        self.refusals.note(Refusal::Evicted, inc.peer);
        true
    }

    /// Drops connections whose streams did not all arrive within the handshake timeout.
    fn expire(&mut self) {
        let timeout = self.admission.timeout;
        self.groups.retain(|id, g| {
            let keep = g.since.elapsed() < timeout;
            if !keep {
                crate::nlog!(
                    WARN,
                    NET,
                    "connection {id:#x}: {} of its {} streams arrived within NCCL_BPF_HANDSHAKE_TIMEOUT ({timeout:?}); dropped",
                    g.count,
                    g.streams.len()
                );
            }
            keep
        });
        self.failed.retain(|_, t| t.elapsed() < timeout);
    }
}
