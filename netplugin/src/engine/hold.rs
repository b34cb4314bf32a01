//! Test builds only: holds a data stream's server at the one moment the request-buffer
//! invariant is about (docs/io-engine.md, "When a request's buffer is ours"): it has a
//! request's buffer in hand (a claimed receive, or a send's chunk) and is about to hand it to the
//! kernel (`recvmsg`/`sendmsg`, or an io_uring request). A stopped thread or a busy scheduler
//! does the same in production; here a test decides when the server goes on, so races that
//! happen in 1 of 30 runs happen every time, on every path.
//!
//! A gate is armed for one stream (connection id, stream index) and fires once: the server that
//! reaches it first waits there until the test opens it (or 30 s pass, so a failing test never
//! hangs the pool's worker for good). The shipped library has no such switch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct Gate {
    conn: u64,
    stream: usize,
    /// A server is waiting at the gate.
    arrived: bool,
    open: bool,
}

static GATES: Mutex<Vec<Gate>> = Mutex::new(Vec::new());
/// Per watched connection: how many times a server handed one of its request buffers to the
/// kernel.
static TOUCHES: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);
/// Gates ever armed and connections ever watched (it never falls): while 0, [`reached`]
/// returns at once, so tests that use neither pay one atomic load per I/O.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static CHANGED: Condvar = Condvar::new();
/// The longest a server waits at a gate nobody opens.
const MAX_HOLD: Duration = Duration::from_secs(30);

fn gates() -> MutexGuard<'static, Vec<Gate>> {
    GATES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts, from now on, every time a server of connection `conn` hands a request's buffer to
/// the kernel ([`touches`]).
pub fn watch(conn: u64) {
    ACTIVE.fetch_add(1, Ordering::SeqCst);
    TOUCHES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(conn, 0);
}

/// How many times a server of watched connection `conn` handed a request's buffer to the
/// kernel so far.
pub fn touches(conn: u64) -> u64 {
    TOUCHES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&conn).copied())
        .unwrap_or(0)
}

/// Arms a gate for stream `stream` of connection `conn`.
pub fn arm(conn: u64, stream: usize) {
    ACTIVE.fetch_add(1, Ordering::SeqCst);
    gates().push(Gate {
        conn,
        stream,
        arrived: false,
        open: false,
    });
}

/// Waits up to `within` for a server to reach the armed gate; whether one did.
pub fn wait_arrived(conn: u64, stream: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut g = gates();
    loop {
        match g.iter().find(|x| x.conn == conn && x.stream == stream) {
            Some(x) if x.arrived => return true,
            // Fired and gone (opened before the server came back): it did arrive.
            None => return true,
            Some(_) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        g = CHANGED
            .wait_timeout(g, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Lets the server held at the gate go on (or, if none came yet, disarms the gate).
pub fn open(conn: u64, stream: usize) {
    let mut g = gates();
    if let Some(x) = g.iter_mut().find(|x| x.conn == conn && x.stream == stream) {
        x.open = true;
        if !x.arrived {
            g.retain(|x| !(x.conn == conn && x.stream == stream));
        }
    }
    CHANGED.notify_all();
}

/// Called by a stream's server with a request's buffer in hand, just before its I/O: waits
/// while the stream's gate is armed and closed.
pub fn reached(conn: u64, stream: usize) {
    if ACTIVE.load(Ordering::SeqCst) == 0 {
        return;
    }
    wait_at_gate(conn, stream);
    // Counted as the server goes on to its I/O.
    if let Some(n) = TOUCHES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|m| m.get_mut(&conn))
    {
        *n += 1;
    }
}

fn wait_at_gate(conn: u64, stream: usize) {
    let mut g = gates();
    let Some(x) = g
        .iter_mut()
        .find(|x| x.conn == conn && x.stream == stream && !x.arrived)
    else {
        return;
    };
    x.arrived = true;
    CHANGED.notify_all();
    let deadline = Instant::now() + MAX_HOLD;
    loop {
        let open = g
            .iter()
            .find(|x| x.conn == conn && x.stream == stream)
            .is_none_or(|x| x.open);
        let left = deadline.saturating_duration_since(Instant::now());
        if open || left.is_zero() {
            break;
        }
        g = CHANGED
            .wait_timeout(g, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    g.retain(|x| !(x.conn == conn && x.stream == stream));
    CHANGED.notify_all();
}
