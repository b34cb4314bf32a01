//! Who moves the chunks of large messages over a connection's data streams.
//!
//! The control stream (headers, inline messages, frames) is always progressed by NCCL's proxy
//! thread inside `isend`/`irecv`/`test` (`comm.rs`). The data streams are served by one of
//! three paths, chosen per process by `NCCL_BPF_IO` ([`IoMode`]):
//!
//! * `uring` ([`uring`]): a few process-wide workers, each with its own io_uring; one send or
//!   receive in flight per stream, for the rest of its chunk.
//! * `epoll` ([`epoll`]): the same workers, with non-blocking `send`/`recv` and edge-triggered
//!   epoll.
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
//! Whatever the path, a chunk's request slot is counted down exactly once (done, or failed),
//! and a comm that closes waits until no worker touches its buffers or sockets any more
//! ([`DataPath::stop`]). An I/O error or a panic fails the stream's pending chunks and the
//! comm, never the process.

pub mod epoll;
pub mod pool;
pub mod threads;
pub mod uring;

use crate::buf::Buf;
use crate::comm::ReqSlot;
use crate::config::Config;
use crate::error::NetError;
use shared_maps::{ConnDirection, ProgressMark};
use std::any::Any;
use std::fmt;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
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
    /// Messages up to this size have their chunks moved by NCCL's proxy thread itself while
    /// the stream has nothing queued with the engine (`comm.rs`, direct chunks).
    pub direct_bytes: u32,
    /// Microseconds without a chunked request in flight before a message is direct.
    pub direct_idle_us: u32,
}

impl Settings {
    pub fn of(c: &Config) -> Settings {
        Settings {
            mode: c.io,
            workers: c.io_workers,
            spin_us: c.io_spin_us,
            direct_bytes: c.direct_bytes,
            direct_idle_us: c.direct_idle_us,
        }
    }

