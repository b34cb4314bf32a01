//! Per-collective figures in shared memory: the `ncclbpf_collectives` map, which the in-process
//! endpoint (`NCCL_BPF_METRICS_ADDR`) and `ncclbpf exporter` render as Prometheus metrics
//! (`metrics/src/collect.rs`), also while the process is stuck.
//!
//! # The map
//!
//! A hash map created by the plugin, listed in the registry like every map. Key, 16 bytes: the
//! communicator id (`u64`), the rank (`u32`) and the bucket (`u32`) =
//! `tag << 16 | ((func × 41 + size) × 8 + algo + 1) × 4 + proto + 1`, all little-endian: `func`
//! NCCL's `ncclFunc_t` (15 any other), `size` the [size bucket](crate::collective::size_bucket)
//! of the operation's bytes, `algo` and `proto` NCCL's numbers (-1 unknown), `tag` the user
//! tag's slot ([`tag_slot`]: 0 untagged, 1 … [`MAX_TAGS`] the first distinct tags the process
//! saw, [`TAG_OTHER`] every later one). Value: [`WORDS`] little-endian `u64`:
//!
//! | word | content |
//! |---|---|
//! | 0 | format, [`FORMAT`] (1) |
//! | 1 | operations timed (with GPU execution time) |
//! | 2 | their execution time summed, ns |
//! | 3 | their bytes summed |
//! | 4 | their bus bytes summed (bytes × nccl-tests' bus factor) |
//! | 5, 6 | shortest and longest execution time, ns (`u64::MAX`, 0 before the first) |
//! | 7 | operations counted without a time (KernelCh events masked out or missing) |
//! | 8 | ranks of the communicator |
//! | 9 | flags: 1 the communicator was finalized |
//! | 10 + i | timed operations whose time is at most [`bound_ns`]`(i)`, not cumulative; the last, i = [`HIST`] − 1, above every bound |
//! | 36 | the user tag of the entry's slot (0 untagged, `u64::MAX` for [`TAG_OTHER`]) |
//!
//! User tags (profiler v7, NCCL 2.31+: a per-call `u64` the application sets in its
//! collective config) are a label of unbounded cardinality; each process gives its own
//! entries to the first [`MAX_TAGS`] distinct tags only, and counts every later tag under
//! one "other" slot, so a tag per step or per layer cannot fill the map. Format 1 (36 words,
//! no tag) was this map before the user tag.
//!
//! Every word is written with relaxed atomic adds (or min/max), so several threads of NCCL may
//! complete operations of one communicator at once; a reader sees each word as it is.
//! [`MAX_ENTRIES`] entries per process; when full, entries of finalized communicators make
//! room, and an operation with no entry is counted in the process's `stats_dropped`.

use shared_maps::{BPF_NOEXIST, Map, MapError, MapSpec, MapType, Registry};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub const MAP_NAME: &str = "ncclbpf_collectives";
pub const FORMAT: u64 = 2;
/// Histogram buckets: bounds 1 µs × 2^i for i = 0 … 24 (1 µs … 16.8 s), and one above.
pub const HIST: usize = 26;
pub const HIST_AT: usize = 10;
/// The word holding the entry's user tag.
pub const TAG_AT: usize = HIST_AT + HIST;
pub const WORDS: usize = TAG_AT + 1;
pub const VALUE_SIZE: u32 = (WORDS * 8) as u32;
pub const KEY_SIZE: u32 = 16;
pub const MAX_ENTRIES: u32 = 8192;
pub const FLAG_FINALIZED: u64 = 1;

/// The upper bound of histogram bucket `i` (ns); `u64::MAX` for the last.
pub fn bound_ns(i: usize) -> u64 {
    if i + 1 >= HIST {
        u64::MAX
    } else {
        1000u64 << i
    }
}

pub fn hist_bucket(ns: u64) -> usize {
    (0..HIST).find(|&i| ns <= bound_ns(i)).unwrap_or(HIST - 1)
}

pub fn spec() -> MapSpec {
    MapSpec {
        name: MAP_NAME.into(),
        kind: MapType::Hash,
        key_size: KEY_SIZE,
        value_size: VALUE_SIZE,
        max_entries: MAX_ENTRIES,
    }
}

/// Distinct user tags with entries of their own, per process.
pub const MAX_TAGS: usize = 16;
/// The slot of every tag past the first [`MAX_TAGS`].
pub const TAG_OTHER: u32 = MAX_TAGS as u32 + 1;
/// Where the tag slot sits in the bucket word.
pub const TAG_SHIFT: u32 = 16;

