//! Carrying the agreement's records (`ncclbpf-agreement`) over this process's connections.
//!
//! Every live comm is listed here from creation to drop. While some tuner context of the
//! process runs the agreement ([`agreement::active`]), a thread of ours moves control frames:
//! it writes every outgoing record (this process's own, and those it received for the first
//! time) on every send comm, reads the frames that arrived on every receive comm, and hands
//! them to the exchange, which keeps new records and queues them to be forwarded. So a record
//! reaches every rank that the processes' connections link, in N-1 hops around a ring.
//!
//! The thread parks on the exchange's outbox (1 ms at most, so frames that arrive while NCCL's
//! proxy is idle are read within about a millisecond; a frame read inside NCCL's own call wakes
//! it at once); a rank that waits for records also runs [`pump`] itself. It runs only while a
//! tuner context runs the agreement and some comm is listed: it exits when the last comm goes
//! or the last such context ends, and starts again with the next (a process without the
//! agreement never has it).
//! A send comm that opens after records were sent first gets every record the board holds.

use crate::comm::Comm;
use ncclbpf_agreement as agreement;
use shared_maps::ConnDirection;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

struct Registry {
    /// Live comms (pointers into their `Box`, which does not move). An entry is removed in
    /// `Comm::drop` before anything of the comm is torn down, under this lock, so whoever holds
    /// the lock may use every comm listed.
    comms: Vec<usize>,
    thread: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    comms: Vec::new(),
    thread: false,
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lists a new comm (its final address); a send comm gets the records already held.
pub fn register(comm: &Comm) {
    registry().comms.push(comm as *const Comm as usize);
    agreement::set_pump(pump);
    agreement::set_starter(start);
    start();
    if comm.direction == ConnDirection::Send && agreement::active() {
        send_all(comm, &agreement::backlog());
    }
}

/// Starts the mover if the agreement runs, comms are listed and it is not running (a process
/// without the agreement never has it).
fn start() {
    if !agreement::active() {
        return;
    }
    {
        let mut r = registry();
        if r.thread || r.comms.is_empty() {
            return;
        }
        r.thread = true;
    }
    if let Err(e) = std::thread::Builder::new()
        .name("ncclbpf agree".into())
        .spawn(run)
    {
        registry().thread = false;
        crate::nlog!(
            WARN,
            NET,
            "cannot start the agreement's thread ({e}): records move only inside NCCL's own calls and while a rank waits"
        );
    }
}

/// Unlists a comm (from its `Drop`, before it is torn down).
pub fn unregister(comm: &Comm) {
    let me = comm as *const Comm as usize;
    registry().comms.retain(|&c| c != me);
}

fn send_all(comm: &Comm, frames: &[Arc<[u8]>]) {
    let mut bytes = 0;
    let mut sent = 0;
    for f in frames {
        // A failed comm reports to NCCL on its next call; the record still goes on the others.
        if comm.send_frame(f).is_ok() {
            bytes += f.len() as u64;
            sent += 1;
        }
    }
    if sent > 0 {
        agreement::note_sent(sent, bytes);
    }
}

/// Moves frames now: outgoing records onto every send comm, arrived frames into the exchange
/// (whose new records go out again at once).
pub fn pump() {
    pump_with(agreement::take_outgoing());
}

fn pump_with(mut out: Vec<Arc<[u8]>>) {
    // New records found here are forwarded in the same call; a bound keeps a flood of
    // distinct records from holding the registry.
    for _ in 0..4 {
        let r = registry();
        for &c in &r.comms {
            // SAFETY: listed comms are alive while the registry lock is held (see `Registry`).
            let comm = unsafe { &*(c as *const Comm) };
            match comm.direction {
                ConnDirection::Send => {
                    if out.is_empty() {
                        comm.flush_frames();
                    } else {
                        send_all(comm, &out);
                    }
                }
                ConnDirection::Recv => {
                    let (frames, dropped) = comm.take_frames();
                    if dropped > 0 {
                        crate::nlog!(
                            WARN,
                            NET,
                            "connection {:#018x}: {dropped} control frame(s) dropped (inbox full)",
                            comm.conn_id
                        );
                    }
                    for f in frames {
                        if let agreement::Delivered::Bad(e) = agreement::deliver(&f) {
                            crate::nlog!(
                                WARN,
                                NET,
                                "connection {:#018x}: {e}; frame ignored",
                                comm.conn_id
                            );
                        }
                    }
                }
            }
        }
        drop(r);
        out = agreement::take_outgoing();
        if out.is_empty() {
            return;
        }
    }
    // Whatever is left goes out on the thread's next round.
    agreement::requeue(out);
}

fn run() {
    loop {
        {
            // Decided under the lock that `start` checks, so a start never finds it set by a
            // thread that is leaving.
            let mut r = registry();
            if r.comms.is_empty() || !agreement::active() {
                r.thread = false;
                return;
            }
        }
        let out = agreement::wait_outgoing(Duration::from_millis(1));
        // A panic here must not take the host process down: the thread ends (logged) and the
        // next registration starts another.
        if let Err(p) = std::panic::catch_unwind(|| pump_with(out)) {
            registry().thread = false;
            crate::nlog!(
                WARN,
                NET,
                "the agreement's thread stopped on a panic: {}",
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default()
            );
            return;
        }
    }
}
