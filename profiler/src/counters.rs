//! The profiler's own counters: what it followed, what it ignored, and every misuse of its
//! handles, published in the `ncclbpf_profiler` map (one entry, key 0 as a little-endian `u64`;
//! value [`WORDS`] little-endian `u64` in [`Counter`] order, word 0 the format) for the
//! metrics endpoint and `ncclbpf exporter`.
//!
//! A misuse (a handle that names nothing, a context that was finalized, a parent from another
//! communicator) is never an error to NCCL: the call is ignored, counted here, and reported in
//! NCCL's log at most once per [`LOG_EVERY`] per kind, with the count so far.

use shared_maps::{BPF_ANY, MapSpec, MapType, Registry};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const MAP_NAME: &str = "ncclbpf_profiler";
pub const FORMAT: u64 = 1;
/// Reports of one kind of misuse are this far apart at least.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Counters, in word order (word = discriminant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    ContextsOpened = 1,
    ContextsFinalized,
    /// Events given a handle.
    EventsFollowed,
    /// Events of types the plugin does not follow (NULL handle).
    EventsIgnored,
    /// Collectives and p2p operations completed with a GPU time.
    OpsTimed,
    /// … and without one.
    OpsUntimed,
    NullHandle,
    UnknownHandle,
    StaleStopped,
    StaleFinalized,
    StaleReclaimed,
    UnknownContext,
    ForeignParent,
    TableFull,
    /// Operations still pending when reclaimed (at finalize, or too many pending).
    ReclaimedPending,
    StatsDropped,
    PolicyRuns,
    /// Events (other than pending operations) still open at their context's finalize.
    OpenAtFinalize,
    /// KernelCh events whose parent names no pending operation of theirs.
    Orphans,
    /// Events open now (a gauge).
    OpenEvents,
    /// Contexts open now (a gauge).
    OpenContexts,
}

pub const WORDS: usize = Counter::OpenContexts as usize + 1;

impl Counter {
    pub const ALL: [Counter; WORDS - 1] = [
        Counter::ContextsOpened,
        Counter::ContextsFinalized,
        Counter::EventsFollowed,
        Counter::EventsIgnored,
        Counter::OpsTimed,
        Counter::OpsUntimed,
        Counter::NullHandle,
        Counter::UnknownHandle,
        Counter::StaleStopped,
        Counter::StaleFinalized,
        Counter::StaleReclaimed,
        Counter::UnknownContext,
        Counter::ForeignParent,
        Counter::TableFull,
        Counter::ReclaimedPending,
        Counter::StatsDropped,
        Counter::PolicyRuns,
        Counter::OpenAtFinalize,
        Counter::Orphans,
        Counter::OpenEvents,
        Counter::OpenContexts,
    ];

    /// The metrics label, and for misuses what the log line says.
    pub fn name(self) -> &'static str {
        match self {
            Counter::ContextsOpened => "contexts_opened",
            Counter::ContextsFinalized => "contexts_finalized",
            Counter::EventsFollowed => "events_followed",
            Counter::EventsIgnored => "events_ignored",
            Counter::OpsTimed => "ops_timed",
            Counter::OpsUntimed => "ops_untimed",
            Counter::NullHandle => "null_handle",
            Counter::UnknownHandle => "unknown_handle",
            Counter::StaleStopped => "stale_handle_stopped",
            Counter::StaleFinalized => "stale_handle_finalized",
            Counter::StaleReclaimed => "stale_handle_reclaimed",
            Counter::UnknownContext => "unknown_context",
            Counter::ForeignParent => "foreign_parent",
            Counter::TableFull => "table_full",
            Counter::ReclaimedPending => "reclaimed_pending",
            Counter::StatsDropped => "stats_dropped",
            Counter::PolicyRuns => "policy_runs",
            Counter::OpenAtFinalize => "open_at_finalize",
            Counter::Orphans => "orphans",
            Counter::OpenEvents => "open_events",
            Counter::OpenContexts => "open_contexts",
        }
    }

    /// What a misuse means, for its log line; `None` for counters that are not misuses.
    pub fn misuse(self) -> Option<&'static str> {
        Some(match self {
            Counter::NullHandle => "a NULL event handle",
            Counter::UnknownHandle => "an event handle this plugin never issued",
            Counter::StaleStopped => "an event handle already stopped",
            Counter::StaleFinalized => "an event handle of a finalized communicator",
            Counter::StaleReclaimed => "an event handle reclaimed earlier",
            Counter::UnknownContext => "a profiler context that is unknown or finalized",
            Counter::ForeignParent => "a parent event of another communicator",
            Counter::TableFull => "no room for another event",
            Counter::StatsDropped => "no room in ncclbpf_collectives",
            _ => return None,
        })
    }
}