/// The first [`MAX_TAGS`] distinct user tags, in the order first seen; 0 marks a free slot.
pub struct Tags([AtomicU64; MAX_TAGS]);

impl Tags {
    pub const fn new() -> Tags {
        Tags([const { AtomicU64::new(0) }; MAX_TAGS])
    }

    /// The slot of `tag`: 0 for 0 (untagged), 1 … [`MAX_TAGS`] for the first distinct tags,
    /// [`TAG_OTHER`] once every slot is taken by another. Lock-free: concurrent callers with
    /// the same new tag end in the same slot.
    pub fn slot(&self, tag: u64) -> u32 {
        if tag == 0 {
            return 0;
        }
        for (i, s) in self.0.iter().enumerate() {
            match s.compare_exchange(0, tag, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return i as u32 + 1,
                Err(t) if t == tag => return i as u32 + 1,
                Err(_) => {}
            }
        }
        TAG_OTHER
    }
}

impl Default for Tags {
    fn default() -> Tags {
        Tags::new()
    }
}

static TAGS: Tags = Tags::new();

/// The process's slot for `tag` ([`Tags::slot`]).
pub fn tag_slot(tag: u64) -> u32 {
    TAGS.slot(tag)
}

/// `bucket` with a tag slot.
pub fn with_tag(bucket: u32, slot: u32) -> u32 {
    (bucket & ((1 << TAG_SHIFT) - 1)) | (slot.min(TAG_OTHER) << TAG_SHIFT)
}

/// The tag slot of a bucket word.
pub fn tag_of(bucket: u32) -> u32 {
    bucket >> TAG_SHIFT
}

/// The bucket word of the key (untagged; [`with_tag`] adds the slot).
pub fn bucket(func: u8, size: u32, algo: i8, proto: i8) -> u32 {
    let f = u32::from(func.min(15));
    let a = (i32::from(algo) + 1).clamp(0, 7) as u32;
    let p = (i32::from(proto) + 1).clamp(0, 3) as u32;
    ((f * crate::collective::SIZE_BUCKETS + size.min(40)) * 8 + a) * 4 + p
}

/// The parts of a bucket word: func, size bucket, algo, proto.
pub fn unbucket(b: u32) -> (u8, u32, i8, i8) {
    let b = b & ((1 << TAG_SHIFT) - 1);
    let p = (b % 4) as i8 - 1;
    let a = ((b / 4) % 8) as i8 - 1;
    let rest = b / 32;
    let size = rest % crate::collective::SIZE_BUCKETS;
    let func = (rest / crate::collective::SIZE_BUCKETS) as u8;
    (func, size, a, p)
}

pub fn key(comm_id: u64, rank: u32, bucket: u32) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&comm_id.to_le_bytes());
    k[8..12].copy_from_slice(&rank.to_le_bytes());
    k[12..].copy_from_slice(&bucket.to_le_bytes());
    k
}

type Value = [AtomicU64; WORDS];

