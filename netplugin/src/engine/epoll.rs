//! `NCCL_BPF_IO=epoll`: a pool worker moving chunks with non-blocking `sendmsg`/`recvmsg`,
//! woken by edge-triggered epoll.
//!
//! A stream is *ready* from when it is added, or epoll reports it, until a call returns
//! `EAGAIN`; a ready stream with work (queued chunks to send; for a receive stream, a reader not
//! waiting for a post) is on the active list. Each pass over the list
//! moves at most [`VISIT_BYTES`] per stream before going on to the next, so one large message
//! does not hold the others back. A stream that fails (error, end of stream, or a panic in its
//! I/O, caught) is shut down, its chunks are abandoned, and the comm reports the error.

use super::pool::{Cmd, Serve, Waker, drain};
use super::{Queue, QueueError};
use crate::error::NetError;
use crossbeam_channel::{Receiver, Sender};
use shared_maps::ConnDirection;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes one visit moves on a stream before the next stream's turn.
pub const VISIT_BYTES: usize = 1 << 20;
/// The epoll key of the worker's eventfd (stream keys start at 1).
const WAKE: u64 = 0;
const EVENTS: usize = 256;

struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    fn new(wake: RawFd) -> io::Result<Epoll> {
        // SAFETY: plain syscall, result checked before it is owned.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let ep = Epoll {
            // SAFETY: a fresh epoll fd nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        };
        ep.add(wake, libc::EPOLLIN as u32, WAKE)?;
        Ok(ep)
    }

    fn add(&self, fd: RawFd, events: u32, key: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: key };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call.
        let r = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn remove(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: EPOLL_CTL_DEL ignores the event pointer (non-null for old kernels).
        let _ = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Waits up to `timeout_ms` (-1: until an event) for events into `out`.
    fn wait(&self, out: &mut [libc::epoll_event], timeout_ms: i32) -> usize {
        // SAFETY: `out` is valid for `out.len()` events.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                out.as_mut_ptr(),
                out.len() as i32,
                timeout_ms,
            )
        };
        n.max(0) as usize
    }
}

struct Entry {
    q: Queue,
    /// Not known to return EAGAIN.
    ready: bool,
    /// On the active list.
    active: bool,
}

enum Visit {
    /// The queue is empty.
    Drained,
    /// The socket said EAGAIN.
    Blocked,
    /// The visit's bytes are used up; more to do.
    More,
    Failed(NetError),
}

impl Entry {
    /// Moves the stream's bytes until one of [`Visit`]'s outcomes.
    fn visit(&mut self) -> Visit {
        let mut budget = VISIT_BYTES;
        loop {
            self.q.ctx.injected_panic();
            match self.q.move_once(false, budget) {
                Ok(Some(n)) => {
                    budget -= n;
                    if budget == 0 {
                        return Visit::More;
                    }
                }
                Ok(None) if self.q.has_work() => return Visit::Blocked,
                Ok(None) => return Visit::Drained,
                Err(QueueError::Io(e))
                    if e.kind() == io::ErrorKind::UnexpectedEof && self.q.ended_cleanly() =>
                {
                    return Visit::Drained;
                }
                Err(e) => return Visit::Failed(e.into_net(&self.q.ctx)),
            }
        }
    }

    /// Puts the stream on the active list if it is ready and has work.
    fn activate(&mut self, key: u64, active: &mut VecDeque<u64>) {
        if self.ready && !self.active && self.q.has_work() {
            self.active = true;
            active.push_back(key);
        }
    }
}

struct Worker {
    ep: Epoll,
    streams: HashMap<u64, Entry>,
    active: VecDeque<u64>,
}

impl Serve for Worker {
    fn command(&mut self, cmd: Cmd) {
        self.on_command(cmd);
    }

    fn panicked(&mut self, key: u64, payload: &(dyn std::any::Any + Send)) {
        if let Some(e) = self.streams.get_mut(&key) {
            let why = e.q.ctx.panic_error(payload);
            e.q.fail(why);
        }
    }
}

