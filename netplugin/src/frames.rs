//! Carrying the agreement's records (`ncclbpf-agreement`) over this process's connections.
//!
//! Every live comm is listed here from creation to drop. The agreement's mover thread (in
//! `ncclbpf-agreement`, running while some tuner context of the process runs the agreement)
//! calls [`send`] with every outgoing record (this process's own, and those it received for the
//! first time), which writes it on every send comm, and [`receive`], which takes the frames that
//! arrived on every receive comm and hands them to the exchange (new records are queued to be
//! forwarded). So a record reaches every rank that the processes' connections link, in N-1 hops
//! around a ring; the node-local relay of `ncclbpf-agreement` covers the hops NCCL makes over
//! P2P/SHM. A send comm that opens after records were sent first gets every record the board
//! holds.

use crate::comm::Comm;
use ncclbpf_agreement as agreement;
use shared_maps::ConnDirection;
use std::sync::{Arc, Mutex, MutexGuard};

/// Live comms (pointers into their `Box`, which does not move). An entry is removed in
/// `Comm::drop` before anything of the comm is torn down, under this lock, so whoever holds the
/// lock may use every comm listed.
static COMMS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn comms() -> MutexGuard<'static, Vec<usize>> {
    COMMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lists a new comm (its final address); a send comm gets the records already held.
pub fn register(comm: &Comm) {
    comms().push(comm as *const Comm as usize);
    agreement::set_net(agreement::Net { send, receive });
    if comm.direction == ConnDirection::Send && agreement::active() {
        send_on(comm, &agreement::backlog());
    }
}

/// Unlists a comm (from its `Drop`, before it is torn down).
pub fn unregister(comm: &Comm) {
    let me = comm as *const Comm as usize;
    comms().retain(|&c| c != me);
}

fn each(dir: ConnDirection, mut f: impl FnMut(&Comm)) {
    let list = comms();
    for &c in list.iter() {
        // SAFETY: listed comms are alive while the list's lock is held (see `COMMS`).
        let comm = unsafe { &*(c as *const Comm) };
        if comm.direction == dir {
            f(comm);
        }
    }
}

fn send_on(comm: &Comm, frames: &[Arc<[u8]>]) {
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

/// Writes `frames` on every send comm (and what is still queued there).
fn send(frames: &[Arc<[u8]>]) {
    each(ConnDirection::Send, |c| {
        if frames.is_empty() {
            c.flush_frames();
        } else {
            send_on(c, frames);
        }
    });
}

/// Hands the frames that arrived on every receive comm to the exchange.
fn receive() {
    each(ConnDirection::Recv, |c| {
        let (frames, dropped) = c.take_frames();
        if dropped > 0 {
            crate::nlog!(
                WARN,
                NET,
                "connection {:#018x}: {dropped} control frame(s) dropped (inbox full)",
                c.conn_id
            );
        }
        for f in frames {
            if let agreement::Delivered::Bad(e) = agreement::deliver(&f) {
                crate::nlog!(
                    WARN,
                    NET,
                    "connection {:#018x}: {e}; frame ignored",
                    c.conn_id
                );
            }
        }
    });
}
