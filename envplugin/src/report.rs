//! What the plugin says in NCCL's log, and when.
//!
//! `init` and `finalize` log on NCCL's thread, as every plugin does. `getEnv` never calls
//! NCCL's logger itself: NCCL's `ncclDebugInit` reads `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, ...
//! through `getEnv` while it holds the logger's (non-recursive) mutex, so a log line from
//! inside that `getEnv` would deadlock the thread on itself (and NCCL 2.30 reads other names
//! there too, e.g. `NCCL_NO_CACHE`). Its lines are handed to [`Deferred`], whose own thread
//! logs them: that thread holds no lock of NCCL's or of ours while it calls the logger, so it
//! can at worst wait for NCCL's logger to finish initialising.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

/// The log levels the plugin uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

/// Values longer than this are shown cut, with their length.
pub const MAX_SHOWN: usize = 200;

/// `value` for a log line: at most [`MAX_SHOWN`] characters.
pub fn show_value(value: &str) -> String {
    match value.char_indices().nth(MAX_SHOWN) {
        Some((at, _)) => format!("{}... ({} bytes)", &value[..at], value.len()),
        None => value.to_string(),
    }
}

/// How NCCL's logger is reached: `(level, message)`; a function so tests can watch.
pub type Emit = fn(Level, &str);

/// Lines waiting for the log thread, at most [`Deferred::MAX_QUEUED`].
struct Queue {
    lines: VecDeque<(Level, String)>,
    /// Lines refused because the queue was full.
    dropped: u64,
    /// The process that started the log thread (0: none yet). After a fork the child has no
    /// log thread, and starts its own.
    worker_pid: u32,
    /// Starting a thread failed: lines wait for the next [`Deferred::flush`].
    no_thread: bool,
}

/// Log lines produced where calling NCCL's logger is not safe, logged by a thread of their own.
///
/// Lines wait while there is no logger to send them to (`ready` false: NCCL gives a v1 env
/// plugin no logger, and loads it before the net plugin that gets one), for at most
/// [`Deferred::WAIT_FOR_LOGGER`]; then they are sent anyway (and dropped by a logger-less
/// [`Emit`], as before).
pub struct Deferred {
    emit: Emit,
    ready: fn() -> bool,
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Deferred {
    pub const MAX_QUEUED: usize = 1024;
    /// How long queued lines wait for a logger.
    pub const WAIT_FOR_LOGGER: std::time::Duration = std::time::Duration::from_secs(120);

    pub const fn new(emit: Emit) -> Deferred {
        Deferred::waiting_for(emit, || true)
    }

    /// Lines are held while `ready` says there is no logger yet.
    pub const fn waiting_for(emit: Emit, ready: fn() -> bool) -> Deferred {
        Deferred {
            emit,
            ready,
            queue: Mutex::new(Queue {
                lines: VecDeque::new(),
                dropped: 0,
                worker_pid: 0,
                no_thread: false,
            }),
            wake: Condvar::new(),
        }
    }

    /// Queues a line; the log thread (started on first use) logs it soon. Never blocks on
    /// the logger, never calls it.
    pub fn push(&'static self, level: Level, msg: String) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.lines.len() >= Self::MAX_QUEUED {
            q.dropped += 1;
            return;
        }
        q.lines.push_back((level, msg));
        let pid = std::process::id();
        if q.worker_pid != pid && !q.no_thread {
            let started = std::thread::Builder::new()
                .name("ncclbpf-envlog".into())
                .spawn(move || self.work());
            match started {
                Ok(_) => q.worker_pid = pid,
                Err(_) => q.no_thread = true,
            }
        }
        drop(q);
        self.wake.notify_one();
    }

    /// Logs every queued line now, on the calling thread (from `init` and `finalize`, where
    /// NCCL's logger may be called).
    /// Without a logger yet they stay queued for the log thread, which waits for one.
    pub fn flush(&self) {
        if !(self.ready)() {
            return;
        }
        let (lines, dropped) = self.take(false);
        self.emit_all(lines, dropped);
    }

