//! Who moves the chunks of large messages over a connection's data streams.
//!
//! The control stream (headers, inline messages, frames) is always progressed by NCCL's proxy
//! thread inside `isend`/`irecv`/`test` (`comm.rs`). The data streams are served by one of
//! three paths, chosen per process by `NCCL_BPF_IO` ([`IoMode`]):
//!
//! * `uring` ([`uring`]): a few process-wide workers, each with its own io_uring; one send or
//!   receive in flight per stream.
//! * `epoll` ([`epoll`]): the same workers, with non-blocking `sendmsg`/`recvmsg` and
//!   edge-triggered epoll.
//! * `threads` ([`threads`]): one helper thread per data stream per connection, blocking I/O
//!   (the path before the engine; 1,000 comms of 4 streams start 4,000 threads).
//! * `auto` (the default): `uring` where the kernel lets us set up a ring (it may be missing,
//!   turned off by `kernel.io_uring_disabled`, or blocked by a seccomp profile), else `epoll`,
//!   said once in NCCL's log.
//!
//! Workers ([`pool`]) are bounded by the machine, not by the number of comms
//! (`NCCL_BPF_IO_WORKERS`, default min(4, cores)); stream `k` of every connection goes to
//! worker `k mod W`, so one message's chunks move in parallel. A worker that runs out of work
//! spins for `NCCL_BPF_IO_SPIN_US` (default 0) before it parks in the kernel; a parked worker
//! costs no CPU and is woken by an eventfd only when it was parked.
//!
//! Every chunk travels behind a 16-byte [`ChunkHeader`](crate::wire::ChunkHeader). A send
//! stream moves the chunks the comm queued on it, header and bytes in one vectored call. A
//! receive stream is not fed chunks: its server reads headers as they come and matches each to
//! its posted receive itself ([`posts`]), so a chunk is copied the moment it arrives.
//!
//! Whatever the path, a sent chunk's request slot is counted down exactly once (done, or failed),
//! and a comm that closes waits until no worker touches its buffers or sockets any more
//! ([`DataPath::stop`]). An I/O error or a panic fails the stream's pending chunks and the
//! comm, never the process.

pub mod epoll;
#[cfg(test)]
pub mod hold;
pub mod pool;
pub mod posts;
pub mod threads;
pub mod uring;

use crate::buf::Buf;
use crate::comm::ReqSlot;
use crate::config::Config;
use crate::error::NetError;
use posts::{Iov, Posts, Reader};
use shared_maps::{ConnDirection, ProgressMark};
use std::any::Any;
use std::fmt;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// `NCCL_BPF_IO`: how data streams are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    Auto,
    Uring,
    Epoll,
    Threads,
}

impl IoMode {
    pub fn parse(s: &str) -> Option<IoMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(IoMode::Auto),
            "uring" | "io_uring" => Some(IoMode::Uring),
            "epoll" => Some(IoMode::Epoll),
            "threads" => Some(IoMode::Threads),
            _ => None,
        }
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoMode::Auto => "auto",
            IoMode::Uring => "uring",
            IoMode::Epoll => "epoll",
            IoMode::Threads => "threads",
        })
    }
}

/// A path that actually serves streams (`auto` resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Uring,
    Epoll,
    Threads,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Path::Uring => "uring",
            Path::Epoll => "epoll",
            Path::Threads => "threads",
        })
    }
}

/// The engine's settings (from [`Config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub mode: IoMode,
    /// Workers of the `uring`/`epoll` pool; 0: min(4, cores).
    pub workers: u32,
    /// Microseconds a worker spins without work before it parks.
    pub spin_us: u32,
}

impl Settings {
    pub fn of(c: &Config) -> Settings {
        Settings {
            mode: c.io,
            workers: c.io_workers,
            spin_us: c.io_spin_us,
        }
    }

    pub fn worker_count(&self) -> usize {
        let n = if self.workers > 0 {
            self.workers as usize
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
        };
        // Test builds run at least two, so a test can hold one worker ([`hold`]) while another
        // serves the connection's other streams.
        #[cfg(test)]
        let n = n.max(2);
        n
    }
}

