//! `NCCL_BPF_IO=uring`: a pool worker with its own io_uring, one `sendmsg` or `recvmsg` in
//! flight per stream. A send asks for the whole rest of its chunk (header and bytes in one
//! request); a receive for the rest of the chunk being read and the next chunk's header, or for
//! a header alone. A short completion (the socket's buffer was full, or held less) is
//! resubmitted for the remainder.
//!
//! Not `MSG_WAITALL`: with it the kernel retries inside the request, and when the connection
//! then fails (a dead peer's `TCP_USER_TIMEOUT`) the request completes with the bytes it moved
//! while the error that stopped it is consumed by the retry; the next request sees only a
//! closed socket (`EPIPE`, or end of stream), not why it closed. One attempt per request keeps
//! the error for the request that meets it.
//!
//! The worker's eventfd is watched by a poll request on the ring, so a parked worker (in
//! `io_uring_enter`, waiting for one completion) wakes for a command as for I/O. A stream being
//! removed with a request in flight gets that request cancelled and is forgotten only when its
//! completion has arrived: until then the kernel may still write into NCCL's buffer.

use super::Queue;
use super::pool::{Cmd, Serve, Waker, drain};
use crossbeam_channel::{Receiver, Sender};
use io_uring::{IoUring, opcode, types};
use shared_maps::ConnDirection;
use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Completion keys that are not streams (stream keys start at 1 and stay far below these).
const WAKE: u64 = 0;
const CANCEL: u64 = u64::MAX;
/// Submission queue entries per worker ring.
const ENTRIES: u32 = 256;
/// Completion queue entries: one request per stream can be in flight, and 1,000 comms of 4
/// streams on 4 workers put 2,000 streams on a ring. Beyond this the kernel keeps completions on
/// an overflow list (`IORING_FEAT_NODROP`), allocated as they come, which can fail.
const CQ_ENTRIES: u32 = 8192;
/// Bytes asked of one request at most (a request's length is 32-bit).
const MAX_REQUEST: usize = 1 << 30;

/// Whether this process can use io_uring for sockets: a ring can be set up, and the kernel
/// knows send, receive, poll and cancel. Asked once.
pub fn probe() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT
        .get_or_init(|| {
            // The size the workers use: on kernels before 5.12 ring memory is locked memory,
            // which a small probe ring could pass where theirs would not.
            let ring: IoUring = IoUring::builder()
                .setup_cqsize(CQ_ENTRIES)
                .build(ENTRIES)
                .map_err(|e| format!("io_uring_setup: {e}"))?;
            let mut p = io_uring::Probe::new();
            ring.submitter()
                .register_probe(&mut p)
                .map_err(|e| format!("IORING_REGISTER_PROBE: {e}"))?;
            for (code, name) in [
                (opcode::SendMsg::CODE, "sendmsg"),
                (opcode::RecvMsg::CODE, "recvmsg"),
                (opcode::PollAdd::CODE, "poll"),
                (opcode::AsyncCancel::CODE, "cancel"),
            ] {
                if !p.is_supported(code) {
                    return Err(format!("the kernel's io_uring has no {name}"));
                }
            }
            Ok(())
        })
        .clone()
}

struct Entry {
    q: Queue,
    /// A request for the head is with the kernel.
    inflight: bool,
    /// What that request names (boxed: the kernel reads them while the map may move entries).
    iov: Box<[libc::iovec; 2]>,
    msg: Box<libc::msghdr>,
    /// Removal asked while a request was in flight: acknowledged once it completes.
    removing: Option<Sender<()>>,
}

struct Worker {
    ring: IoUring,
    streams: HashMap<u64, Entry>,
    /// Streams whose next request could not be queued.
    deferred: Vec<u64>,
}

impl Serve for Worker {
    fn command(&mut self, cmd: Cmd) {
        self.on_command(cmd);
    }

    fn panicked(&mut self, key: u64, payload: &(dyn std::any::Any + Send)) {
        self.stream_panicked(key, payload);
    }
}

