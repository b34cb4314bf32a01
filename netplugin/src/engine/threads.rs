//! `NCCL_BPF_IO=threads`: one helper thread per data stream, blocking I/O. A send helper is fed
//! chunks by a channel; a receive helper reads its stream's chunks as they come, and waits on
//! the channel only for a poke when a chunk's receive is not posted yet.
//!
//! Helpers start when a comm first carries a large message. If the OS refuses one (EAGAIN
//! under a pid or thread limit), the ones already started are stopped and joined and the comm
//! fails with a message naming the limit. A panic inside a helper is caught there: its chunk
//! fails, the stream and the comm with it, and the helper carries on failing later chunks.

use super::{Queue, QueueError, StreamCtx, Task};
use crossbeam_channel::{Receiver, Sender};
use shared_maps::ConnDirection;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;

/// What a comm tells a helper.
pub enum Msg {
    /// Send this chunk.
    Task(Task),
    /// The receive this stream waited for is posted.
    Poke,
}

pub struct Workers {
    txs: Vec<Sender<Msg>>,
    joins: Vec<JoinHandle<()>>,
    /// Closed once every helper has returned (each holds a clone of `alive_tx`).
    alive: Receiver<()>,
    alive_tx: Sender<()>,
}

impl Workers {
    /// One helper thread per stream. If one cannot be started, the streams are shut down, those
    /// already started are stopped and joined, and the reason comes back as a message.
    pub fn start(streams: Vec<StreamCtx>) -> Result<Workers, String> {
        let n = streams.len();
        let (alive_tx, alive) = crossbeam_channel::bounded(0);
        let mut workers = Workers {
            txs: Vec::with_capacity(n),
            joins: Vec::with_capacity(n),
            alive,
            alive_tx,
        };
        let sockets: Vec<_> = streams.iter().map(|c| Arc::clone(&c.stream)).collect();
        for (k, ctx) in streams.into_iter().enumerate() {
            let (tx, rx) = crossbeam_channel::unbounded();
            let (conn_id, dir) = (ctx.conn_id, ctx.direction);
            match spawn_helper(ctx, rx, workers.alive_tx.clone()) {
                Ok(join) => {
                    workers.txs.push(tx);
                    workers.joins.push(join);
                }
                Err(e) => {
                    // A receive helper may be in a blocking read already: end it. The comm
                    // fails for good with this error, so its streams are done with anyway.
                    for s in &sockets {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
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
            Some(tx) => tx.send(Msg::Task(task)).map_err(|e| match e.0 {
                Msg::Task(t) => t,
                Msg::Poke => unreachable!("send gives back what it was given"),
            }),
            None => Err(task),
        }
    }

    pub fn poke(&self, k: usize) {
        if let Some(tx) = self.txs.get(k) {
            let _ = tx.send(Msg::Poke);
        }
    }

    /// Ends every helper and waits for it. With its sender gone a helper finishes its queue and
    /// exits, so either the queues are empty or the streams were shut down first (any chunk
    /// still blocked in I/O then fails at once).
    ///
    /// The wait has no time limit (docs/io-engine.md, "When a request's buffer is ours"): a
    /// helper still running may still write into NCCL's buffer. Only a bug keeps one running on
    /// a shut-down stream; the wait then says so in the log every 30 s.
    pub fn stop(self) {
        drop(self.txs);
        // Each helper holds a sender of `alive` until it returns: the channel closes once all
        // have.
        drop(self.alive_tx);
        let mut waited = 0u64;
        while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
            self.alive.recv_timeout(STOP_WAIT)
        {
            waited += STOP_WAIT.as_secs();
            crate::nlog!(
                WARN,
                NET,
                "a helper thread of a closing connection has not ended after {waited} s; still \
                 waiting (NCCL's buffer may not be freed before)"
            );
        }
        for j in self.joins {
            // A helper catches its own panics (`run`); nothing to report here.
            let _ = j.join();
        }
    }
}

/// How often a closing comm says it is still waiting for a helper (see [`Workers::stop`]).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn spawn_helper(
    ctx: StreamCtx,
    rx: Receiver<Msg>,
    alive: Sender<()>,
) -> io::Result<JoinHandle<()>> {
    #[cfg(test)]
    if crate::comm::inject::spawn_fails(ctx.conn_id, ctx.index) {
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    std::thread::Builder::new()
        .name(ctx.name.clone())
        .spawn(move || {
            // Dropped as the helper returns, after its queue (and any claim) is gone.
            let _alive = alive;
            match ctx.direction {
                ConnDirection::Send => run_send(Queue::new(ctx), rx),
                ConnDirection::Recv => run_recv(Queue::new(ctx), rx),
            }
        })
}

/// Moves what the queue has until it has nothing to do now (`Ok`) or the stream stops (`Err`).
/// A panic is caught here (the release profile unwinds) and fails the stream like an error.
fn drive(q: &mut Queue) -> Result<(), ()> {
    let r = catch_unwind(AssertUnwindSafe(|| {
        loop {
            q.ctx.injected_panic();
            match q.move_once(true, usize::MAX) {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }));
    let why = match r {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(QueueError::Io(e)))
            if e.kind() == io::ErrorKind::UnexpectedEof && q.ended_cleanly() =>
        {
            return Err(());
        }
        Ok(Err(e)) => e.into_net(&q.ctx),
        Err(payload) => q.ctx.panic_error(&*payload),
    };
    q.fail(why);
    Err(())
}

/// Serves one send stream until its comm closes the channel.
///
/// Every chunk's pending count goes down exactly once, whatever happens to its I/O: an error
/// or a panic fails the request and the stream; later chunks are failed without I/O.
fn run_send(mut q: Queue, rx: Receiver<Msg>) {
    for msg in rx {
        let Msg::Task(task) = msg else { continue };
        if q.broken {
            q.ctx.abandon(task);
            continue;
        }
        q.tasks.push_back(task);
        let _ = drive(&mut q);
    }
}

/// Serves one receive stream: reads chunks until it must wait for a post (then for a poke),
/// the peer closes it, or it fails; returns once its comm closes the channel (the comm shuts
/// the stream down first, which ends a read in progress).
fn run_recv(mut q: Queue, rx: Receiver<Msg>) {
    loop {
        if drive(&mut q).is_ok() && q.has_work() {
            continue;
        }
        match rx.recv() {
            Ok(Msg::Poke) => {
                if let Some(r) = &mut q.reader {
                    r.waiting = false;
                }
            }
            Ok(Msg::Task(t)) => q.ctx.abandon(t),
            Err(_) => {
                q.abandon_all();
                return;
            }
        }
    }
}
