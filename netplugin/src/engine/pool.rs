//! The process-wide workers of the `uring` and `epoll` paths, and a comm's streams on them.
//!
//! A pool is started by the first comm that carries a large message and lives as long as the
//! process (the library is linked `-z nodelete`, so NCCL's dlclose cannot unmap code a worker
//! runs; a parked worker costs nothing). Each worker owns the streams given to it: only it does
//! their I/O, so a stream needs no lock. Comms talk to a worker through its command channel:
//! add a stream, queue a chunk, poke a receive stream that waited for a post, remove a stream
//! (acknowledged once the worker holds nothing of it). A command wakes the worker through its
//! eventfd only when the worker is parked.
//!
//! If the OS refuses some worker threads (a pid limit), the pool runs with those it got, said
//! once in the log; if it refuses all, the comm fails with `ncclSystemError` and a message
//! naming the limit, and a later comm tries again.

use super::{Path, Settings, StreamCtx, Task};
use crossbeam_channel::{Receiver, Sender};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a comm asks of a worker.
pub enum Cmd {
    /// Serve this stream under `key`.
    Add { key: u64, ctx: Box<StreamCtx> },
    /// Move this chunk on send stream `key`, after those queued before it.
    Task { key: u64, task: Task },
    /// Receive stream `key` may go on reading: the receive it stopped for is posted.
    Poke { key: u64 },
    /// Abandon the stream's queued chunks, forget it, then say so on `done`.
    Remove { key: u64, done: Sender<()> },
}

impl Cmd {
    /// The stream the command is about.
    pub fn key(&self) -> u64 {
        match self {
            Cmd::Add { key, .. }
            | Cmd::Task { key, .. }
            | Cmd::Poke { key }
            | Cmd::Remove { key, .. } => *key,
        }
    }
}

/// A worker loop's handling of its commands.
pub trait Serve {
    fn command(&mut self, cmd: Cmd);
    /// Handling the command about stream `key` panicked (a bug, caught): fail that stream, so
    /// its requests fail instead of waiting, and carry on.
    fn panicked(&mut self, key: u64, payload: &(dyn std::any::Any + Send));
}

/// Hands every command waiting on `rx` to `w`, each under `catch_unwind`: `None` once the
/// channel is closed (the worker ends), else whether there was any.
pub fn drain<W: Serve>(w: &mut W, rx: &Receiver<Cmd>) -> Option<bool> {
    let mut any = false;
    loop {
        match rx.try_recv() {
            Ok(cmd) => {
                any = true;
                let key = cmd.key();
                let run = std::panic::AssertUnwindSafe(|| w.command(cmd));
                if let Err(p) = std::panic::catch_unwind(run) {
                    w.panicked(key, &*p);
                }
            }
            Err(crossbeam_channel::TryRecvError::Empty) => return Some(any),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
        }
    }
}

/// Wakes a parked worker: an eventfd the worker waits on while parked, written only when it
/// is parked (the flag), so a busy worker costs its comms no system call.
pub struct Waker {
    parked: AtomicBool,
    fd: OwnedFd,
}

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: plain syscall; the result is checked before it is owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker {
            parked: AtomicBool::new(false),
            // SAFETY: a fresh eventfd that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// After a command was sent: wakes the worker if it parked.
    pub fn wake(&self) {
        // Pairs with the fence in `may_park`: either the worker sees the command, or we see
        // it parked.
        fence(Ordering::SeqCst);
        if self.parked.swap(false, Ordering::SeqCst) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a local into our eventfd. EAGAIN (the counter is
            // full) still leaves it readable, which is all a wake needs.
            let _ = unsafe { libc::write(self.fd(), one.as_ptr().cast(), 8) };
        }
    }

    /// The worker is about to park: `false` (and not parked) if a command came meanwhile.
    pub fn may_park<T>(&self, rx: &Receiver<T>) -> bool {
        self.parked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if rx.is_empty() {
            return true;
        }
        self.parked.store(false, Ordering::SeqCst);
        false
    }

    /// The worker is back from the kernel.
    pub fn unparked(&self) {
        self.parked.store(false, Ordering::SeqCst);
    }

    /// Consumes a wake (the eventfd was readable).
    pub fn drain(&self) {
        let mut v = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a local buffer from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.fd(), v.as_mut_ptr().cast(), 8) };
    }
}