impl Worker {
    fn on_command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Add { key, ctx } => {
                let interest = match ctx.direction {
                    ConnDirection::Send => libc::EPOLLOUT,
                    ConnDirection::Recv => libc::EPOLLIN,
                } | libc::EPOLLRDHUP
                    | libc::EPOLLET;
                let added = self.ep.add(ctx.stream.as_raw_fd(), interest as u32, key);
                let mut e = Entry {
                    q: Queue::new(*ctx),
                    ready: true,
                    active: false,
                };
                if let Err(err) = added {
                    let why = e.q.ctx.io_error(err);
                    e.q.fail(why);
                }
                // A receive stream starts reading headers at once.
                e.activate(key, &mut self.active);
                self.streams.insert(key, e);
            }
            Cmd::Task { key, task } => {
                let Some(e) = self.streams.get_mut(&key) else {
                    // A bug: the task is dropped, which fails its request (`Task`'s drop), so
                    // NCCL gets an error rather than a send that never completes.
                    crate::nlog!(
                        WARN,
                        NET,
                        "epoll I/O: a chunk of request {} for unknown stream {key} (a bug); \
                         its send fails",
                        task.idx
                    );
                    return;
                };
                if e.q.broken {
                    e.q.ctx.abandon(task);
                    return;
                }
                e.q.tasks.push_back(task);
                e.activate(key, &mut self.active);
            }
            Cmd::Poke { key } => {
                if let Some(e) = self.streams.get_mut(&key) {
                    if let Some(r) = &mut e.q.reader {
                        r.waiting = false;
                    }
                    e.activate(key, &mut self.active);
                }
            }
            Cmd::Remove { key, done } => {
                if let Some(mut e) = self.streams.remove(&key) {
                    self.ep.remove(e.q.ctx.stream.as_raw_fd());
                    e.q.abandon_all();
                }
                let _ = done.send(());
            }
        }
    }

    fn ready(&mut self, key: u64) {
        if let Some(e) = self.streams.get_mut(&key) {
            e.ready = true;
            e.activate(key, &mut self.active);
        }
    }

    /// One pass over the active streams; whether anything was there to do.
    fn progress(&mut self) -> bool {
        let n = self.active.len();
        for _ in 0..n {
            let Some(key) = self.active.pop_front() else {
                break;
            };
            let Some(e) = self.streams.get_mut(&key) else {
                continue;
            };
            e.active = false;
            match catch_unwind(AssertUnwindSafe(|| e.visit())) {
                Ok(Visit::Drained) => {}
                Ok(Visit::Blocked) => e.ready = false,
                Ok(Visit::More) => {
                    e.active = true;
                    self.active.push_back(key);
                }
                Ok(Visit::Failed(why)) => e.q.fail(why),
                Err(payload) => {
                    let why = e.q.ctx.panic_error(&*payload);
                    e.q.fail(why);
                }
            }
        }
        n > 0
    }
}

/// The worker thread: serves its streams until the process ends.
pub fn run(rx: Receiver<Cmd>, waker: Arc<Waker>, spin: Duration, ready: Sender<io::Result<()>>) {
    let ep = match Epoll::new(waker.fd()) {
        Ok(ep) => ep,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut w = Worker {
        ep,
        streams: HashMap::new(),
        active: VecDeque::new(),
    };
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS];
    let mut idle_since = Instant::now();
    loop {
        let Some(mut busy) = drain(&mut w, &rx) else {
            return;
        };
        busy |= w.progress();
        let timeout = if busy {
            idle_since = Instant::now();
            0
        } else if idle_since.elapsed() < spin {
            0
        } else if waker.may_park(&rx) {
            -1
        } else {
            continue;
        };
        let n = w.ep.wait(&mut events, timeout);
        if timeout < 0 {
            waker.unparked();
            idle_since = Instant::now();
        }
        for ev in &events[..n] {
            let key = ev.u64;
            if key == WAKE {
                waker.drain();
            } else {
                w.ready(key);
            }
        }
    }
}