/// The path this process serves data streams with, chosen once (from the plugin's settings,
/// or the environment when a comm is made without `init`, as in unit tests).
pub fn process_path() -> Path {
    static PATH: OnceLock<Path> = OnceLock::new();
    *PATH.get_or_init(|| {
        let s = process_settings();
        let (path, note) = resolve(s.mode);
        if let Some(n) = note {
            crate::nlog!(WARN, NET, "{n}");
        }
        crate::nlog!(
            INFO,
            INIT,
            "data streams served by: {path}{}",
            match path {
                Path::Threads => " (a helper thread per data stream)".to_string(),
                _ => format!(
                    " ({} worker(s) for the whole process, spinning {} µs before parking)",
                    s.worker_count(),
                    s.spin_us
                ),
            }
        );
        path
    })
}

/// The settings of this process's engine.
pub fn process_settings() -> Settings {
    match crate::plugin::get() {
        Ok(p) => Settings::of(&p.config),
        Err(_) => Settings::of(&Config::from_env().0),
    }
}

/// `mode` as a path, and what to say when `auto` or `uring` had to fall back.
pub fn resolve(mode: IoMode) -> (Path, Option<String>) {
    match mode {
        IoMode::Threads => (Path::Threads, None),
        IoMode::Epoll => (Path::Epoll, None),
        IoMode::Uring | IoMode::Auto => match uring::probe() {
            Ok(()) => (Path::Uring, None),
            Err(why) => (
                Path::Epoll,
                Some(format!(
                    "io_uring unavailable ({why}); data streams use epoll{}",
                    if mode == IoMode::Uring {
                        " although NCCL_BPF_IO=uring"
                    } else {
                        ""
                    }
                )),
            ),
        },
    }
}

/// One chunk of a message for a send stream: request slot `idx`, its header (boxed: io_uring
/// reads it while the queue may grow), its bytes `buf`.
///
/// A task is settled exactly once: sent ([`StreamCtx::finished`]), given up
/// ([`StreamCtx::abandon`]), or, if some path loses it (a worker that no longer serves its
/// stream, a queue dropped in a panic), when it is dropped: its request then fails and its
/// stream's queued bytes go down, so NCCL sees an error instead of a send that never completes.
pub struct Task {
    pub idx: u32,
    pub hdr: Box<[u8; crate::wire::CHUNK_HEADER_SIZE]>,
    pub buf: Buf,
    owed: Option<Owed>,
}

/// What a chunk owes until it is settled: one of its request's pending chunks, and its bytes in
/// its stream's queued count.
struct Owed {
    slots: Arc<[ReqSlot]>,
    queued: Arc<AtomicU64>,
}

impl Task {
    /// Chunk `idx`'s task for the stream whose queued count is `queued` (which the caller has
    /// already raised by [`Task::wire_len`]); `slots` are its comm's requests.
    pub fn new(
        idx: u32,
        hdr: Box<[u8; crate::wire::CHUNK_HEADER_SIZE]>,
        buf: Buf,
        slots: &Arc<[ReqSlot]>,
        queued: &Arc<AtomicU64>,
    ) -> Task {
        Task {
            idx,
            hdr,
            buf,
            owed: Some(Owed {
                slots: Arc::clone(slots),
                queued: Arc::clone(queued),
            }),
        }
    }

    /// Bytes on the wire: header and payload.
    pub fn wire_len(&self) -> usize {
        crate::wire::CHUNK_HEADER_SIZE + self.buf.len()
    }

    /// Pays what the chunk owes, once: `sent` false fails its request first (before its
    /// pending count can reach 0, which `test` would take for success).
    fn settle(&mut self, sent: bool) {
        let Some(o) = self.owed.take() else { return };
        let slot = &o.slots[self.idx as usize];
        if !sent {
            slot.failed.store(true, Ordering::Release);
        }
        slot.pending_chunks.fetch_sub(1, Ordering::AcqRel);
        o.queued
            .fetch_sub(self.wire_len() as u64, Ordering::Release);
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.settle(false);
    }
}

/// What serving one data stream needs, whichever path serves it.
pub struct StreamCtx {
    pub direction: ConnDirection,
    /// `ncclbpf S<k>` or `ncclbpf R<k>` (the helper thread's name on the `threads` path).
    pub name: String,
    pub conn_id: u64,
    /// The stream's index in its connection.
    pub index: usize,
    pub stream: Arc<TcpStream>,
    /// Every data stream of the connection (this one among them).
    pub siblings: Arc<[Arc<TcpStream>]>,
    pub slots: Arc<[ReqSlot]>,
    /// The comm's first data-stream failure; `test` reports it.
    pub error: Arc<Mutex<Option<NetError>>>,
    /// Set with `error`: a data stream of the comm failed.
    pub failed: Arc<AtomicBool>,
    /// Stamps the connection's last progress after each chunk (the comm stops its data path
    /// before its hooks, which hold the record, are dropped).
    pub progress: Option<ProgressMark<'static>>,
    /// Receive: the comm's posted receives, which this stream's chunks name.
    pub posts: Option<Arc<Posts>>,
}