/// The words, in shared memory when the map could be made, else private.
pub struct Counters {
    words: NonNull<[AtomicU64; WORDS]>,
    last_log: [AtomicU64; WORDS],
    epoch: Instant,
}
// SAFETY: atomics in a mapping kept alive for the process (or a leaked box).
unsafe impl Send for Counters {}
// SAFETY: as above.
unsafe impl Sync for Counters {}

fn private_words() -> NonNull<[AtomicU64; WORDS]> {
    let b: &'static mut [AtomicU64; WORDS] = Box::leak(Box::new(std::array::from_fn(|i| {
        AtomicU64::new(if i == 0 { FORMAT } else { 0 })
    })));
    NonNull::from(b)
}

impl Counters {
    /// Counters of their own (tests), not published.
    pub fn private() -> Counters {
        Counters {
            words: private_words(),
            last_log: [const { AtomicU64::new(0) }; WORDS],
            epoch: Instant::now(),
        }
    }

    /// The process's counters, in `registry`'s `ncclbpf_profiler` map when it can be made.
    pub fn published(registry: &Registry) -> Counters {
        let spec = MapSpec {
            name: MAP_NAME.into(),
            kind: MapType::Hash,
            key_size: 8,
            value_size: (WORDS * 8) as u32,
            max_entries: 1,
        };
        let mut init = vec![0u8; WORDS * 8];
        init[..8].copy_from_slice(&FORMAT.to_le_bytes());
        let shared = registry.runtime(&spec).ok().and_then(|map| {
            map.update(&0u64.to_le_bytes(), &init, BPF_ANY).ok()?;
            let p = map.lookup_ptr(&0u64.to_le_bytes())?;
            if !(p as usize).is_multiple_of(8) {
                return None;
            }
            // The map lives as long as the process: keep our reference with it.
            std::mem::forget(map);
            NonNull::new(p as *mut [AtomicU64; WORDS])
        });
        Counters {
            words: shared.unwrap_or_else(private_words),
            last_log: [const { AtomicU64::new(0) }; WORDS],
            epoch: Instant::now(),
        }
    }

    fn words(&self) -> &[AtomicU64; WORDS] {
        // SAFETY: see the `Send` impl: the words live for the process.
        unsafe { self.words.as_ref() }
    }

    pub fn add(&self, c: Counter, n: u64) {
        self.words()[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(&self, c: Counter, v: u64) {
        self.words()[c as usize].store(v, Ordering::Relaxed);
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.words()[c as usize].load(Ordering::Relaxed)
    }

    /// Counts a misuse and reports it when the last report of its kind is [`LOG_EVERY`] old.
    pub fn misuse(&self, c: Counter, during: &str) {
        self.add(c, 1);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.last_log[c as usize].load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= LOG_EVERY.as_millis() as u64)
            && self.last_log[c as usize]
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            crate::plog!(
                WARN,
                PROFILE,
                "{during}: ignored {} ({} so far; reported at most every {} s)",
                c.misuse().unwrap_or(c.name()),
                self.get(c),
                LOG_EVERY.as_secs()
            );
        }
    }

    /// Every word, for summaries and tests.
    pub fn snapshot(&self) -> [u64; WORDS] {
        std::array::from_fn(|i| self.words()[i].load(Ordering::Relaxed))
    }
}