struct Worker {
    tx: Sender<Cmd>,
    waker: Arc<Waker>,
}

impl Worker {
    fn send(&self, cmd: Cmd) -> Result<(), Cmd> {
        self.tx.send(cmd).map_err(|e| e.0)?;
        self.waker.wake();
        Ok(())
    }
}

pub struct Pool {
    path: Path,
    /// The process that started it: a forked child has the pool's state but not its threads,
    /// and starts its own.
    pid: u32,
    workers: Vec<Worker>,
    /// Where the next comm's stream 0 goes (so comms of one stream spread too).
    next: AtomicUsize,
}

static EPOLL: Mutex<Option<Arc<Pool>>> = Mutex::new(None);
static URING: Mutex<Option<Arc<Pool>>> = Mutex::new(None);
static KEYS: AtomicU64 = AtomicU64::new(1);

/// The process's pool for `path`, started on first use with the process's settings.
fn pool(path: Path) -> Result<Arc<Pool>, String> {
    let cell = match path {
        Path::Epoll => &EPOLL,
        Path::Uring => &URING,
        Path::Threads => unreachable!("the threads path has no pool"),
    };
    let mut g = super::lock(cell);
    if let Some(p) = &*g
        && p.pid == std::process::id()
    {
        return Ok(Arc::clone(p));
    }
    let p = Arc::new(Pool::start(path, &super::process_settings())?);
    *g = Some(Arc::clone(&p));
    Ok(p)
}