impl Worker {
    /// Queues `sqe`, flushing the submission queue to the kernel if it is full.
    fn push(&mut self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        for _ in 0..2 {
            // SAFETY: every buffer an entry names stays valid until its completion: stream
            // buffers are NCCL's, held until the chunk is counted down (after its completion);
            // the poll and cancel entries name none.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
        Err(io::Error::other("the submission queue stays full"))
    }

    /// Starts stream `key`'s next request (the head chunk's rest, or the receive stream's next
    /// bytes), if it has one and none is in flight.
    fn start(&mut self, key: u64) {
        let Some(e) = self.streams.get_mut(&key) else {
            return;
        };
        if e.inflight || e.q.broken || e.removing.is_some() {
            return;
        }
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| e.q.ctx.injected_panic())) {
            let why = e.q.ctx.panic_error(&*payload);
            e.q.fail(why);
            return;
        }
        let iov = match e.q.next_io() {
            Ok(Some(iov)) => iov,
            Ok(None) => return,
            Err(why) => {
                e.q.fail(why);
                return;
            }
        };
        let (v, n) = iov.iovecs(MAX_REQUEST);
        *e.iov = v;
        // SAFETY: a zeroed msghdr is valid; it names only the boxed iovecs.
        *e.msg = unsafe { std::mem::zeroed() };
        e.msg.msg_iov = e.iov.as_mut_ptr();
        e.msg.msg_iovlen = n as _;
        let fd = types::Fd(e.q.ctx.stream.as_raw_fd());
        // The iovecs name the head chunk of NCCL's lent buffer (ours alone until it is counted
        // down, after this request's completion), the boxed header, or a claimed receive
        // (held until the reader drops the claim, after the completion).
        let sqe = match e.q.ctx.direction {
            ConnDirection::Send => opcode::SendMsg::new(fd, &*e.msg)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build(),
            ConnDirection::Recv => opcode::RecvMsg::new(fd, &mut *e.msg).build(),
        }
        .user_data(key);
        e.inflight = true;
        if self.push(&sqe).is_err() {
            // The kernel took nothing (a full queue it cannot flush now): try again after the
            // next completions, the chunk still queued.
            if let Some(e) = self.streams.get_mut(&key) {
                e.inflight = false;
            }
            self.deferred.push(key);
        }
    }

    fn on_command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Add { key, ctx } => {
                self.streams.insert(
                    key,
                    Entry {
                        q: Queue::new(*ctx),
                        inflight: false,
                        iov: Box::new(
                            [libc::iovec {
                                iov_base: std::ptr::null_mut(),
                                iov_len: 0,
                            }; 2],
                        ),
                        // SAFETY: an all-zero msghdr is valid (no name, no iovecs, no control).
                        msg: Box::new(unsafe { std::mem::zeroed() }),
                        removing: None,
                    },
                );
                // A receive stream starts reading headers at once.
                self.start(key);
            }
            Cmd::Poke { key } => {
                if let Some(r) = self.streams.get_mut(&key).and_then(|e| e.q.reader.as_mut()) {
                    r.waiting = false;
                }
                self.start(key);
            }
            Cmd::Task { key, task } => {
                let Some(e) = self.streams.get_mut(&key) else {
                    // A bug: the task is dropped, which fails its request (`Task`'s drop), so
                    // NCCL gets an error rather than a send that never completes.
                    crate::nlog!(
                        WARN,
                        NET,
                        "uring I/O: a chunk of request {} for unknown stream {key} (a bug); \
                         its send fails",
                        task.idx
                    );
                    return;
                };
                if e.q.broken || e.removing.is_some() {
                    e.q.ctx.abandon(task);
                    return;
                }
                e.q.tasks.push_back(task);
                self.start(key);
            }
            Cmd::Remove { key, done } => {
                let Some(e) = self.streams.get_mut(&key) else {
                    let _ = done.send(());
                    return;
                };
                if e.inflight {
                    e.removing = Some(done);
                    let cancel = opcode::AsyncCancel::new(key).build().user_data(CANCEL);
                    // Without the cancel the request still ends: the comm shut the stream down.
                    let _ = self.push(&cancel);
                } else if let Some(mut e) = self.streams.remove(&key) {
                    e.q.abandon_all();
                    // The socket's last reference goes before the comm hears it is let go.
                    drop(e);
                    let _ = done.send(());
                }
            }
        }
    }

    /// One completion of stream `key`'s request.
    fn completed(&mut self, key: u64, res: i32) {
        let Some(e) = self.streams.get_mut(&key) else {
            return;
        };
        e.inflight = false;
        if e.q.broken {
            // Failed while this request was with the kernel: what it held is let go now.
            e.q.abandon_all();
        } else if res > 0 {
            e.q.advance(res as usize);
        } else if res == 0 && e.q.ended_cleanly() {
            // The peer closed its comm between chunks: nothing more to read.
        } else if e.removing.is_none() {
            let err = if res == 0 {
                io::ErrorKind::UnexpectedEof.into()
            } else {
                io::Error::from_raw_os_error(-res)
            };
            let why = e.q.ctx.io_error(err);
            e.q.fail(why);
        }
        if e.removing.is_some() {
            self.finish_removal(key);
            return;
        }
        self.start(key);
    }

    /// Forgets stream `key`, whose removal waited for its request: abandons what is queued,
    /// drops it (the socket's last reference), then tells the comm.
    fn finish_removal(&mut self, key: u64) {
        let Some(mut e) = self.streams.remove(&key) else {
            return;
        };
        e.q.abandon_all();
        let done = e.removing.take();
        drop(e);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    /// Handling stream `key`'s command or completion panicked (a bug, caught): the stream
    /// fails, so its requests fail instead of waiting, and the worker carries on.
    fn stream_panicked(&mut self, key: u64, payload: &(dyn std::any::Any + Send)) {
        let Some(e) = self.streams.get_mut(&key) else {
            return;
        };
        let why = e.q.ctx.panic_error(payload);
        if e.inflight {
            // The kernel still holds a request into this stream's buffer: fail the stream (its
            // shutdown ends the request) but let go of the chunks only at its completion.
            e.q.broken = true;
            e.q.ctx.fail_stream(why);
            return;
        }
        e.q.fail(why);
        if e.removing.is_some() {
            self.finish_removal(key);
        }
    }

    /// Starts the requests that could not be queued before (the submission queue was full).
    fn start_deferred(&mut self) {
        for key in std::mem::take(&mut self.deferred) {
            self.start(key);
        }
    }

    fn arm_wake(&mut self, fd: i32) -> io::Result<()> {
        let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(WAKE);
        self.push(&poll)
    }
}

