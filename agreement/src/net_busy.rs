//! Per communicator, how long its net connections had a request in flight: the net side's
//! measure of an epoch, for the tuner's agreement (`tuner/epoch`'s `net_busy_*_ns`).
//!
//! The net plugin (v11+, where NCCL names the communicator in `init`) gives every connection
//! end of a communicator the same [`BusyClock`], keyed by the communicator's hash — the id the
//! tuner's `init` gets too. A request posted starts the clock when none was in flight; the
//! last one completing (or failing, or its connection closing) stops it. The total is the
//! time the network was busy for the communicator: what its collectives took on the wire,
//! without the host's time between them (an application's compute, a benchmark's checks),
//! which the epoch's wall time holds and which dilutes what the choice changes.
//!
//! Lock-free on the data path: a post or a completion is one atomic add, and reads the clock
//! only when it starts or stops the busy interval. Posts and completions of one communicator
//! come from NCCL's proxy thread; where two threads race a start against a stop, the interval
//! may come out a little short, never negative.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

/// The busy time of one communicator's connections in this process.
#[derive(Debug, Default)]
pub struct BusyClock {
    /// Requests in flight on any of the communicator's connections.
    inflight: AtomicU64,
    /// When the current busy interval began (ns since [`origin`]), while `inflight > 0`.
    since: AtomicU64,
    /// Busy time of the intervals that ended (ns).
    total: AtomicU64,
}

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    origin().elapsed().as_nanos() as u64
}

impl BusyClock {
    /// A request was posted.
    #[inline]
    pub fn start(&self) {
        if self.inflight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.since.store(now_ns(), Ordering::Release);
        }
    }

    /// A request ended (completed, failed, or dropped with its connection). One more end
    /// than starts is ignored.
    #[inline]
    pub fn end(&self) {
        let prev = self
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if prev == Ok(1) {
            let since = self.since.load(Ordering::Acquire);
            self.total
                .fetch_add(now_ns().saturating_sub(since), Ordering::AcqRel);
        }
    }

    /// Busy time so far (ns), the interval in progress included.
    pub fn busy_ns(&self) -> u64 {
        let total = self.total.load(Ordering::Acquire);
        if self.inflight.load(Ordering::Acquire) == 0 {
            return total;
        }
        let since = self.since.load(Ordering::Acquire);
        total + now_ns().saturating_sub(since)
    }

    /// Requests in flight.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Acquire)
    }
}

/// Clocks by communicator hash; an entry lives while a connection or a tuner context holds it.
fn clocks() -> std::sync::MutexGuard<'static, HashMap<u64, Weak<BusyClock>>> {
    static CLOCKS: OnceLock<Mutex<HashMap<u64, Weak<BusyClock>>>> = OnceLock::new();
    CLOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The clock of communicator `comm_id` (created on first use); `None` for 0, the id of a
/// connection whose NCCL named no communicator (net v7–v10).
pub fn clock(comm_id: u64) -> Option<Arc<BusyClock>> {
    if comm_id == 0 {
        return None;
    }
    let mut m = clocks();
    if let Some(c) = m.get(&comm_id).and_then(Weak::upgrade) {
        return Some(c);
    }
    // Communicators come and go: forget those nobody holds any more.
    m.retain(|_, w| w.strong_count() > 0);
    let c = Arc::new(BusyClock::default());
    m.insert(comm_id, Arc::downgrade(&c));
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn overlapping_requests_count_once_and_gaps_not_at_all() {
        let c = BusyClock::default();
        c.start();
        c.start(); // a second in flight: the same interval
        std::thread::sleep(Duration::from_millis(20));
        c.end();
        assert_eq!(c.inflight(), 1);
        std::thread::sleep(Duration::from_millis(20));
        c.end();
        let busy = c.busy_ns();
        assert!((40_000_000..200_000_000).contains(&busy), "{busy}");
        // Idle: nothing accrues.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(c.busy_ns(), busy);
        // A read during an interval includes it so far.
        c.start();
        std::thread::sleep(Duration::from_millis(10));
        let mid = c.busy_ns();
        assert!(mid >= busy + 10_000_000, "{mid} vs {busy}");
        c.end();
        assert!(c.busy_ns() >= mid);
    }

    #[test]
    fn an_unmatched_end_is_ignored() {
        let c = BusyClock::default();
        c.end();
        assert_eq!((c.inflight(), c.busy_ns()), (0, 0));
        c.start();
        c.end();
        c.end();
        assert_eq!(c.inflight(), 0);
    }

    #[test]
    fn one_clock_per_communicator_while_held() {
        assert!(clock(0).is_none(), "no communicator, no clock");
        let a = clock(0x5eed_0001).unwrap();
        let b = clock(0x5eed_0001).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let other = clock(0x5eed_0002).unwrap();
        assert!(!Arc::ptr_eq(&a, &other));
        a.start();
        drop((a, b));
        // Nobody holds it: a new one starts from nothing.
        let c = clock(0x5eed_0001).unwrap();
        assert_eq!(c.inflight(), 0);
    }
}