impl Pool {
    fn start(path: Path, s: &Settings) -> Result<Pool, String> {
        let want = s.worker_count();
        let spin = Duration::from_micros(u64::from(s.spin_us));
        let mut workers = Vec::with_capacity(want);
        let mut refused = None;
        for i in 0..want {
            match spawn_worker(path, i, spin) {
                Ok(w) => workers.push(w),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        match (workers.len(), refused) {
            (0, Some(e)) => Err(format!(
                "cannot start any of the {want} {path} I/O worker(s) for the data streams: {e}{}",
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    "; raise the pid/thread limit (ulimit -u, the container's pids.max)"
                } else if e.raw_os_error() == Some(libc::EMFILE) {
                    "; raise the open file limit (ulimit -n)"
                } else {
                    ""
                }
            )),
            (got, Some(e)) => {
                crate::nlog!(
                    WARN,
                    NET,
                    "{path} I/O: started {got} of {want} worker(s) ({e}); data streams share \
                     those"
                );
                Ok(Pool {
                    path,
                    pid: std::process::id(),
                    workers,
                    next: AtomicUsize::new(0),
                })
            }
            _ => Ok(Pool {
                path,
                pid: std::process::id(),
                workers,
                next: AtomicUsize::new(0),
            }),
        }
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }
}

fn spawn_worker(path: Path, i: usize, spin: Duration) -> io::Result<Worker> {
    let waker = Arc::new(Waker::new()?);
    let (tx, rx) = crossbeam_channel::unbounded();
    let w = Arc::clone(&waker);
    // The backend is set up inside the thread; its failure comes back before we go on.
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<io::Result<()>>(1);
    std::thread::Builder::new()
        .name(format!("ncclbpf io{i}"))
        .spawn(move || match path {
            Path::Epoll => super::epoll::run(rx, w, spin, ready_tx),
            Path::Uring => super::uring::run(rx, w, spin, ready_tx),
            Path::Threads => unreachable!(),
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(Worker { tx, waker }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::other("the worker ended before it was ready")),
    }
}

/// One comm's streams on a pool.
pub struct Streams {
    pool: Arc<Pool>,
    /// (worker, key) of each stream.
    at: Vec<(usize, u64)>,
}

/// How often a closing comm says it is still waiting for a worker to let go of its streams. A
/// worker never blocks in I/O (the streams are shut down before), so only a bug makes it wait
/// at all; and it keeps waiting: returning while the worker (or the kernel, for a request in
/// flight) may still write into NCCL's buffer would let NCCL free memory that is then written.
const REMOVE_WAIT: Duration = Duration::from_secs(30);

impl Streams {
    pub fn start(path: Path, streams: Vec<StreamCtx>) -> Result<Streams, String> {
        let pool = match pool(path) {
            Ok(p) => p,
            // io_uring passed the probe but its rings cannot be had now (locked memory on
            // kernels before 5.12, say): epoll serves the same streams.
            Err(why) if path == Path::Uring => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    crate::nlog!(WARN, NET, "{why}; data streams use epoll instead");
                });
                pool(Path::Epoll)?
            }
            Err(why) => return Err(why),
        };
        let n = pool.workers.len();
        let base = pool.next.fetch_add(streams.len().max(1), Ordering::Relaxed);
        let mut at = Vec::with_capacity(streams.len());
        for (k, ctx) in streams.into_iter().enumerate() {
            let w = (base + k) % n;
            let key = KEYS.fetch_add(1, Ordering::Relaxed);
            if pool.workers[w]
                .send(Cmd::Add {
                    key,
                    ctx: Box::new(ctx),
                })
                .is_err()
            {
                // A worker's channel closes only if its thread ended (a bug caught there).
                let s = Streams { pool, at };
                s.stop();
                return Err(format!("{path} I/O worker {w} is gone"));
            }
            at.push((w, key));
        }
        Ok(Streams { pool, at })
    }

    pub fn submit(&self, k: usize, task: Task) -> Result<(), Task> {
        let Some(&(w, key)) = self.at.get(k) else {
            return Err(task);
        };
        match self.pool.workers[w].send(Cmd::Task { key, task }) {
            Ok(()) => Ok(()),
            Err(Cmd::Task { task, .. }) => Err(task),
            Err(_) => unreachable!("send gives back what it was given"),
        }
    }

    /// Sends `task` to stream `k`'s worker under a key no worker serves: the engine's "a bug"
    /// path, for tests.
    #[cfg(test)]
    pub fn submit_unknown(&self, k: usize, task: Task) {
        let (w, _) = self.at[k];
        let key = u64::MAX / 2;
        let _ = self.pool.workers[w].send(Cmd::Task { key, task });
    }

    pub fn poke(&self, k: usize) {
        if let Some(&(w, key)) = self.at.get(k) {
            // A worker that is gone has failed its streams already.
            let _ = self.pool.workers[w].send(Cmd::Poke { key });
        }
    }

    pub fn stop(self) {
        let mut acks = Vec::with_capacity(self.at.len());
        for &(w, key) in &self.at {
            let (done, ack) = crossbeam_channel::bounded(1);
            if self.pool.workers[w].send(Cmd::Remove { key, done }).is_ok() {
                acks.push((w, ack));
            }
        }
        for (w, ack) in acks {
            let mut waited = 0u64;
            loop {
                match ack.recv_timeout(REMOVE_WAIT) {
                    // Acknowledged, or the worker is gone: a worker thread that ends has
                    // failed and let go of every stream first (`epoll::run`, `uring::run`).
                    Ok(()) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        waited += REMOVE_WAIT.as_secs();
                        crate::nlog!(
                            WARN,
                            NET,
                            "{} I/O worker {w} has not let go of a closing connection's stream \
                             after {waited} s; still waiting (NCCL's buffer may not be freed \
                             before)",
                            self.pool.path
                        );
                    }
                }
            }
        }
    }
}

/// The worker count of the process's pool for `path`, if started (for tests and status).
pub fn started_workers(path: Path) -> Option<usize> {
    let cell = match path {
        Path::Epoll => &EPOLL,
        Path::Uring => &URING,
        Path::Threads => return None,
    };
    super::lock(cell).as_ref().map(|p| p.workers())
}