    /// The log thread: waits for lines, takes them all, logs them with no lock held.
    fn work(&self) {
        let began = std::time::Instant::now();
        loop {
            while !(self.ready)() && began.elapsed() < Self::WAIT_FOR_LOGGER {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let (lines, dropped) = self.take(true);
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.emit_all(lines, dropped)
            }));
        }
    }

    fn take(&self, wait: bool) -> (VecDeque<(Level, String)>, u64) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        while wait && q.lines.is_empty() && q.dropped == 0 {
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        (
            std::mem::take(&mut q.lines),
            std::mem::replace(&mut q.dropped, 0),
        )
    }

    fn emit_all(&self, lines: VecDeque<(Level, String)>, dropped: u64) {
        for (level, msg) in lines {
            (self.emit)(level, &msg);
        }
        if dropped > 0 {
            (self.emit)(
                Level::Warn,
                &format!(
                    "{dropped} log lines dropped (more than {} waiting)",
                    Self::MAX_QUEUED
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    #[test]
    fn long_values_are_cut() {
        assert_eq!(show_value("short"), "short");
        let v = "é".repeat(MAX_SHOWN);
        assert_eq!(show_value(&v), v);
        let v = "x".repeat(MAX_SHOWN + 1);
        assert_eq!(
            show_value(&v),
            format!("{}... (201 bytes)", "x".repeat(MAX_SHOWN))
        );
    }

    static SEEN: Mutex<Vec<(ThreadId, Level, String)>> = Mutex::new(Vec::new());

    fn watch(level: Level, msg: &str) {
        SEEN.lock()
            .unwrap()
            .push((std::thread::current().id(), level, msg.to_string()));
    }

    static D: Deferred = Deferred::new(watch);

    fn seen(tag: &str) -> Vec<(ThreadId, Level, String)> {
        SEEN.lock()
            .unwrap()
            .iter()
            .filter(|l| l.2.starts_with(tag))
            .cloned()
            .collect()
    }

    #[test]
    fn pushed_lines_are_logged_by_another_thread_in_order() {
        let me = std::thread::current().id();
        for i in 0..5 {
            D.push(Level::Info, format!("order {i}"));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen("order").len() < 5 {
            assert!(Instant::now() < deadline, "the log thread logged nothing");
            std::thread::sleep(Duration::from_millis(5));
        }
        let got = seen("order");
        assert_eq!(
            got.iter().map(|l| l.2.as_str()).collect::<Vec<_>>(),
            ["order 0", "order 1", "order 2", "order 3", "order 4"]
        );
        assert!(
            got.iter().all(|l| l.0 != me),
            "push called the logger itself"
        );
    }

    #[test]
    fn flush_logs_on_the_calling_thread() {
        static F: Deferred = Deferred::new(watch);
        // Lines queued without a log thread (as after a failed spawn) wait for flush.
        F.queue.lock().unwrap().no_thread = true;
        F.push(Level::Warn, "flushed a".into());
        F.push(Level::Info, "flushed b".into());
        assert!(seen("flushed").is_empty());
        F.flush();
        let me = std::thread::current().id();
        assert_eq!(
            seen("flushed"),
            vec![
                (me, Level::Warn, "flushed a".to_string()),
                (me, Level::Info, "flushed b".to_string())
            ]
        );
    }

    #[test]
    fn a_full_queue_drops_and_says_how_many() {
        static Q: Deferred = Deferred::new(watch);
        Q.queue.lock().unwrap().no_thread = true;
        for i in 0..Deferred::MAX_QUEUED + 3 {
            Q.push(Level::Info, format!("full {i}"));
        }
        Q.flush();
        assert_eq!(seen("full ").len(), Deferred::MAX_QUEUED);
        assert_eq!(seen("3 log lines dropped").len(), 1, "{:?}", seen("3 log"));
    }
}