impl StreamCtx {
    fn op(&self) -> &'static str {
        match self.direction {
            ConnDirection::Send => "send on data stream",
            ConnDirection::Recv => "receive on data stream",
        }
    }

    /// Chunk `t` sent.
    pub fn finished(&self, mut t: Task) {
        if let Some(p) = &self.progress {
            p.stamp();
        }
        t.settle(true);
    }

    /// Chunk `t` not sent (the stream failed, or its comm closed): its request fails.
    pub fn abandon(&self, mut t: Task) {
        t.settle(false);
    }

    /// The stream failed: its byte sequence is out of step from here on, and the connection
    /// can no longer carry a message whole. Shut down every data stream of the connection (so
    /// the peer fails at once: a receiver cannot tell which stream owed it a chunk, but one
    /// whose data streams all ended knows none will come) and record the first failure for the
    /// comm.
    pub fn fail_stream(&self, e: NetError) {
        // Recorded before the shutdowns, which fail the sibling streams with errors of their
        // own (a broken pipe) that must not take this one's place.
        lock(&self.error).get_or_insert(e);
        self.failed.store(true, Ordering::Release);
        let _ = self.stream.shutdown(Shutdown::Both);
        for s in self.siblings.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn io_error(&self, e: io::Error) -> NetError {
        NetError::io(self.op(), e)
    }

    pub fn panic_error(&self, payload: &(dyn Any + Send)) -> NetError {
        NetError::HelperPanic(format!(
            "{} of connection {:#018x} panicked: {}",
            match self.direction {
                ConnDirection::Send => format!("the I/O for send stream {}", self.index),
                ConnDirection::Recv => format!("the I/O for receive stream {}", self.index),
            },
            self.conn_id,
            panic_message(payload)
        ))
    }

    /// Test-only: whether this stream's I/O is to panic.
    #[inline(always)]
    pub fn injected_panic(&self) {
        #[cfg(test)]
        if crate::comm::inject::helper_panics(self.conn_id, self.index) {
            panic!("injected test panic in {}", self.name);
        }
    }
}

/// One stream as its server keeps it, whatever the path: a send stream's queued chunks (moved
/// in order, the head `head_done` bytes in, header first), or a receive stream's reader.
pub struct Queue {
    pub ctx: StreamCtx,
    pub tasks: std::collections::VecDeque<Task>,
    pub head_done: usize,
    pub reader: Option<Reader>,
    /// The stream failed: chunks that come later are abandoned at once.
    pub broken: bool,
}

impl Queue {
    pub fn new(ctx: StreamCtx) -> Queue {
        let reader = (ctx.direction == ConnDirection::Recv).then(|| Reader::new(ctx.index));
        Queue {
            ctx,
            tasks: std::collections::VecDeque::new(),
            head_done: 0,
            reader,
            broken: false,
        }
    }

    /// The stream failed with `e`: shut down, recorded, every queued chunk abandoned, the
    /// chunk being received failed.
    pub fn fail(&mut self, e: NetError) {
        self.broken = true;
        self.ctx.fail_stream(e);
        self.abandon_all();
    }

    /// Lets go of everything: queued chunks abandoned, a claimed receive failed.
    pub fn abandon_all(&mut self) {
        self.head_done = 0;
        for t in self.tasks.drain(..) {
            self.ctx.abandon(t);
        }
        if let Some(r) = &mut self.reader {
            r.fail(&self.ctx);
        }
    }

    /// Whether the stream has something to move now (a receive stream always does, unless it
    /// waits for a post or failed).
    pub fn has_work(&self) -> bool {
        !self.broken
            && match &self.reader {
                Some(r) => !r.waiting && !r.ended,
                None => !self.tasks.is_empty(),
            }
    }

