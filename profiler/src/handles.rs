//! Handles NCCL holds for us: generation-tagged slots in sharded tables.
//!
//! NCCL gives `stopEvent` and `recordEventState` nothing but the `void*` we returned from
//! `startEvent`, and may hand it back late, twice, after `finalize`, or never. So a handle is
//! never a pointer: it is a number that names a slot (shard and index) and the slot's
//! generation when the handle was issued. Every use looks the slot up under its shard's lock
//! and compares generations; a handle that does not match names nothing and is reported as
//! [`Miss::Stale`] (the slot was reused or freed: stopped twice, used after finalize) or
//! [`Miss::Unknown`] (no such slot: a forged or corrupted value). Nothing NCCL passes can make
//! us touch freed memory.
//!
//! Layout of a handle (never 0, so never NULL): bits 0-23 the index + 1, bits 24-29 the shard,
//! bits 30-31 the table's tag (so a context handle passed where an event handle belongs, or the
//! reverse, names nothing), bits 32-63 the generation (odd while the slot holds a value). Each thread starts its events
//! in its own shard (by thread id), so the proxy thread and the application's thread rarely
//! meet on a lock; a shard lock is held only for a lookup, an insert or a removal, never
//! across a call out of this crate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Shards per table.
pub const SHARDS: usize = 16;
const INDEX_BITS: u32 = 24;
const SHARD_SHIFT: u32 = 24;
const GEN_SHIFT: u32 = 32;
const TAG_SHIFT: u32 = 30;

/// A handle as NCCL stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(pub u64);

impl Handle {
    pub fn from_ptr(p: *mut std::ffi::c_void) -> Handle {
        Handle(p as usize as u64)
    }
    pub fn as_ptr(self) -> *mut std::ffi::c_void {
        self.0 as usize as *mut std::ffi::c_void
    }
    fn parts(self) -> (usize, usize, u32) {
        let index = (self.0 & ((1 << INDEX_BITS) - 1)) as usize;
        let shard = ((self.0 >> SHARD_SHIFT) & 0x3f) as usize;
        (shard, index.wrapping_sub(1), (self.0 >> GEN_SHIFT) as u32)
    }
    fn make(tag: u64, shard: usize, index: usize, generation: u32) -> Handle {
        Handle(
            ((generation as u64) << GEN_SHIFT)
                | (tag << TAG_SHIFT)
                | ((shard as u64) << SHARD_SHIFT)
                | (index as u64 + 1),
        )
    }
}

/// Why a handle named nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// NULL.
    Null,
    /// No slot of that number: not a handle we issued.
    Unknown,
    /// The slot was freed or reused since: stopped already, or its context was finalized.
    Stale(Freed),
}

/// How a slot was last freed (kept per slot, to word the report about a stale handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freed {
    /// By a stop (a second stop, or a use after stop).
    Stopped,
    /// By its context's finalize.
    Finalized,
    /// Reclaimed (too many pending, or the table's room was needed).
    Reclaimed,
}

struct Slot<T> {
    /// Odd while `value` is `Some`.
    generation: u32,
    value: Option<T>,
    freed: Freed,
}

struct Shard<T> {
    slots: Vec<Slot<T>>,
    free: Vec<usize>,
    live: usize,
}

/// A table of values that NCCL names by [`Handle`].
pub struct Table<T> {
    shards: Vec<Mutex<Shard<T>>>,
    /// Slots per shard at most.
    per_shard: usize,
    live: AtomicUsize,
    tag: u64,
}

fn thread_shard() -> usize {
    thread_local! {
        static SHARD: usize = {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
        };
    }
    SHARD.with(|s| *s)
}