/// The worker thread: serves its streams until the process ends.
pub fn run(rx: Receiver<Cmd>, waker: Arc<Waker>, spin: Duration, ready: Sender<io::Result<()>>) {
    let ring = match IoUring::builder().setup_cqsize(CQ_ENTRIES).build(ENTRIES) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut w = Worker {
        ring,
        streams: HashMap::new(),
        deferred: Vec::new(),
    };
    if let Err(e) = w
        .arm_wake(waker.fd())
        .and_then(|()| w.ring.submit().map(drop))
    {
        let _ = ready.send(Err(e));
        return;
    }
    let _ = ready.send(Ok(()));
    let mut idle_since = Instant::now();
    let mut wake_armed = true;
    let mut done = Vec::with_capacity(ENTRIES as usize);
    loop {
        let Some(mut busy) = drain(&mut w, &rx) else {
            return;
        };
        if !w.ring.submission().is_empty() {
            let _ = w.ring.submit();
        }
        done.clear();
        done.extend(w.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(key, res) in &done {
            busy = true;
            match key {
                WAKE => {
                    waker.drain();
                    wake_armed = w.arm_wake(waker.fd()).is_ok();
                }
                CANCEL => {}
                key => {
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| w.completed(key, res))) {
                        w.stream_panicked(key, &*p);
                    }
                }
            }
        }
        if !w.deferred.is_empty() {
            w.start_deferred();
        }
        if busy {
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        if !wake_armed || !w.deferred.is_empty() {
            // Without its wake a parked worker would miss commands, and a deferred request
            // may have nothing in flight to wake it: look again soon instead.
            std::thread::sleep(Duration::from_millis(1));
            wake_armed = w.arm_wake(waker.fd()).is_ok();
            continue;
        }
        if waker.may_park(&rx) {
            let _ = w.ring.submit_and_wait(1);
            waker.unparked();
            idle_since = Instant::now();
        }
    }
}