    /// The memory the next call moves: the head chunk's rest (header, then bytes), or where the
    /// receive stream's next bytes go. `Ok(None)`: nothing to do now. `Err`: the peer broke the
    /// chunk protocol (the caller fails the stream).
    pub fn next_io(&mut self) -> Result<Option<Iov>, NetError> {
        if self.broken {
            return Ok(None);
        }
        if let Some(r) = &mut self.reader {
            let io = r.next(&self.ctx)?;
            #[cfg(test)]
            if io.is_some() && r.in_chunk() {
                hold::reached(self.ctx.conn_id, self.ctx.index);
            }
            return Ok(io);
        }
        while let Some(t) = self.tasks.front_mut() {
            let h = crate::wire::CHUNK_HEADER_SIZE;
            if self.head_done >= t.wire_len() {
                // Only an empty chunk gets here; none is made, but it would be done.
                self.advance(0);
                continue;
            }
            let len = t.buf.len();
            // SAFETY: only the address is taken; the bytes are this stream's alone until the
            // chunk is counted down.
            let body = unsafe { t.buf.bytes().as_ptr().cast_mut() };
            let hp = t.hdr.as_mut_ptr();
            #[cfg(test)]
            hold::reached(self.ctx.conn_id, self.ctx.index);
            return Ok(Some(if self.head_done < h {
                // SAFETY: `head_done < h`: inside the boxed header.
                let hp = unsafe { hp.add(self.head_done) };
                Iov::two((hp, h - self.head_done), (body, len))
            } else {
                let at = self.head_done - h;
                // SAFETY: `at < len`: inside this chunk.
                Iov::one(unsafe { body.add(at) }, len - at)
            }));
        }
        Ok(None)
    }

    /// The stream reached its end: `true` when that is no error (a receive stream between
    /// chunks: the peer closed its comm), and the stream then just stops.
    pub fn ended_cleanly(&mut self) -> bool {
        match &mut self.reader {
            Some(r) => r.end(&self.ctx),
            None => false,
        }
    }

    /// `n` bytes of what [`Self::next_io`] gave were moved.
    pub fn advance(&mut self, n: usize) {
        if let Some(r) = &mut self.reader {
            r.advance(&self.ctx, n);
            return;
        }
        self.head_done += n;
        if self
            .tasks
            .front()
            .is_some_and(|t| self.head_done >= t.wire_len())
            && let Some(t) = self.tasks.pop_front()
        {
            self.head_done = 0;
            self.ctx.finished(t);
        }
    }