impl<T> Table<T> {
    /// A table of at most `capacity` live values (rounded up to a multiple of [`SHARDS`]),
    /// whose handles carry `tag` (1, 2 or 3): tables with different tags never accept each
    /// other's handles.
    pub fn new(capacity: usize, tag: u64) -> Table<T> {
        assert!((1..=3).contains(&tag), "a table's tag is 1, 2 or 3");
        let per_shard = capacity.div_ceil(SHARDS).clamp(1, (1 << INDEX_BITS) - 2);
        Table {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        slots: Vec::new(),
                        free: Vec::new(),
                        live: 0,
                    })
                })
                .collect(),
            per_shard,
            live: AtomicUsize::new(0),
            tag,
        }
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard<T>> {
        // A panic while a shard is locked leaves consistent data (each operation is one
        // assignment), so a poisoned lock is used as it is.
        self.shards[shard]
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Stores `value`, in the calling thread's shard or, when that one is full, the next with
    /// room; the value back when every shard is full.
    pub fn insert(&self, value: T) -> Result<Handle, T> {
        let first = thread_shard();
        for k in 0..SHARDS {
            let s = (first + k) % SHARDS;
            let mut sh = self.lock(s);
            let index = match sh.free.pop() {
                Some(i) => i,
                None if sh.slots.len() < self.per_shard => {
                    sh.slots.push(Slot {
                        generation: 0,
                        value: None,
                        freed: Freed::Stopped,
                    });
                    sh.slots.len() - 1
                }
                None => continue,
            };
            let slot = &mut sh.slots[index];
            // Even → odd; generation 0 never names a live slot, so no handle is 0 in its top half
            // while the slot is live (and the low bits are never 0 either).
            slot.generation = slot.generation.wrapping_add(1) | 1;
            slot.value = Some(value);
            let h = Handle::make(self.tag, s, index, slot.generation);
            sh.live += 1;
            self.live.fetch_add(1, Ordering::Relaxed);
            return Ok(h);
        }
        Err(value)
    }

    fn check<'a>(
        &self,
        sh: &'a mut Shard<T>,
        index: usize,
        generation: u32,
    ) -> Result<&'a mut Slot<T>, Miss> {
        let slot = sh.slots.get_mut(index).ok_or(Miss::Unknown)?;
        if slot.generation == generation && slot.value.is_some() {
            Ok(slot)
        } else if generation & 1 == 1 && generation < slot.generation.wrapping_add(1) {
            Err(Miss::Stale(slot.freed))
        } else {
            Err(Miss::Unknown)
        }
    }

    fn locate(&self, h: Handle) -> Result<(usize, usize, u32), Miss> {
        if h.0 == 0 {
            return Err(Miss::Null);
        }
        let (shard, index, generation) = h.parts();
        if shard >= SHARDS || index >= self.per_shard || (h.0 >> TAG_SHIFT) & 3 != self.tag {
            return Err(Miss::Unknown);
        }
        Ok((shard, index, generation))
    }

    /// Runs `f` on the value `h` names, under its shard's lock (keep `f` short: no calls out).
    pub fn with<R>(&self, h: Handle, f: impl FnOnce(&mut T) -> R) -> Result<R, Miss> {
        let (shard, index, generation) = self.locate(h)?;
        let mut sh = self.lock(shard);
        let slot = self.check(&mut sh, index, generation)?;
        Ok(f(slot.value.as_mut().expect("checked live")))
    }

    /// Removes the value `h` names.
    pub fn remove(&self, h: Handle, why: Freed) -> Result<T, Miss> {
        let (shard, index, generation) = self.locate(h)?;
        let mut sh = self.lock(shard);
        let slot = self.check(&mut sh, index, generation)?;
        let v = slot.value.take().expect("checked live");
        slot.generation = slot.generation.wrapping_add(1) & !1;
        slot.freed = why;
        sh.free.push(index);
        sh.live -= 1;
        self.live.fetch_sub(1, Ordering::Relaxed);
        Ok(v)
    }

    /// Runs `f` on the value and removes it when `f` says so, under one lock.
    pub fn update_or_remove<R>(
        &self,
        h: Handle,
        why: Freed,
        f: impl FnOnce(&mut T) -> (bool, R),
    ) -> Result<(Option<T>, R), Miss> {
        let (shard, index, generation) = self.locate(h)?;
        let mut sh = self.lock(shard);
        let slot = self.check(&mut sh, index, generation)?;
        let (remove, r) = f(slot.value.as_mut().expect("checked live"));
        if !remove {
            return Ok((None, r));
        }
        let v = slot.value.take();
        slot.generation = slot.generation.wrapping_add(1) & !1;
        slot.freed = why;
        sh.free.push(index);
        sh.live -= 1;
        self.live.fetch_sub(1, Ordering::Relaxed);
        Ok((v, r))
    }

    /// Removes every value `pred` selects (one shard locked at a time) and returns them.
    pub fn drain_where(&self, why: Freed, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for s in 0..SHARDS {
            let mut sh = self.lock(s);
            let mut freed = Vec::new();
            for (i, slot) in sh.slots.iter_mut().enumerate() {
                if slot.value.as_ref().is_some_and(&mut pred) {
                    out.extend(slot.value.take());
                    slot.generation = slot.generation.wrapping_add(1) & !1;
                    slot.freed = why;
                    freed.push(i);
                }
            }
            sh.live -= freed.len();
            self.live.fetch_sub(freed.len(), Ordering::Relaxed);
            sh.free.extend(freed);
        }
        out
    }

    /// Live values.
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live values, counted shard by shard under their locks (for tests: [`len`](Self::len)
    /// is the same number kept without locks).
    pub fn count_locked(&self) -> usize {
        (0..SHARDS).map(|s| self.lock(s).live).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_names_its_value_until_removed_and_never_after() {
        let t: Table<u32> = Table::new(64, 1);
        let h = t.insert(7).unwrap();
        assert_ne!(h.0, 0);
        assert_eq!(t.with(h, |v| *v), Ok(7));
        assert_eq!(t.remove(h, Freed::Stopped), Ok(7));
        assert_eq!(t.with(h, |v| *v), Err(Miss::Stale(Freed::Stopped)));
        assert_eq!(
            t.remove(h, Freed::Stopped),
            Err(Miss::Stale(Freed::Stopped))
        );
        // The slot is reused by the next insert from this thread; the old handle still misses.
        let h2 = t.insert(8).unwrap();
        assert_ne!(h, h2);
        assert_eq!(t.with(h, |v| *v), Err(Miss::Stale(Freed::Stopped)));
        assert_eq!(t.with(h2, |v| *v), Ok(8));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn forged_handles_miss() {
        let t: Table<u32> = Table::new(64, 1);
        let h = t.insert(1).unwrap();
        for bad in [
            0u64,
            1,
            u64::MAX,
            h.0 ^ (1 << 32) ^ (1 << 33), // a later generation
            h.0 + 1,                     // the next index, never used
            h.0 | (0x3f << 24),          // a shard that does not exist
            h.0 ^ (3 << 30),             // another table's tag
            0xdead_beef,
            &t as *const _ as u64, // a pointer
        ] {
            let r = t.with(Handle(bad), |v| *v);
            assert!(r.is_err(), "{bad:#x} named {r:?}");
        }
        assert_eq!(t.with(Handle(0), |v| *v), Err(Miss::Null));
        // The same slot of a table with another tag.
        let other: Table<u32> = Table::new(64, 2);
        let oh = other.insert(5).unwrap();
        assert_eq!(t.with(oh, |v| *v), Err(Miss::Unknown));
        assert_eq!(other.with(h, |v| *v), Err(Miss::Unknown));
        assert_eq!(t.with(h, |v| *v), Ok(1));
    }

    #[test]
    fn a_full_table_refuses_and_recovers() {
        let t: Table<usize> = Table::new(SHARDS * 2, 1);
        let hs: Vec<_> = (0..SHARDS * 2).map(|i| t.insert(i).unwrap()).collect();
        assert_eq!(t.insert(99), Err(99));
        t.remove(hs[5], Freed::Stopped).unwrap();
        assert!(t.insert(100).is_ok());
        assert_eq!(t.len(), SHARDS * 2);
    }

    #[test]
    fn drain_frees_what_it_selects_and_marks_it() {
        let t: Table<u32> = Table::new(64, 1);
        let a = t.insert(1).unwrap();
        let b = t.insert(2).unwrap();
        let got = t.drain_where(Freed::Finalized, |v| *v == 1);
        assert_eq!(got, vec![1]);
        assert_eq!(t.with(a, |v| *v), Err(Miss::Stale(Freed::Finalized)));
        assert_eq!(t.with(b, |v| *v), Ok(2));
        assert_eq!(t.len(), 1);
        assert_eq!(t.count_locked(), 1);
    }

    #[test]
    fn many_threads_insert_and_remove_without_losing_count() {
        let t: std::sync::Arc<Table<u64>> = std::sync::Arc::new(Table::new(1 << 12, 1));
        let threads: Vec<_> = (0..8)
            .map(|k| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let h = t.insert(k * 10_000 + i).unwrap();
                        assert_eq!(t.with(h, |v| *v), Ok(k * 10_000 + i));
                        assert_eq!(t.remove(h, Freed::Stopped), Ok(k * 10_000 + i));
                        assert!(t.remove(h, Freed::Stopped).is_err());
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.len(), 0);
        assert_eq!(t.count_locked(), 0);
    }
}
