//! The records a process holds, by communicator and epoch, each once.
//!
//! Records are flooded (every rank forwards what it has not seen on every connection it has),
//! so the same record arrives several times; the board keeps the first and tells the caller
//! whether it was new, which is what decides whether it is forwarded. Memory is bounded: a
//! communicator keeps [`EPOCHS_KEPT`] epochs, an epoch at most [`MAX_ORIGINS`] records, the
//! board at most [`MAX_COMMS`] communicators (the least recently touched goes first). Records
//! of epochs below a communicator's floor (already combined and dropped) are refused as stale
//! and never forwarded again, so a record cannot circle the ranks for ever.

use crate::record::Record;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// Epochs a communicator keeps.
pub const EPOCHS_KEPT: usize = 64;
/// Records an epoch keeps (ranks of one communicator).
pub const MAX_ORIGINS: usize = 65_536;
/// Communicators the board keeps.
pub const MAX_COMMS: usize = 1024;
/// Records the board keeps in all (about 200 bytes each with 4 words: some 50 MB at most,
/// whatever peers send). Beyond it a new record is refused, except one of this process's own.
pub const MAX_RECORDS: usize = 262_144;
/// Epochs kept below the oldest one a local context still needs (late copies of them are then
/// recognised as duplicates rather than new).
const KEEP_BELOW_DONE: u64 = 8;
/// How far past the epoch its slowest local context needs a communicator's records may be: a
/// rank waits for the others' records of epoch b − D at b, so no rank gets more than D epochs
/// ahead of another (D ≤ [`crate::MAX_DELAY`]); records further ahead are refused, so that a
/// broken or hostile peer cannot fill the board with far epochs.
const AHEAD: u64 = 2 * crate::MAX_DELAY + 4;

/// What became of a record offered to the board.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insert {
    /// First seen: kept (and to be forwarded).
    New,
    /// Already held.
    Duplicate,
    /// Its epoch is gone (combined and dropped), or the epoch is full.
    Stale,
}

impl CommBoard {
    fn count(&self) -> usize {
        self.epochs.values().map(|e| e.records.len()).sum()
    }
}

#[derive(Default)]
struct CommBoard {
    epochs: BTreeMap<u64, Epoch>,
    /// Epochs below are gone.
    floor: u64,
    touched: u64,
    /// This process's contexts of the communicator (origin) and the oldest epoch each still
    /// needs. Epochs are dropped only below all of them (and never while one needs them).
    locals: BTreeMap<u64, u64>,
}

impl CommBoard {
    fn needed(&self) -> Option<u64> {
        self.locals.values().copied().min()
    }
}

#[derive(Default)]
struct Epoch {
    records: BTreeMap<u64, Record>,
    /// When a record of ours (posted here) entered, and when the epoch first held as many
    /// records as the communicator has ranks.
    posted: Option<Instant>,
    complete: Option<Instant>,
}

#[derive(Default)]
pub struct Board {
    comms: HashMap<u64, CommBoard>,
    clock: u64,
    records: usize,
}

impl Board {
    /// Offers `r`; `own` if it was made in this process (its time starts the latency clock).
    pub fn insert(&mut self, r: Record, own: bool) -> Insert {
        self.clock += 1;
        let clock = self.clock;
        if self.records >= MAX_RECORDS && !own {
            return Insert::Stale;
        }
        if !self.comms.contains_key(&r.comm_id) && self.comms.len() >= MAX_COMMS {
            let oldest = self
                .comms
                .iter()
                .min_by_key(|(_, c)| c.touched)
                .map(|(k, _)| *k);
            if let Some(k) = oldest
                && let Some(c) = self.comms.remove(&k)
            {
                self.records -= c.count();
            }
        }
        let c = self.comms.entry(r.comm_id).or_default();
        c.touched = clock;
        if r.epoch < c.floor {
            return Insert::Stale;
        }
        if let Some(need) = c.needed()
            && r.epoch > need.saturating_add(AHEAD)
        {
            return Insert::Stale;
        }
        if !c.epochs.contains_key(&r.epoch) && c.epochs.len() >= EPOCHS_KEPT {
            if c.needed().is_some() {
                // A communicator of this process: its epochs go only as its contexts move on.
                return Insert::Stale;
            }
            // Only forwarded here: the oldest epoch goes (and with it every older one).
            if let Some((&low, _)) = c.epochs.iter().next() {
                if r.epoch < low {
                    return Insert::Stale;
                }
                if let Some(gone) = c.epochs.remove(&low) {
                    self.records -= gone.records.len();
                }
                c.floor = c.floor.max(low + 1);
            }
        }
        let e = c.epochs.entry(r.epoch).or_default();
        if e.records.contains_key(&r.origin) {
            return Insert::Duplicate;
        }
        if e.records.len() >= MAX_ORIGINS {
            return Insert::Stale;
        }
        let now = Instant::now();
        if own && e.posted.is_none() {
            e.posted = Some(now);
        }
        let nranks = r.nranks as usize;
        e.records.insert(r.origin, r);
        self.records += 1;
        if e.complete.is_none() && e.records.len() >= nranks {
            e.complete = Some(now);
        }
        Insert::New
    }

    /// The records of `epoch` of `comm`, by origin.
    pub fn records(&self, comm: u64, epoch: u64) -> Option<&BTreeMap<u64, Record>> {
        self.comms
            .get(&comm)?
            .epochs
            .get(&epoch)
            .map(|e| &e.records)
    }

    /// Time from this process's record to the epoch's last, once both are known.
    pub fn latency(&self, comm: u64, epoch: u64) -> Option<std::time::Duration> {
        let e = self.comms.get(&comm)?.epochs.get(&epoch)?;
        Some(e.complete?.saturating_duration_since(e.posted?))
    }