    pub fn worker_count(&self) -> usize {
        if self.workers > 0 {
            return self.workers as usize;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
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

/// One piece of a message for one data stream: request slot `idx`, bytes `buf`.
pub struct Task {
    pub idx: u32,
    pub buf: Buf,
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
    pub slots: Arc<[ReqSlot]>,
    /// The comm's first data-stream failure; `test` reports it.
    pub error: Arc<Mutex<Option<NetError>>>,
    /// Stamps the connection's last progress after each chunk (the comm stops its data path
    /// before its hooks, which hold the record, are dropped).
    pub progress: Option<ProgressMark<'static>>,
    /// Chunks handed to this stream's server and not yet counted down: while it is 0 nothing
    /// but the comm's own thread touches the socket, which may then move chunks itself
    /// (`comm.rs`, direct chunks).
    pub queued: Arc<AtomicU32>,
}

impl StreamCtx {
    fn op(&self) -> &'static str {
        match self.direction {
            ConnDirection::Send => "send on data stream",
            ConnDirection::Recv => "receive on data stream",
        }
    }

    /// Chunk of request `idx` moved.
    pub fn finished(&self, idx: u32) {
        if let Some(p) = &self.progress {
            p.stamp();
        }
        self.slots[idx as usize]
            .pending_chunks
            .fetch_sub(1, Ordering::AcqRel);
        self.queued.fetch_sub(1, Ordering::Release);
    }

    /// Chunk of request `idx` not moved (the stream failed, or its comm closed).
    pub fn abandon(&self, idx: u32) {
        let slot = &self.slots[idx as usize];
        slot.failed.store(true, Ordering::Release);
        slot.pending_chunks.fetch_sub(1, Ordering::AcqRel);
        self.queued.fetch_sub(1, Ordering::Release);
    }

    /// The stream failed: its byte sequence is out of step from here on. Shut it down (so the
    /// peer fails at once instead of waiting for the rest of a chunk) and record the first
    /// failure for the comm.
    pub fn fail_stream(&self, e: NetError) {
        let _ = self.stream.shutdown(Shutdown::Both);
        lock(&self.error).get_or_insert(e);
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

/// A stream's chunks as a pool worker keeps them (`epoll`, `uring`): moved in order, the head
/// `head_done` bytes in.
pub struct Queue {
    pub ctx: StreamCtx,
    pub tasks: std::collections::VecDeque<Task>,
    pub head_done: usize,
    /// The stream failed: chunks that come later are abandoned at once.
    pub broken: bool,
}

impl Queue {
    pub fn new(ctx: StreamCtx) -> Queue {
        Queue {
            ctx,
            tasks: std::collections::VecDeque::new(),
            head_done: 0,
            broken: false,
        }
    }

    /// The stream failed with `e`: shut down, recorded, every queued chunk abandoned.
    pub fn fail(&mut self, e: NetError) {
        self.broken = true;
        self.ctx.fail_stream(e);
        self.abandon_all();
    }

    pub fn abandon_all(&mut self) {
        self.head_done = 0;
        for t in self.tasks.drain(..) {
            self.ctx.abandon(t.idx);
        }
    }

    /// Moves the head on by `n` bytes, counting it down once all of it is moved.
    pub fn advance(&mut self, n: usize) {
        self.head_done += n;
        if self
            .tasks
            .front()
            .is_some_and(|t| self.head_done >= t.buf.len())
            && let Some(t) = self.tasks.pop_front()
        {
            self.head_done = 0;
            self.ctx.finished(t.idx);
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

/// One non-blocking `send` or `recv` of up to `max` bytes of `buf` from offset `at` on `fd`:
/// `Ok(None)` when the socket would block, `Ok(Some(n))` with `n > 0` bytes moved; the end of
/// the stream is an error (`UnexpectedEof`), `EINTR` is retried. The one system call of the
/// epoll workers and of direct chunks.
///
/// # Safety
/// `at < buf.len()`, and the caller alone may touch `buf` (a chunk of NCCL's lent buffer not
/// yet counted down) while the call runs.
pub unsafe fn move_once(
    dir: ConnDirection,
    fd: std::os::fd::RawFd,
    buf: Buf,
    at: usize,
    max: usize,
) -> io::Result<Option<usize>> {
    let want = (buf.len() - at).min(max);
    loop {
        let r = match dir {
            // SAFETY: `at < len` and `want <= len - at` keep the range inside the buffer, which
            // the caller alone touches (this function's contract).
            ConnDirection::Send => unsafe {
                let p = buf.bytes().as_ptr().add(at);
                libc::send(fd, p.cast(), want, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            },
            // SAFETY: as above, written into the receive buffer.
            ConnDirection::Recv => unsafe {
                let p = buf.bytes_mut().as_mut_ptr().add(at);
                libc::recv(fd, p.cast(), want, libc::MSG_DONTWAIT)
            },
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

    /// A stream removed while its receive is with the kernel (the socket *not* shut down, so
    /// only the engine's own cancel can end the request) is let go only once nothing can write
    /// into its buffer any more: bytes that arrive after `stop` returned never land there, and
    /// the chunk was counted down exactly once, as failed.
    #[test]
    fn a_stopped_stream_leaves_its_buffer_alone() {
        let mut paths = vec![Path::Epoll];
        if uring::probe().is_ok() {
            paths.push(Path::Uring);
        }
        for path in paths {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let ours = l.accept().unwrap().0;
            let slots = ReqSlot::fresh(1);
            let queued = Arc::new(AtomicU32::new(1));
            let ctx = StreamCtx {
                direction: ConnDirection::Recv,
                name: "ncclbpf R0".into(),
                conn_id: 0x5709_0001,
                index: 0,
                stream: Arc::new(ours),
                slots: Arc::clone(&slots),
                error: Arc::new(Mutex::new(None)),
                progress: None,
                queued: Arc::clone(&queued),
            };
            let streams = pool::Streams::start(path, vec![ctx]).unwrap();
            let mut into = vec![0u8; 4096];
            // SAFETY: `into` outlives the stream's service (stopped below, before it drops).
            let buf = unsafe { Buf::new(into.as_mut_ptr(), into.len()) };
            slots[0].pending_chunks.store(1, Ordering::Release);
            assert!(streams.submit(0, Task { idx: 0, buf }).is_ok());
            // The receive is now waiting in the kernel (uring) or for readiness (epoll).
            std::thread::sleep(Duration::from_millis(50));
            streams.stop();
            peer.write_all(&[0xab; 4096]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            assert!(into.iter().all(|&b| b == 0), "{path}: written after stop");
            assert_eq!(slots[0].pending_chunks.load(Ordering::Acquire), 0, "{path}");
            assert!(
                slots[0].failed.load(Ordering::Acquire),
                "{path}: abandoned, not done"
            );
            assert_eq!(queued.load(Ordering::Acquire), 0, "{path}");
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
