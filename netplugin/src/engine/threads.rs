//! `NCCL_BPF_IO=threads`: one helper thread per data stream, blocking I/O, fed by a channel.
//!
//! Helpers start when a comm first carries a large message. If the OS refuses one (EAGAIN
//! under a pid or thread limit), the ones already started are stopped and joined and the comm
//! fails with a message naming the limit. A panic inside a helper is caught there: its chunk
//! fails, the stream and the comm with it, and the helper carries on failing later chunks.

use super::{StreamCtx, Task};
use crossbeam_channel::{Receiver, Sender};
use std::io::{self, Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;

pub struct Workers {
    txs: Vec<Sender<Task>>,
    joins: Vec<JoinHandle<()>>,
}

impl Workers {
    /// One helper thread per stream. If one cannot be started, those already started are
    /// stopped and joined (their queues are empty) and the reason comes back as a message.
    pub fn start(streams: Vec<StreamCtx>) -> Result<Workers, String> {
        let n = streams.len();
        let mut workers = Workers {
            txs: Vec::with_capacity(n),
            joins: Vec::with_capacity(n),
        };
        for (k, ctx) in streams.into_iter().enumerate() {
            let (tx, rx) = crossbeam_channel::unbounded();
            let (conn_id, dir) = (ctx.conn_id, ctx.direction);
            match spawn_helper(ctx, rx) {
                Ok(join) => {
                    workers.txs.push(tx);
                    workers.joins.push(join);
                }
                Err(e) => {
                    workers.stop();
                    return Err(format!(
                        "cannot start helper thread {} of {n} for connection {conn_id:#018x} \
                         ({}): {e}; raise the pid/thread limit (ulimit -u, the container's \
                         pids.max), lower NCCL_BPF_NSTREAMS, or serve the streams with a few \
                         process-wide workers (NCCL_BPF_IO=auto)",
                        k + 1,
                        match dir {
                            shared_maps::ConnDirection::Send => "send",
                            shared_maps::ConnDirection::Recv => "recv",
                        }
                    ));
                }
            }
        }
        Ok(workers)
    }

    pub fn submit(&self, k: usize, task: Task) -> Result<(), Task> {
        match self.txs.get(k) {
            Some(tx) => tx.send(task).map_err(|e| e.0),
            None => Err(task),
        }
    }

    /// Ends every helper and waits for it. With its sender gone a helper finishes its queue and
    /// exits, so either the queues are empty or the streams were shut down first (any chunk
    /// still blocked in I/O then fails at once).
    pub fn stop(self) {
        drop(self.txs);
        for j in self.joins {
            // A helper catches its own panics (`run`); nothing to report here.
            let _ = j.join();
        }
    }
}

fn spawn_helper(ctx: StreamCtx, rx: Receiver<Task>) -> io::Result<JoinHandle<()>> {
    #[cfg(test)]
    if crate::comm::inject::spawn_fails(ctx.conn_id, ctx.index) {
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    std::thread::Builder::new()
        .name(ctx.name.clone())
        .spawn(move || run(ctx, rx))
}

/// Serves one data stream until its comm closes the channel.
///
/// Every task's pending count goes down exactly once, whatever happens to its I/O: an error
/// or a panic (caught here; the release profile unwinds) fails the request and the stream;
/// later tasks are failed without I/O.
fn run(ctx: StreamCtx, rx: Receiver<Task>) {
    let mut broken = false;
    for task in rx {
        if broken {
            ctx.abandon(task.idx);
            continue;
        }
        match catch_unwind(AssertUnwindSafe(|| transfer(&ctx, &task))) {
            Ok(Ok(())) => ctx.finished(task.idx),
            Ok(Err(e)) => {
                broken = true;
                ctx.fail_stream(ctx.io_error(e));
                ctx.abandon(task.idx);
            }
            Err(payload) => {
                broken = true;
                ctx.fail_stream(ctx.panic_error(&*payload));
                ctx.abandon(task.idx);
            }
        }
    }
}

/// Moves one chunk over the stream (blocking).
fn transfer(ctx: &StreamCtx, task: &Task) -> io::Result<()> {
    ctx.injected_panic();
    let mut s = &*ctx.stream;
    // SAFETY: this chunk of the lent buffer is handed to this thread alone, and the request
    // cannot complete (freeing the buffer) until `run` counts it down after this.
    unsafe {
        match ctx.direction {
            shared_maps::ConnDirection::Send => s.write_all(task.buf.bytes()),
            shared_maps::ConnDirection::Recv => s.read_exact(task.buf.bytes_mut()),
        }
    }
}