    /// One call moving what [`Self::next_io`] gives: `Ok(None)` when it would block (`wait`
    /// false) or nothing is to do now, `Ok(Some(n))` with `n > 0` bytes moved (and accounted).
    /// End of stream is an error; `EINTR` is retried. The epoll workers' and the helper
    /// threads' one system call.
    pub fn move_once(&mut self, wait: bool, max: usize) -> Result<Option<usize>, QueueError> {
        let Some(iov) = self.next_io().map_err(QueueError::Protocol)? else {
            return Ok(None);
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*self.ctx.stream);
        // SAFETY: `next_io` gave memory this stream alone may touch until `advance`.
        let r = unsafe { sys_move(self.ctx.direction, fd, &iov, wait, max) };
        match r {
            Ok(Some(n)) => {
                self.advance(n);
                Ok(Some(n))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(QueueError::Io(e)),
        }
    }
}

/// Why a stream stopped.
pub enum QueueError {
    Io(io::Error),
    Protocol(NetError),
}

impl QueueError {
    /// As the comm reports it.
    pub fn into_net(self, ctx: &StreamCtx) -> NetError {
        match self {
            QueueError::Io(e) => ctx.io_error(e),
            QueueError::Protocol(e) => e,
        }
    }
}

/// One `sendmsg`/`recvmsg` of up to `max` bytes of `iov` on `fd`, blocking if `wait`:
/// `Ok(None)` when the socket would block, `Ok(Some(n))` with `n > 0`; the end of the stream
/// is an error (`UnexpectedEof`), `EINTR` is retried.
///
/// # Safety
/// The caller alone may touch `iov`'s memory while the call runs, and it is valid.
unsafe fn sys_move(
    dir: ConnDirection,
    fd: std::os::fd::RawFd,
    iov: &Iov,
    wait: bool,
    max: usize,
) -> io::Result<Option<usize>> {
    let (mut v, n) = iov.iovecs(max);
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: a zeroed msghdr is valid; it names only `v`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = v.as_mut_ptr();
    msg.msg_iovlen = n as _;
    let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
    loop {
        let r = match dir {
            // SAFETY: `msg` names memory valid for the call (this function's contract).
            ConnDirection::Send => unsafe { libc::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL) },
            // SAFETY: as above, written by the kernel.
            ConnDirection::Recv => unsafe { libc::recvmsg(fd, &mut msg, flags) },
        };
        if r > 0 {
            return Ok(Some(r as usize));
        }
        if r == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// The data streams of one comm, on the process's path.
pub enum DataPath {
    Threads(threads::Workers),
    Pool(pool::Streams),
}

impl DataPath {
    /// Serves `streams` on `path`; on failure (the OS refused every thread it needs) the
    /// message says what to change.
    pub fn start(path: Path, streams: Vec<StreamCtx>) -> Result<DataPath, String> {
        match path {
            Path::Threads => threads::Workers::start(streams).map(DataPath::Threads),
            Path::Epoll | Path::Uring => pool::Streams::start(path, streams).map(DataPath::Pool),
        }
    }

    /// Hands `task` to stream `k`; `false` if nothing serves it (a bug: the caller fails the
    /// chunk).
    pub fn submit(&self, k: usize, task: Task) -> Result<(), Task> {
        match self {
            DataPath::Threads(w) => w.submit(k, task),
            DataPath::Pool(s) => s.submit(k, task),
        }
    }

    /// Receive stream `k` may go on: the receive it waited for is posted.
    pub fn poke(&self, k: usize) {
        match self {
            DataPath::Threads(w) => w.poke(k),
            DataPath::Pool(s) => s.poke(k),
        }
    }

    /// Stops serving the streams: every chunk still queued is abandoned, and on return no
    /// thread touches the comm's buffers or sockets. The streams must be shut down first, so
    /// I/O in progress ends at once.
    pub fn stop(self) {
        match self {
            DataPath::Threads(w) => w.stop(),
            DataPath::Pool(s) => s.stop(),
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The message of a caught panic.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    /// A chunk settles once: sent, its request stays unfailed; given up or lost (dropped with
    /// nothing settled, as a path that loses it would), its request fails before its pending
    /// count reaches 0, and its bytes leave the stream's queued count either way.
    #[test]
    fn a_chunk_settles_once_and_a_lost_one_fails_its_request() {
        let slots = ReqSlot::fresh(3);
        let queued = Arc::new(AtomicU64::new(0));
        let mut data = vec![0u8; 100];
        // SAFETY: `data` outlives the tasks (no I/O is done with them).
        let buf = unsafe { Buf::new(data.as_mut_ptr(), data.len()) };
        let task = |idx| {
            slots[idx as usize]
                .pending_chunks
                .store(1, Ordering::Relaxed);
            let t = Task::new(idx, Box::new([0; 64]), buf, &slots, &queued);
            queued.fetch_add(t.wire_len() as u64, Ordering::Relaxed);
            t
        };
        let ctx = send_ctx(Arc::new(loopback_pair().0), &slots);
        ctx.finished(task(0));
        assert_eq!(slots[0].pending_chunks.load(Ordering::Acquire), 0);
        assert!(!slots[0].failed.load(Ordering::Acquire));
        ctx.abandon(task(1));
        assert_eq!(slots[1].pending_chunks.load(Ordering::Acquire), 0);
        assert!(slots[1].failed.load(Ordering::Acquire));
        drop(task(2));
        assert_eq!(slots[2].pending_chunks.load(Ordering::Acquire), 0);
        assert!(slots[2].failed.load(Ordering::Acquire));
        assert_eq!(
            queued.load(Ordering::Acquire),
            0,
            "every chunk's bytes left the count"
        );
    }

    /// Stream 0 of a send connection of one stream, for `slots`.
    fn send_ctx(stream: Arc<TcpStream>, slots: &Arc<[ReqSlot]>) -> StreamCtx {
        StreamCtx {
            direction: ConnDirection::Send,
            name: "ncclbpf S0".into(),
            conn_id: 0x5709_0002,
            index: 0,
            siblings: Arc::from(vec![Arc::clone(&stream)]),
            stream,
            slots: Arc::clone(slots),
            error: Arc::new(Mutex::new(None)),
            failed: Arc::new(AtomicBool::new(false)),
            progress: None,
            posts: None,
        }
    }

    /// The pool's paths this machine has: epoll, and io_uring where it is allowed.
    fn pool_paths() -> Vec<Path> {
        let mut paths = vec![Path::Epoll];
        if uring::probe().is_ok() {
            paths.push(Path::Uring);
        }
        paths
    }

    fn loopback_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    /// A chunk that reaches a worker for a stream it does not serve (only a bug could send
    /// one) fails its request instead of vanishing, which left the send pending for ever.
    #[test]
    fn a_chunk_for_an_unknown_stream_fails_its_request() {
        for path in pool_paths() {
            let (ours, _peer) = loopback_pair();
            let slots = ReqSlot::fresh(1);
            let queued = Arc::new(AtomicU64::new(0));
            let ctx = send_ctx(Arc::new(ours), &slots);
            let streams = pool::Streams::start(path, vec![ctx]).unwrap();
            slots[0].pending_chunks.store(1, Ordering::Release);
            let t = Task::new(0, Box::new([0; 64]), Buf::EMPTY, &slots, &queued);
            queued.fetch_add(t.wire_len() as u64, Ordering::Release);
            streams.submit_unknown(0, t);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while slots[0].pending_chunks.load(Ordering::Acquire) != 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{path}: the lost chunk's send is still pending"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(slots[0].failed.load(Ordering::Acquire), "{path}");
            assert_eq!(queued.load(Ordering::Acquire), 0, "{path}");
            streams.stop();
        }
    }

    /// A stream removed while its reader's receive is with the kernel (the socket *not* shut
    /// down, so only the engine's own cancel can end the request) is let go only once nothing
    /// can write into the claimed buffer any more: bytes that arrive after `stop` returned
    /// never land there, the claim is dropped and the receive marked failed.
    #[test]
    fn a_stopped_stream_leaves_its_buffer_alone() {
        for path in pool_paths() {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let ours = Arc::new(l.accept().unwrap().0);
            let slots = ReqSlot::fresh(1);
            let shape = crate::wire::Shape {
                nstreams: 1,
                inline_bytes: 1024,
                min_chunk: 4096,
            };
            let posts = Arc::new(Posts::new(1, shape));
            let ctx = StreamCtx {
                direction: ConnDirection::Recv,
                name: "ncclbpf R0".into(),
                conn_id: 0x5709_0001,
                index: 0,
                stream: Arc::clone(&ours),
                siblings: Arc::new([ours]),
                slots: Arc::clone(&slots),
                error: Arc::new(Mutex::new(None)),
                failed: Arc::new(AtomicBool::new(false)),
                progress: None,
                posts: Some(Arc::clone(&posts)),
            };
            let mut into = vec![0u8; 4096];
            // SAFETY: `into` outlives the stream's service (stopped below, before it drops).
            let buf = unsafe { Buf::new(into.as_mut_ptr(), into.len()) };
            posts.post(0, buf);
            let streams = pool::Streams::start(path, vec![ctx]).unwrap();
            let h = crate::wire::ChunkHeader {
                seq: 0,
                size: 4096,
                offset: 0,
                len: 4096,
            };
            peer.write_all(&h.encode()).unwrap();
            peer.write_all(&[0xcd; 100]).unwrap();
            // The reader claimed the receive, took 100 bytes and now waits in the kernel
            // (uring) or for readiness (epoll) for the rest.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while slots[0].busy.load(Ordering::SeqCst) == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{path}: never claimed"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(slots[0].busy.load(Ordering::SeqCst), 1, "{path}: claimed");
            streams.stop();
            peer.write_all(&[0xab; 3996]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            assert!(into[..100].iter().all(|&b| b == 0xcd), "{path}: read");
            assert!(
                into[100..].iter().all(|&b| b == 0),
                "{path}: written after stop"
            );
            assert_eq!(slots[0].busy.load(Ordering::SeqCst), 0, "{path}: let go");
            assert_eq!(slots[0].received.load(Ordering::SeqCst), 0, "{path}");
            assert!(
                slots[0].failed.load(Ordering::Acquire),
                "{path}: failed, not done"
            );
            assert!(posts.retire(0, &slots[0]), "{path}");
        }
    }

    #[test]
    fn modes_parse() {
        assert_eq!(IoMode::parse("URING"), Some(IoMode::Uring));
        assert_eq!(IoMode::parse(" epoll "), Some(IoMode::Epoll));
        assert_eq!(IoMode::parse("threads"), Some(IoMode::Threads));
        assert_eq!(IoMode::parse("auto"), Some(IoMode::Auto));
        assert_eq!(IoMode::parse("fast"), None);
    }

    #[test]
    fn explicit_paths_resolve_to_themselves() {
        assert_eq!(resolve(IoMode::Threads), (Path::Threads, None));
        assert_eq!(resolve(IoMode::Epoll), (Path::Epoll, None));
        let (p, note) = resolve(IoMode::Auto);
        // Either io_uring works here, or auto says why it fell back to epoll.
        assert!(
            (p == Path::Uring && note.is_none())
                || (p == Path::Epoll && note.is_some_and(|n| n.contains("io_uring unavailable")))
        );
    }
}