    /// A context of this process (`origin`) of `comm` needs epochs from `next` on (from 0 when
    /// it starts); epochs well below what every local context needs can go.
    pub fn needs(&mut self, comm: u64, origin: u64, next: u64) {
        let c = self.comms.entry(comm).or_default();
        c.locals.insert(origin, next);
        self.prune(comm);
    }

    /// The context `origin` of `comm` ended.
    pub fn leave(&mut self, comm: u64, origin: u64) {
        if let Some(c) = self.comms.get_mut(&comm) {
            c.locals.remove(&origin);
            self.prune(comm);
        }
    }

    fn prune(&mut self, comm: u64) {
        if let Some(c) = self.comms.get_mut(&comm) {
            let Some(need) = c.needed() else { return };
            let floor = need.saturating_sub(KEEP_BELOW_DONE);
            if floor > c.floor {
                c.floor = floor;
                let kept = c.epochs.split_off(&floor);
                let gone: usize = c.epochs.values().map(|e| e.records.len()).sum();
                c.epochs = kept;
                self.records -= gone;
            }
        }
    }

    /// Every record held, oldest epoch first (for a connection that opens late).
    pub fn all(&self) -> impl Iterator<Item = &Record> {
        self.comms
            .values()
            .flat_map(|c| c.epochs.values().flat_map(|e| e.records.values()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(comm: u64, origin: u64, epoch: u64, nranks: u32) -> Record {
        crate::record::test_record(comm, origin, epoch, nranks)
    }

    #[test]
    fn each_record_is_new_once() {
        let mut b = Board::default();
        assert_eq!(b.insert(rec(1, 10, 0, 2), true), Insert::New);
        assert_eq!(b.insert(rec(1, 10, 0, 2), false), Insert::Duplicate);
        assert_eq!(
            b.insert(rec(2, 10, 0, 2), false),
            Insert::New,
            "another comm"
        );
        assert_eq!(b.insert(rec(1, 11, 0, 2), false), Insert::New);
        assert_eq!(b.records(1, 0).unwrap().len(), 2);
        assert!(b.latency(1, 0).is_some(), "complete with 2 of 2");
        assert!(b.latency(2, 0).is_none(), "no record of ours there");
    }

    #[test]
    fn combined_epochs_go_and_their_late_copies_are_stale() {
        let mut b = Board::default();
        for e in 0..20 {
            b.insert(rec(1, 10, e, 1), true);
        }
        b.needs(1, 10, 19);
        assert!(b.records(1, 5).is_none());
        assert!(b.records(1, 11).is_some());
        assert_eq!(b.insert(rec(1, 99, 3, 1), false), Insert::Stale);
        assert_eq!(b.insert(rec(1, 10, 12, 1), false), Insert::Duplicate);
    }

    #[test]
    fn memory_is_bounded_by_epochs_and_communicators() {
        let mut b = Board::default();
        for e in 0..(EPOCHS_KEPT as u64 + 10) {
            b.insert(rec(1, 10, e, 1), false);
        }
        assert_eq!(b.comms[&1].epochs.len(), EPOCHS_KEPT);
        assert_eq!(b.insert(rec(1, 10, 0, 1), false), Insert::Stale);
        for c in 0..(MAX_COMMS as u64 + 5) {
            b.insert(rec(100 + c, 1, 0, 1), false);
        }
        assert_eq!(b.comms.len(), MAX_COMMS);
        let held: usize = b.comms.values().map(CommBoard::count).sum();
        assert_eq!(b.records, held, "the total follows every removal");
    }

    #[test]
    fn an_epoch_a_local_context_still_needs_is_never_dropped() {
        let mut b = Board::default();
        // Two contexts of one communicator in this process, far apart (D up to MAX_DELAY).
        b.needs(1, 100, 0);
        b.needs(1, 200, 0);
        for e in 0..30 {
            assert_eq!(b.insert(rec(1, 7, e, 2), false), Insert::New, "epoch {e}");
        }
        b.needs(1, 200, 30); // the fast one moved on
        assert!(
            b.records(1, 0).is_some(),
            "the slow one still needs epoch 0"
        );
        b.needs(1, 100, 25);
        assert!(b.records(1, 16).is_none() && b.records(1, 17).is_some());
        b.leave(1, 100);
        assert!(b.records(1, 21).is_none() && b.records(1, 22).is_some());
    }

    #[test]
    fn far_epochs_of_a_local_communicator_are_refused_not_kept() {
        let mut b = Board::default();
        b.needs(1, 100, 5);
        assert_eq!(b.insert(rec(1, 7, 5 + AHEAD, 2), false), Insert::New);
        assert_eq!(b.insert(rec(1, 7, 6 + AHEAD, 2), false), Insert::Stale);
        assert_eq!(b.insert(rec(1, 7, u64::MAX, 2), false), Insert::Stale);
        // The honest record of the needed epoch still goes in.
        assert_eq!(b.insert(rec(1, 8, 5, 2), false), Insert::New);
    }

    #[test]
    fn the_total_is_bounded_whatever_peers_send() {
        let mut b = Board::default();
        let mut n = 0u64;
        // Many origins in few epochs of few comms: only the total bounds this.
        while b.records < MAX_RECORDS {
            b.insert(rec(n % 4, n, n % 8, 1_000_000), false);
            n += 1;
        }
        assert_eq!(b.insert(rec(1, u64::MAX, 1, 2), false), Insert::Stale);
        assert_eq!(
            b.insert(rec(1, u64::MAX, 1, 2), true),
            Insert::New,
            "our own still go in"
        );
    }
}