fn fresh(nranks: u32, bucket: u32, tag: u64) -> [u8; VALUE_SIZE as usize] {
    let mut w = [0u64; WORDS];
    w[0] = FORMAT;
    w[5] = u64::MAX;
    w[8] = nranks.into();
    w[TAG_AT] = match tag_of(bucket) {
        0 => 0,
        TAG_OTHER => u64::MAX,
        _ => tag,
    };
    let mut out = [0u8; VALUE_SIZE as usize];
    for (c, v) in out.chunks_exact_mut(8).zip(w) {
        c.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// One completed operation, as [`Stats::add`] counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// With its tag slot ([`with_tag`]).
    pub bucket: u32,
    /// The operation's user tag (0: none), written in a new entry.
    pub user_tag: u64,
    pub duration_ns: Option<u64>,
    pub bytes: u64,
    pub bus_bytes: u64,
}

/// A communicator's entries (one context's: comm id and rank).
pub struct Stats {
    comm_id: u64,
    rank: u32,
    nranks: u32,
    map: Option<Arc<Map>>,
    /// Entries found or made, by bucket. The map's values stay where they are while the key
    /// lives, and only [`Stats`] of a finalized context deletes its keys (or, when the map is
    /// full, a later context deletes keys flagged finalized: never ours while we live).
    entries: Mutex<HashMap<u32, NonNull<Value>>>,
}

// SAFETY: the pointers name atomics in a shared mapping that `map` keeps alive; every access
// is atomic.
unsafe impl Send for Stats {}
// SAFETY: as above; `entries` is behind a Mutex.
unsafe impl Sync for Stats {}

impl Stats {
    /// Entries in `registry`'s map (its problem, if it could not be made, is the second value;
    /// operations are then not counted anywhere but in the process's counters).
    pub fn new(
        registry: Option<&Registry>,
        comm_id: u64,
        rank: u32,
        nranks: u32,
    ) -> (Stats, Option<String>) {
        let (map, problem) = match registry.map(|r| r.runtime(&spec())) {
            Some(Ok(m)) => (Some(m), None),
            Some(Err(e)) => (None, Some(format!("{MAP_NAME}: {e}"))),
            None => (None, None),
        };
        (
            Stats {
                comm_id,
                rank,
                nranks,
                map,
                entries: Mutex::new(HashMap::new()),
            },
            problem,
        )
    }

    fn entry(&self, bucket: u32, tag: u64) -> Option<NonNull<Value>> {
        let map = self.map.as_ref()?;
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = entries.get(&bucket) {
            return Some(*p);
        }
        let k = key(self.comm_id, self.rank, bucket);
        for _ in 0..4 {
            match map.update(&k, &fresh(self.nranks, bucket, tag), BPF_NOEXIST) {
                Ok(()) | Err(MapError::Exists) => break,
                Err(MapError::Full) => {
                    let finished = map.entries().into_iter().find(|(_, v)| {
                        v[0].get(72..80).is_some_and(|f| {
                            u64::from_le_bytes(f.try_into().expect("8 bytes")) & FLAG_FINALIZED != 0
                        })
                    });
                    match finished {
                        Some((fk, _)) => {
                            let _ = map.delete(&fk);
                        }
                        None => return None,
                    }
                }
                Err(_) => return None,
            }
        }
        let p = map.lookup_ptr(&k)?;
        if !(p as usize).is_multiple_of(align_of::<Value>()) {
            return None;
        }
        // SAFETY: non-null (lookup_ptr) and aligned (checked); the value is WORDS u64s.
        let p = unsafe { NonNull::new_unchecked(p as *mut Value) };
        entries.insert(bucket, p);
        Some(p)
    }

    /// Whether the entries are in shared memory (false: the map could not be made).
    pub fn published(&self) -> bool {
        self.map.is_some()
    }

    /// Counts one operation; false when it has no entry (the map could not be made or is full).
    pub fn add(&self, s: &Sample) -> bool {
        let Some(p) = self.entry(s.bucket, s.user_tag) else {
            return false;
        };
        // SAFETY: see `entries`: the value lives while the map does and we hold it.
        let v = unsafe { p.as_ref() };
        match s.duration_ns {
            Some(ns) => {
                v[1].fetch_add(1, Ordering::Relaxed);
                v[2].fetch_add(ns, Ordering::Relaxed);
                v[3].fetch_add(s.bytes, Ordering::Relaxed);
                v[4].fetch_add(s.bus_bytes, Ordering::Relaxed);
                v[5].fetch_min(ns, Ordering::Relaxed);
                v[6].fetch_max(ns, Ordering::Relaxed);
                v[HIST_AT + hist_bucket(ns)].fetch_add(1, Ordering::Relaxed);
            }
            None => {
                v[7].fetch_add(1, Ordering::Relaxed);
            }
        }
        true
    }

    /// Flags every entry finalized: it stays readable until its room is needed.
    pub fn finalize(&self) {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for p in entries.values() {
            // SAFETY: as in `add`.
            let v = unsafe { p.as_ref() };
            v[9].fetch_or(FLAG_FINALIZED, Ordering::Relaxed);
        }
    }

    /// The words of one bucket's entry (tests, and the finalize summary).
    pub fn words(&self, bucket: u32) -> Option<[u64; WORDS]> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let p = entries.get(&bucket)?;
        // SAFETY: as in `add`.
        let v = unsafe { p.as_ref() };
        Some(std::array::from_fn(|i| v[i].load(Ordering::Relaxed)))
    }

    /// Buckets with an entry.
    pub fn buckets(&self) -> Vec<u32> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let mut b: Vec<u32> = entries.keys().copied().collect();
        b.sort_unstable();
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip() {
        for (f, s, a, p) in [
            (4u8, 20u32, 1i8, 2i8),
            (0, 0, -1, -1),
            (15, 40, 6, 2),
            (2, 17, 0, 0),
        ] {
            assert_eq!(unbucket(bucket(f, s, a, p)), (f, s, a, p));
        }
    }

    #[test]
    fn tag_slots_are_bounded_and_stable() {
        let t = Tags::new();
        assert_eq!(t.slot(0), 0, "untagged");
        assert_eq!(t.slot(77), 1);
        assert_eq!(t.slot(u64::MAX), 2);
        assert_eq!(t.slot(77), 1, "a tag keeps its slot");
        for tag in 100..100 + MAX_TAGS as u64 {
            t.slot(tag);
        }
        assert_eq!(t.slot(100), 3);
        assert_eq!(t.slot(5), TAG_OTHER, "past the bound: other");
        assert_eq!(t.slot(6), TAG_OTHER);
        assert_eq!(t.slot(u64::MAX), 2);
        // The slot rides above the bucket's own bits and leaves them readable.
        let b = bucket(4, 40, 6, 2);
        assert!(b < 1 << TAG_SHIFT);
        let tb = with_tag(b, TAG_OTHER);
        assert_eq!(tag_of(tb), TAG_OTHER);
        assert_eq!(unbucket(tb), unbucket(b));
        assert_eq!(with_tag(b, 1000), with_tag(b, TAG_OTHER), "slot clamped");
    }

    #[test]
    fn a_tagged_entry_holds_its_tag() {
        let dir = std::env::temp_dir().join(format!("ncclbpf-prof-tags-{}", std::process::id()));
        let reg = Registry::new(dir.clone());
        let (s, _) = Stats::new(Some(&reg), 0xabd, 0, 2);
        let b = bucket(4, 10, 1, 2);
        for (slot, tag) in [(0, 0u64), (3, 4242), (TAG_OTHER, 99)] {
            assert!(s.add(&Sample {
                bucket: with_tag(b, slot),
                user_tag: tag,
                duration_ns: Some(1_000),
                bytes: 1,
                bus_bytes: 1
            }));
        }
        assert_eq!(s.words(b).unwrap()[TAG_AT], 0);
        assert_eq!(s.words(with_tag(b, 3)).unwrap()[TAG_AT], 4242);
        assert_eq!(s.words(with_tag(b, TAG_OTHER)).unwrap()[TAG_AT], u64::MAX);
        assert_eq!(s.buckets().len(), 3, "one entry per slot");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn histogram_bounds() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1000), 0);
        assert_eq!(hist_bucket(1001), 1);
        assert_eq!(hist_bucket(16_777_216_000), 24);
        assert_eq!(hist_bucket(16_777_216_001), 25);
        assert_eq!(bound_ns(HIST - 1), u64::MAX);
    }

    #[test]
    fn samples_land_in_shared_memory() {
        let dir = std::env::temp_dir().join(format!("ncclbpf-prof-stats-{}", std::process::id()));
        let reg = Registry::new(dir.clone());
        let (s, problem) = Stats::new(Some(&reg), 0xabc, 1, 4);
        assert_eq!(problem, None);
        let b = bucket(4, 22, 1, 2);
        assert!(s.add(&Sample {
            bucket: b,
            user_tag: 0,
            duration_ns: Some(5_000),
            bytes: 4 << 20,
            bus_bytes: 6 << 20
        }));
        assert!(s.add(&Sample {
            bucket: b,
            user_tag: 0,
            duration_ns: Some(3_000),
            bytes: 4 << 20,
            bus_bytes: 6 << 20
        }));
        assert!(s.add(&Sample {
            bucket: b,
            user_tag: 0,
            duration_ns: None,
            bytes: 0,
            bus_bytes: 0
        }));
        let w = s.words(b).unwrap();
        assert_eq!(
            &w[..10],
            &[FORMAT, 2, 8_000, 8 << 20, 12 << 20, 3_000, 5_000, 1, 4, 0]
        );
        assert_eq!(w[HIST_AT + hist_bucket(5_000)], 1);
        assert_eq!(w[HIST_AT + hist_bucket(3_000)], 1);
        // What an outside reader sees through the map.
        let map = reg.runtime(&spec()).unwrap();
        let entries = map.entries();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].0, key(0xabc, 1, b).to_vec());
        assert_eq!(
            u64::from_le_bytes(entries[0].1[0][16..24].try_into().unwrap()),
            8_000
        );
        s.finalize();
        assert_eq!(s.words(b).unwrap()[9], FLAG_FINALIZED);
        let _ = std::fs::remove_dir_all(dir);
    }
}
