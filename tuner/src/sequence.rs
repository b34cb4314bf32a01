//! Collective sequence numbers and decision digests per tuner context, published for outside
//! readers (`ncclbpf decisions --compare PID...`) in the process's `ncclbpf_decisions` map.
//!
//! A context (one per communicator and process) numbers the decisions its policy makes (`seq`,
//! from 1) and folds each into a running [`digest`](crate::digest). Every rank of a
//! communicator that made the same decisions for the same collectives has the same digest at
//! the same `seq`; a tool that reads two ranks at different moments compares them at their
//! highest common checkpoint (the digest at every multiple of [`INTERVAL`], the last [`KEPT`]
//! kept).
//!
//! # The map
//!
//! `ncclbpf_decisions`, a hash map created by the plugin (not by a policy: programs cannot
//! declare `ncclbpf_*` names), listed in the registry like every map (`ncclbpf maps PID`,
//! `MapView::open_all`), owner-only like the others. Key: 16 bytes, the communicator id
//! (NCCL's comm hash, the same on every rank; 0 from tuner ABI v2-v4, which do not pass it) and
//! the context's number in this process (0, 1, … in creation order: one process may hold
//! several ranks of one communicator), both little-endian `u64`. Value: [`RECORD_WORDS`]
//! little-endian `u64` words:
//!
//! | word | content |
//! |---|---|
//! | 0 | format, [`FORMAT`] (2) |
//! | 1 | `2 × seq`, odd while the writer is between `seq` and its digest |
//! | 2 | the digest after decision `seq` (0 at `seq` 0) |
//! | 3 | calls decided outside the sequence (see Threads) |
//! | 4 | the checkpoint interval, [`INTERVAL`] |
//! | 5, 6 | ranks and nodes NCCL gave the context |
//! | 7 | flags: 1 a `tuner` policy is attached (without one nothing is sequenced), 2 finalized |
//! | 8 + 2i, 9 + 2i | checkpoint i of [`KEPT`]: `seq` (0: none yet; `u64::MAX`: being written), digest; checkpoint `s` lies at i = (s / interval) mod 16 |
//! | 40 | agreement words' version: `2 × changes`, odd while the owner rewrites words 41-47 |
//! | 41 | agreement state: 0 none (the context runs no agreement), 1 starting (no epoch applied yet: no opinion), 2 deciding, 3 waiting (for every rank's record of an epoch), 4 stopped (the ranks differ, or a wait timed out) |
//! | 42 | the epoch the decisions use (the last applied while deciding; `u64::MAX`: none) |
//! | 43 | the current epoch: the one whose collectives are being decided (every epoch before it posted: this rank's record sent); 0 at the start |
//! | 44 | the epoch waited for while waiting (`u64::MAX` otherwise) |
//! | 45 | since when it waits, Unix nanoseconds (0 when not waiting) |
//! | 46, 47 | the agreement's K (collectives per epoch) and D (epochs between posting one and deciding from it); 0 without an agreement |
//! | 48 + i | decisions counted in bucket i = ((c × 9 + a) × 5 + p) × 2 + applied, [`COUNT_WORDS`] words: c the collective (NCCL's `ncclFunc_t` 0 broadcast … 7 recv; 8 any other), a the algorithm + 1 (0: -1, left to NCCL; 1-7: NCCL's 0-6; 8 any other), p the protocol + 1 (0: -1; 1-3: LL, LL128, Simple; 4 any other), applied 1 when the choice was applied to NCCL's cost table |
//!
//! The counts cover every decision of a context with a policy, sequenced or not (word 1 counts
//! the sequenced ones, word 3 the others), so they sum to `seq` plus word 3.
//! A reader takes two copies of the value, one after the other, each word loaded atomically
//! in order ([`Snapshot::from_reads`]): the pair (seq, digest) is consistent when word 1 is the
//! same even number in both; a checkpoint when its `seq` is the same in both (and neither 0
//! nor `u64::MAX`); the agreement words when word 40 is the same even number in both. A count
//! is a single word, read as it is.
//!
//! # Cost
//!
//! On each decision: two loads from the record, the fold, and three plain stores into it, and
//! a plain add to the decision's count (single writer; its index computed without a branch); on
//! every 256th, three more stores for the checkpoint. The agreement words change at epoch
//! boundaries only (the cold path). No lock, no allocation, no system call. Without a policy nothing runs at all: the no-policy `getCollInfo` stays as it
//! was (staged swaps would need a sequence there too; a context without a policy cannot get
//! one today, since tuner programs are not reloaded).
//!
//! # Threads
//!
//! NCCL calls one communicator's `getCollInfo` from one thread at a time, so the decisions of
//! a context have one order. The sequence has a single writer, the caller that holds the
//! context's lock (`crate::owner`, see `ffi.rs`). A call that finds it taken (a second thread on
//! the same context at the same moment, which NCCL does not do) is decided and counted in the
//! summary as ever, but not sequenced: it increments word 3 instead, and its decision is
//! counted apart (`count_stray`) until the writer's next decision, or the context's end, folds
//! it into the record's counts. The order of such calls is not defined, so neither would be a
//! digest over them; `--compare` says so when word 3 is not 0.
//!
//! # Capacity
//!
//! [`MAX_RECORDS`] records per process, of [`RECORD_SIZE`] (6,864) bytes: the map's segment is
//! 3.5 MB of shared memory (512 hash slots of 6,888 B; 176 KB in format 1, before the counts),
//! touched only where records are written. A finalized communicator's record stays readable until
//! its slot is needed by a new one; with every slot held by a live communicator the new
//! context keeps its sequence privately (logged, and still in its finalize line) and is
//! missing from the map.

use crate::decide::Decision;
use crate::digest;
use ncclnet_headers::tuner::{NUM_ALGORITHMS, NUM_PROTOCOLS};
use shared_maps::{BPF_NOEXIST, Map, MapError, MapSpec, MapType, Registry};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock};

/// The map's name in the registry.
pub const MAP_NAME: &str = "ncclbpf_decisions";
/// Decisions between checkpoints (a power of two).
pub const INTERVAL: u64 = 256;
/// Checkpoints kept per record.
pub const KEPT: usize = 16;
/// Word 0 of every record (1: before the agreement words and the counts).
pub const FORMAT: u64 = 2;
/// Records per process.
pub const MAX_RECORDS: u32 = 256;
/// Communicator id and context number.
pub const KEY_SIZE: u32 = 16;
/// Collective buckets: NCCL's `ncclFunc_t` 0 (broadcast) … 7 (recv), and one for any other.
pub const COLL_BUCKETS: usize = 9;
/// Algorithm buckets: -1 (left to NCCL), NCCL's 0 … `NUM_ALGORITHMS` − 1, any other.
pub const ALGO_BUCKETS: usize = NUM_ALGORITHMS + 2;
/// Protocol buckets: -1, NCCL's 0 … `NUM_PROTOCOLS` − 1, any other.
pub const PROTO_BUCKETS: usize = NUM_PROTOCOLS + 2;
/// Words of the counts: collective × algorithm × protocol × applied.
pub const COUNT_WORDS: usize = COLL_BUCKETS * ALGO_BUCKETS * PROTO_BUCKETS * 2;
/// Word of the agreement words' version.
pub const AGREEMENT_AT: usize = 8 + 2 * KEPT;
/// Agreement words after the version.
pub const AGREEMENT_WORDS: usize = 7;
/// First word of the counts.
pub const COUNTS_AT: usize = AGREEMENT_AT + 1 + AGREEMENT_WORDS;
/// Words of a record.
pub const RECORD_WORDS: usize = COUNTS_AT + COUNT_WORDS;
/// "None" in the agreement's epoch words.
pub const NO_EPOCH: u64 = u64::MAX;

const _: () = assert!(AGREEMENT_AT == 40 && COUNTS_AT == 48 && COUNT_WORDS == 810);
const _: () = assert!(ALGO_BUCKETS == 9 && PROTO_BUCKETS == 5);
/// Bytes of a record.
pub const RECORD_SIZE: u32 = (RECORD_WORDS * 8) as u32;
/// Flag: a `tuner` policy is attached.
pub const FLAG_POLICY: u64 = 1;
/// Flag: the context was finalized.
pub const FLAG_FINALIZED: u64 = 2;
/// A checkpoint's `seq` while it is being written.
pub const WRITING: u64 = u64::MAX;

const _: () = assert!(INTERVAL.is_power_of_two());

/// The value layout (see the module docs), as the owner writes it.
#[repr(C)]
pub struct Record {
    format: AtomicU64,
    seq2: AtomicU64,
    digest: AtomicU64,
    unsequenced: AtomicU64,
    interval: AtomicU64,
    nranks: AtomicU64,
    nnodes: AtomicU64,
    flags: AtomicU64,
    checkpoints: [[AtomicU64; 2]; KEPT],
    agreement_version: AtomicU64,
    agreement: [AtomicU64; AGREEMENT_WORDS],
    counts: [AtomicU64; COUNT_WORDS],
}

const _: () = assert!(size_of::<Record>() == RECORD_SIZE as usize);
const _: () = assert!(align_of::<Record>() == 8);

impl Record {
    fn fresh(nranks: u32, nnodes: u32, policy: bool) -> Record {
        Record {
            format: AtomicU64::new(FORMAT),
            seq2: AtomicU64::new(0),
            digest: AtomicU64::new(0),
            unsequenced: AtomicU64::new(0),
            interval: AtomicU64::new(INTERVAL),
            nranks: AtomicU64::new(nranks.into()),
            nnodes: AtomicU64::new(nnodes.into()),
            flags: AtomicU64::new(if policy { FLAG_POLICY } else { 0 }),
            checkpoints: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
            agreement_version: AtomicU64::new(0),
            agreement: std::array::from_fn(|i| AtomicU64::new(AgreementWords::NONE.word(i))),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The record as value bytes for `map_update_elem`.
    fn bytes(&self) -> Vec<u8> {
        let mut words = vec![
            &self.format,
            &self.seq2,
            &self.digest,
            &self.unsequenced,
            &self.interval,
            &self.nranks,
            &self.nnodes,
            &self.flags,
        ];
        words.extend(self.checkpoints.iter().flatten());
        words.push(&self.agreement_version);
        words.extend(&self.agreement);
        words.extend(&self.counts);
        words
            .iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
            .collect()
    }
}

/// The shape of `ncclbpf_decisions`.
pub fn spec() -> MapSpec {
    MapSpec {
        name: MAP_NAME.into(),
        kind: MapType::Hash,
        key_size: KEY_SIZE,
        value_size: RECORD_SIZE,
        max_entries: MAX_RECORDS,
    }
}

/// The count bucket of a decision on collective `coll` (see the module docs): out-of-range
/// values go to each dimension's last bucket. Unsigned minimums, no branch.
#[inline(always)]
pub fn bucket(coll: i32, d: &Decision) -> usize {
    let c = (coll as u32).min(COLL_BUCKETS as u32 - 1) as usize;
    let a = (d.algo.wrapping_add(1) as u32).min(ALGO_BUCKETS as u32 - 1) as usize;
    let p = (d.proto.wrapping_add(1) as u32).min(PROTO_BUCKETS as u32 - 1) as usize;
    ((c * ALGO_BUCKETS + a) * PROTO_BUCKETS + p) * 2 + d.applied as usize
}

/// One count bucket: the collective (`None`: other), algorithm and protocol (-1: left to
/// NCCL; `None`: other), and whether the choice was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bucket {
    pub coll: Option<i32>,
    pub algo: Option<i32>,
    pub proto: Option<i32>,
    pub applied: bool,
}

impl Bucket {
    /// The bucket of count word `i` (0 ≤ i < [`COUNT_WORDS`]).
    pub fn of(i: usize) -> Bucket {
        let applied = i % 2 == 1;
        let rest = i / 2;
        let (p, rest) = (rest % PROTO_BUCKETS, rest / PROTO_BUCKETS);
        let (a, c) = (rest % ALGO_BUCKETS, rest / ALGO_BUCKETS);
        let known = |v: usize, n: usize| (v + 1 < n).then_some(v as i32 - 1);
        Bucket {
            coll: (c + 1 < COLL_BUCKETS).then_some(c as i32),
            algo: known(a, ALGO_BUCKETS),
            proto: known(p, PROTO_BUCKETS),
            applied,
        }
    }
}

/// Agreement state word values (word 41).
pub mod agreement_state {
    pub const NONE: u64 = 0;
    pub const STARTING: u64 = 1;
    pub const DECIDING: u64 = 2;
    pub const WAITING: u64 = 3;
    pub const STOPPED: u64 = 4;
    /// The name of a state value (`None` for one this build does not know).
    pub fn name(v: u64) -> Option<&'static str> {
        ["none", "starting", "deciding", "waiting", "stopped"]
            .get(v as usize)
            .copied()
    }
}

/// The agreement words of a record (41-47), as the context publishes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgreementWords {
    /// [`agreement_state`].
    pub state: u64,
    /// The epoch the decisions use ([`NO_EPOCH`]: none).
    pub used: u64,
    /// The current epoch (the one being counted; the ones before it were posted).
    pub current: u64,
    /// The epoch waited for ([`NO_EPOCH`]: not waiting).
    pub waiting_for: u64,
    /// Since when, Unix ns (0: not waiting).
    pub waiting_since_ns: u64,
    pub epoch: u64,
    pub delay: u64,
}

impl AgreementWords {
    /// A context without an agreement.
    pub const NONE: AgreementWords = AgreementWords {
        state: agreement_state::NONE,
        used: NO_EPOCH,
        current: 0,
        waiting_for: NO_EPOCH,
        waiting_since_ns: 0,
        epoch: 0,
        delay: 0,
    };

    fn word(&self, i: usize) -> u64 {
        self.words()[i]
    }

    fn words(&self) -> [u64; AGREEMENT_WORDS] {
        [
            self.state,
            self.used,
            self.current,
            self.waiting_for,
            self.waiting_since_ns,
            self.epoch,
            self.delay,
        ]
    }

    fn from_words(w: &[u64]) -> AgreementWords {
        AgreementWords {
            state: w[0],
            used: w[1],
            current: w[2],
            waiting_for: w[3],
            waiting_since_ns: w[4],
            epoch: w[5],
            delay: w[6],
        }
    }
}

/// Where a context's record lives.
enum Store {
    /// In the process's `ncclbpf_decisions` map, under `key` (the `Arc` keeps the segment
    /// mapped).
    Shared { _map: Arc<Map> },
    /// Nowhere outside (no registry, or no room): the same writes, to memory of our own.
    Private { _record: Box<Record> },
}

/// One context's sequence and digest, and its published record.
///
/// The record is the only copy of `seq` and the digest: the writer reads back what it wrote
/// (two more stores per call for a private copy measured 0.6 ns). Another process of the same
/// user could write into the segment (as it could ptrace the job); that would only make the
/// digests wrong, never memory unsafe: every access is atomic and the checkpoint slot index is
/// computed, not read.
pub struct Sequence {
    /// Calls outside the sequence (mirrored in the record).
    unsequenced: AtomicU64,
    /// Their decision counts, until the single writer folds them into the record's
    /// ([`Sequence::count_stray`]); allocated at the first.
    stray: OnceLock<Box<[AtomicU64; COUNT_WORDS]>>,
    /// Whether `stray` holds counts not yet folded.
    stray_pending: AtomicBool,
    /// The record: into `store`, valid while it lives.
    out: NonNull<Record>,
    store: Store,
}

// SAFETY: `out` points into `store` (a map segment that the `Arc` keeps mapped, or a box that
// moves with us); every access through it is atomic, so it may be shared and sent like the
// atomics themselves.
unsafe impl Send for Sequence {}
// SAFETY: as above.
unsafe impl Sync for Sequence {}

/// The key of context `ordinal` of communicator `comm_id`.
pub fn key(comm_id: u64, ordinal: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&comm_id.to_le_bytes());
    k[8..].copy_from_slice(&ordinal.to_le_bytes());
    k
}

/// Inserts `value` under `key`, making room by dropping finalized records if the map is full.
fn insert(map: &Map, key: &[u8; 16], value: &[u8]) -> Result<(), String> {
    for _ in 0..8 {
        match map.update(key, value, BPF_NOEXIST) {
            Ok(()) => return Ok(()),
            Err(MapError::Full) => {
                let finished = map.entries().into_iter().find(|(_, v)| {
                    v[0].get(56..64).is_some_and(|f| {
                        u64::from_le_bytes(f.try_into().expect("8 bytes")) & FLAG_FINALIZED != 0
                    })
                });
                match finished {
                    // Another context may have taken the same one; then look again.
                    Some((k, _)) => {
                        let _ = map.delete(&k);
                    }
                    None => {
                        return Err(format!(
                            "{MAP_NAME} is full ({MAX_RECORDS} live communicators in this process)"
                        ));
                    }
                }
            }
            Err(e) => return Err(format!("{MAP_NAME}: cannot insert a record: {e:?}")),
        }
    }
    Err(format!(
        "{MAP_NAME}: no room after dropping finalized records"
    ))
}

impl Sequence {
    /// A sequence at 0 for a new context of `comm_id`, published in `registry`'s
    /// `ncclbpf_decisions` map when there is one (and room). The second value says why the
    /// record could not be published, if it could not.
    pub fn new(
        registry: Option<&Registry>,
        comm_id: u64,
        nranks: u32,
        nnodes: u32,
        policy: bool,
    ) -> (Sequence, Option<String>) {
        static ORDINAL: AtomicU64 = AtomicU64::new(0);
        let fresh = Record::fresh(nranks, nnodes, policy);
        let mut problem = None;
        if let Some(reg) = registry {
            let k = key(comm_id, ORDINAL.fetch_add(1, Ordering::Relaxed));
            let published = reg
                .runtime(&spec())
                .map_err(|e| e.to_string())
                .and_then(|map| {
                    insert(&map, &k, &fresh.bytes())?;
                    let p = map
                        .lookup_ptr(&k)
                        .ok_or_else(|| format!("{MAP_NAME}: the record just inserted is gone"))?;
                    if !(p as usize).is_multiple_of(align_of::<Record>()) {
                        let _ = map.delete(&k);
                        return Err(format!("{MAP_NAME}: misaligned value"));
                    }
                    Ok((map, p))
                });
            match published {
                Ok((map, p)) => {
                    return (
                        Sequence::with_out(
                            // SAFETY: checked non-null (lookup_ptr) and aligned above.
                            unsafe { NonNull::new_unchecked(p as *mut Record) },
                            Store::Shared { _map: map },
                        ),
                        None,
                    );
                }
                Err(e) => problem = Some(e),
            }
        }
        let mut b = Box::new(fresh);
        let out = NonNull::from(&mut *b);
        (
            Sequence::with_out(out, Store::Private { _record: b }),
            problem,
        )
    }

    fn with_out(out: NonNull<Record>, store: Store) -> Sequence {
        Sequence {
            unsequenced: AtomicU64::new(0),
            stray: OnceLock::new(),
            stray_pending: AtomicBool::new(false),
            out,
            store,
        }
    }

    #[inline(always)]
    fn out(&self) -> &Record {
        // SAFETY: `out` points at a Record inside `store`, which lives as long as self (a map
        // value whose key only we delete, never while we live, in a segment the Arc keeps
        // mapped; or our own box); all its fields are atomics.
        unsafe { self.out.as_ref() }
    }

    /// Sequences one decision and publishes it; returns its `seq` and the digest after it.
    /// Single writer: only the
    /// caller holding the context's try-lock calls this (a second writer would lose updates,
    /// never memory safety: every field is atomic).
    #[inline(always)]
    pub fn record(&self, coll_type: i32, n_bytes: u64, d: &Decision) -> (u64, u64) {
        let seq = self.seq().wrapping_add(1);
        self.record_at(seq, coll_type, n_bytes, d)
    }

    /// [`record`](Self::record) for a caller that already read the number this decision gets
    /// (`seq() + 1`, under the same try-lock).
    #[inline(always)]
    pub fn record_at(&self, seq: u64, coll_type: i32, n_bytes: u64, d: &Decision) -> (u64, u64) {
        let r = self.out();
        let h = digest::fold(r.digest.load(Ordering::Relaxed), seq, coll_type, n_bytes, d);
        // A seqlock for readers: odd while the digest is not yet the one of `seq`.
        r.seq2
            .store(seq.wrapping_mul(2).wrapping_sub(1), Ordering::Relaxed);
        fence(Ordering::Release);
        r.digest.store(h, Ordering::Relaxed);
        r.seq2.store(seq.wrapping_mul(2), Ordering::Release);
        if seq & (INTERVAL - 1) == 0 {
            checkpoint(r, seq, h);
        }
        (seq, h)
    }

    /// A call decided outside the sequence (the try-lock was taken).
    #[cold]
    pub fn unsequenced(&self) {
        let n = self.unsequenced.fetch_add(1, Ordering::Relaxed) + 1;
        self.out().unsequenced.fetch_max(n, Ordering::Relaxed);
    }

    /// `seq` of the last sequenced decision (0: none).
    pub fn seq(&self) -> u64 {
        self.out().seq2.load(Ordering::Relaxed) / 2
    }

    /// The digest after it.
    pub fn digest(&self) -> u64 {
        self.out().digest.load(Ordering::Relaxed)
    }

    /// Calls decided outside the sequence.
    pub fn unsequenced_calls(&self) -> u64 {
        self.unsequenced.load(Ordering::Relaxed)
    }

    /// Whether the record is in the process's map (else only in this context).
    pub fn published(&self) -> bool {
        matches!(self.store, Store::Shared { .. })
    }

    /// Counts one decision on collective `coll`. Single writer: only the caller inside the
    /// context's lock calls this (a plain read-modify-write of its bucket's word, no locked
    /// instruction); it first folds in what calls outside the sequence counted meanwhile.
    #[inline(always)]
    pub fn count(&self, coll: i32, d: &Decision) {
        if self.stray_pending.load(Ordering::Relaxed) {
            self.fold_stray();
        }
        let i = bucket(coll, d);
        if let Some(w) = self.out().counts.get(i) {
            w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        }
    }

    /// Counts one decision made outside the sequence (any thread, while another holds the
    /// context): kept apart until the single writer's next [`count`](Self::count) folds it into
    /// the record (so that a reader outside sees it from then on; [`counts`](Self::counts)
    /// sees it at once).
    #[cold]
    pub fn count_stray(&self, coll: i32, d: &Decision) {
        let stray = self
            .stray
            .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
        if let Some(w) = stray.get(bucket(coll, d)) {
            w.fetch_add(1, Ordering::SeqCst);
        }
        // After the count (SeqCst, as the fold's): a fold that cleared the flag before taking
        // this count sees the flag set again.
        self.stray_pending.store(true, Ordering::SeqCst);
    }

    /// Moves the stray counts into the record (the single writer only).
    #[cold]
    #[inline(never)]
    fn fold_stray(&self) {
        self.stray_pending.store(false, Ordering::SeqCst);
        let Some(stray) = self.stray.get() else {
            return;
        };
        for (w, s) in self.out().counts.iter().zip(stray.iter()) {
            let n = s.swap(0, Ordering::SeqCst);
            if n > 0 {
                w.store(w.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
            }
        }
    }

    /// The counts, word by word (see [`Bucket::of`]), stray counts not yet folded included.
    pub fn counts(&self) -> impl Iterator<Item = u64> + '_ {
        let stray = self.stray.get();
        self.out().counts.iter().enumerate().map(move |(i, w)| {
            w.load(Ordering::Relaxed) + stray.map_or(0, |s| s[i].load(Ordering::Relaxed))
        })
    }

    /// Publishes the agreement words (the agreement's owner only, on the cold path).
    #[cold]
    pub fn publish_agreement(&self, a: &AgreementWords) {
        let r = self.out();
        // A seqlock for readers, as `seq2`: odd while the words change (single writer, so
        // even between calls).
        let v = r.agreement_version.load(Ordering::Relaxed) & !1;
        r.agreement_version
            .store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, x) in r.agreement.iter().zip(a.words()) {
            w.store(x, Ordering::Relaxed);
        }
        r.agreement_version
            .store(v.wrapping_add(2), Ordering::Release);
    }

    /// The record as an outside reader would read it, from two copies (for private records,
    /// tests, and the context itself); `Err` only if someone else overwrote a shared record.
    pub fn snapshot(&self, comm_id: u64, context: u64) -> Result<Snapshot, String> {
        let (a, b) = (self.out().bytes(), self.out().bytes());
        Snapshot::from_reads(&key(comm_id, context), &a, &b)
    }
}

#[cold]
#[inline(never)]
fn checkpoint(r: &Record, seq: u64, h: u64) {
    let c = &r.checkpoints[(seq / INTERVAL) as usize % KEPT];
    c[0].store(WRITING, Ordering::Relaxed);
    fence(Ordering::Release);
    c[1].store(h, Ordering::Relaxed);
    c[0].store(seq, Ordering::Release);
}

impl Drop for Sequence {
    fn drop(&mut self) {
        // Nobody decides any more (`&mut self`): the last stray counts go into the record.
        self.fold_stray();
        // The record stays readable (final seq and digest) until its slot is needed.
        self.out().flags.fetch_or(FLAG_FINALIZED, Ordering::Release);
    }
}

/// One record as an outside reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub comm_id: u64,
    /// The context's number in its process.
    pub context: u64,
    /// `seq` of the last sequenced decision (when the pair was changing between the two
    /// reads: the later read's, rounded down).
    pub seq: u64,
    /// The digest after `seq`; `None` when it changed between the two reads.
    pub digest: Option<u64>,
    pub unsequenced: u64,
    pub interval: u64,
    pub nranks: u64,
    pub nnodes: u64,
    pub policy: bool,
    pub finalized: bool,
    /// Consistent checkpoints, `(seq, digest)` by increasing `seq`.
    pub checkpoints: Vec<(u64, u64)>,
    /// The agreement words (`None` when they changed between the two reads).
    pub agreement: Option<AgreementWords>,
    /// Non-zero decision counts by bucket (from the later read), in bucket order.
    pub counts: Vec<(Bucket, u64)>,
}

impl Snapshot {
    /// The record under `key`, from two copies of its value read one after the other (every
    /// copy word by word, in order, each word loaded atomically with acquire ordering, as
    /// `MapView::entries` reads). Fails on a key or value of another shape or format.
    pub fn from_reads(key: &[u8], first: &[u8], second: &[u8]) -> Result<Snapshot, String> {
        let words = |b: &[u8]| -> Vec<u64> {
            b.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect()
        };
        if let Some(f) = first.get(..8) {
            let format = u64::from_le_bytes(f.try_into().expect("8 bytes"));
            if format != FORMAT {
                return Err(format!(
                    "record format {format} (this ncclbpf reads format {FORMAT}: written by \
                     another ncclbpf version, or not a decision record)"
                ));
            }
        }
        if key.len() != KEY_SIZE as usize
            || first.len() != RECORD_SIZE as usize
            || second.len() != RECORD_SIZE as usize
        {
            return Err(format!(
                "a record of {} B with a {} B key, expected {RECORD_SIZE} B and {KEY_SIZE} B",
                first.len(),
                key.len()
            ));
        }
        let (a, b, k) = (words(first), words(second), words(key));
        let interval = a[4];
        if interval == 0 {
            return Err("a record with checkpoint interval 0".into());
        }
        let stable = a[1] == b[1] && a[1] % 2 == 0;
        let mut checkpoints: Vec<(u64, u64)> = (0..KEPT)
            .filter_map(|i| {
                let (s, d) = (a[8 + 2 * i], a[9 + 2 * i]);
                let ok = s == b[8 + 2 * i]
                    && s != 0
                    && s != WRITING
                    && s % interval == 0
                    && (s / interval) as usize % KEPT == i;
                ok.then_some((s, d))
            })
            .collect();
        checkpoints.sort_unstable();
        let v = AGREEMENT_AT;
        let agreement = (a[v] == b[v] && a[v] % 2 == 0)
            .then(|| AgreementWords::from_words(&a[v + 1..COUNTS_AT]));
        let counts = b[COUNTS_AT..]
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (Bucket::of(i), *n))
            .collect();
        Ok(Snapshot {
            comm_id: k[0],
            context: k[1],
            seq: b[1] / 2,
            digest: stable.then_some(a[2]),
            unsequenced: b[3],
            interval,
            nranks: a[5],
            nnodes: a[6],
            policy: b[7] & FLAG_POLICY != 0,
            finalized: b[7] & FLAG_FINALIZED != 0,
            checkpoints,
            agreement,
            counts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_maps::MapView;
    use std::path::PathBuf;

    fn scratch() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "ncclbpf-seq-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn decision(i: u64) -> (i32, u64, Decision) {
        (
            (i % 5) as i32,
            8 << (i % 27),
            Decision {
                algo: (i % 3) as i32 - 1,
                proto: (i % 4) as i32 - 1,
                nchannels: (i % 7) as u32,
                applied: i.is_multiple_of(2),
            },
        )
    }

    /// Every record `pid`'s registry in `dir` lists, as a reader gets them.
    fn read(dir: &std::path::Path) -> Vec<Snapshot> {
        let views = MapView::open_all_in(dir, std::process::id()).unwrap();
        let v = views.iter().find(|v| v.name == MAP_NAME).expect("the map");
        assert_eq!(v.spec, spec());
        let (a, b) = (v.entries(), v.entries());
        let mut out: Vec<Snapshot> = a
            .iter()
            .zip(&b)
            .map(|((k, x), (k2, y))| {
                assert_eq!(k, k2);
                Snapshot::from_reads(k, &x[0], &y[0]).unwrap()
            })
            .collect();
        out.sort_by_key(|s| s.context);
        out
    }

    #[test]
    fn a_reader_sees_seq_digest_and_the_last_checkpoints() {
        let dir = scratch();
        let reg = Registry::new(dir.clone());
        let (s, problem) = Sequence::new(Some(&reg), 0xfeed, 8, 2, true);
        assert_eq!(problem, None);
        assert!(s.published());
        let got = read(&dir);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].comm_id, got[0].seq, got[0].digest, got[0].policy),
            (0xfeed, 0, Some(0), true)
        );
        assert_eq!((got[0].nranks, got[0].nnodes, got[0].interval), (8, 2, 256));
        assert!(got[0].checkpoints.is_empty() && !got[0].finalized);

        // 20 intervals and a bit: checkpoints 5 × 256 … 20 × 256 are the 16 kept.
        let n = 20 * INTERVAL + 17;
        let mut h = 0;
        let mut want = vec![];
        for i in 1..=n {
            let (c, b, d) = decision(i);
            assert_eq!(s.record(c, b, &d).0, i);
            h = digest::fold(h, i, c, b, &d);
            if i % INTERVAL == 0 {
                want.push((i, h));
            }
        }
        assert_eq!((s.seq(), s.digest()), (n, h));
        let got = &read(&dir)[0];
        assert_eq!((got.seq, got.digest, got.unsequenced), (n, Some(h), 0));
        assert_eq!(got.checkpoints, want[want.len() - KEPT..]);
        assert_eq!(got.checkpoints[0].0, 5 * INTERVAL);

        s.unsequenced();
        s.unsequenced();
        assert_eq!(read(&dir)[0].unsequenced, 2);
        drop(s);
        let got = &read(&dir)[0];
        assert!(got.finalized, "kept, marked finalized");
        assert_eq!((got.seq, got.digest), (n, Some(h)));
    }

    #[test]
    fn torn_reads_are_not_taken_for_values() {
        let r = Record::fresh(4, 1, true);
        r.seq2.store(6, Ordering::Relaxed);
        r.digest.store(0xd, Ordering::Relaxed);
        checkpoint(&r, 256, 0xa);
        checkpoint(&r, 512, 0xb);
        let k = key(7, 1);
        let a = r.bytes();
        let s = Snapshot::from_reads(&k, &a, &a).unwrap();
        assert_eq!((s.comm_id, s.context), (7, 1));
        assert_eq!((s.seq, s.digest), (3, Some(0xd)));
        assert_eq!(s.checkpoints, [(256, 0xa), (512, 0xb)]);
        // The writer moved on between the two reads: the pair is not trusted; a checkpoint
        // rewritten meanwhile, or caught mid-write, is dropped; the others stay.
        r.seq2.store(7, Ordering::Relaxed);
        let b = r.bytes();
        let s = Snapshot::from_reads(&k, &a, &b).unwrap();
        assert_eq!((s.seq, s.digest), (3, None));
        r.seq2.store(8, Ordering::Relaxed);
        r.checkpoints[2][0].store(WRITING, Ordering::Relaxed);
        let c = r.bytes();
        let s = Snapshot::from_reads(&k, &c, &c).unwrap();
        assert_eq!((s.seq, s.digest), (4, Some(0xd)));
        assert_eq!(s.checkpoints, [(256, 0xa)]);
        checkpoint(&r, 256 + 16 * 256, 0xc);
        let s = Snapshot::from_reads(&k, &c, &r.bytes()).unwrap();
        assert_eq!(s.checkpoints, [], "slot 1 rewritten between the reads");
        // Another shape or format is refused.
        assert!(Snapshot::from_reads(&k[..8], &a, &a).is_err());
        assert!(Snapshot::from_reads(&k, &a[..64], &a[..64]).is_err());
        let mut other = a.clone();
        other[0] = 1;
        let e = Snapshot::from_reads(&k, &other, &other).unwrap_err();
        assert!(
            e.contains("format 1") && e.contains("another ncclbpf version"),
            "{e}"
        );
        // A format-1 record (40 words, before the agreement words and the counts) is refused
        // by its format, before its size.
        let mut v1 = a[..40 * 8].to_vec();
        v1[0] = 1;
        let e = Snapshot::from_reads(&k, &v1, &v1).unwrap_err();
        assert!(
            e.contains("record format 1 (this ncclbpf reads format 2"),
            "{e}"
        );
        // Garbage: refused with a reason, never a panic.
        for junk in [vec![], vec![0xffu8; 5], vec![0x5au8; RECORD_SIZE as usize]] {
            assert!(Snapshot::from_reads(&k, &junk, &junk).is_err());
        }
    }

    fn dec(algo: i32, proto: i32, applied: bool) -> Decision {
        Decision {
            algo,
            proto,
            nchannels: 0,
            applied,
        }
    }

    #[test]
    fn every_decision_lands_in_its_bucket_and_back() {
        // Every bucket index is reached by exactly one (collective, algo, proto, applied) of
        // the known values, and read back as it.
        let mut seen = vec![0u32; COUNT_WORDS];
        for c in 0..COLL_BUCKETS as i32 {
            for a in -1..ALGO_BUCKETS as i32 - 1 {
                for p in -1..PROTO_BUCKETS as i32 - 1 {
                    for ok in [false, true] {
                        let i = bucket(c, &dec(a, p, ok));
                        seen[i] += 1;
                        let b = Bucket::of(i);
                        let known = |v: i32, n: usize| (v + 2 < n as i32).then_some(v);
                        assert_eq!(
                            b,
                            Bucket {
                                coll: (c < 8).then_some(c),
                                algo: known(a, ALGO_BUCKETS),
                                proto: known(p, PROTO_BUCKETS),
                                applied: ok
                            },
                            "{c} {a} {p} {ok}"
                        );
                    }
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
        // Values outside the ranges go to the "other" buckets, never out of the counts.
        let other = |c, a, p| Bucket::of(bucket(c, &dec(a, p, true)));
        for (c, a, p) in [
            (-1, -2, -2),
            (i32::MIN, i32::MAX, i32::MIN),
            (14, 7, 3),
            (99, 100, 4),
        ] {
            let b = other(c, a, p);
            assert_eq!(
                (b.coll, b.algo, b.proto, b.applied),
                (None, None, None, true)
            );
        }
        assert_eq!(
            other(4, 1, 2),
            Bucket {
                coll: Some(4),
                algo: Some(1),
                proto: Some(2),
                applied: true
            }
        );
        assert_eq!(bucket(0, &dec(-1, -1, false)), 0);
        assert_eq!(
            bucket(i32::MAX, &dec(i32::MAX, i32::MAX, true)),
            COUNT_WORDS - 1
        );
    }

    #[test]
    fn stray_counts_reach_the_record_at_the_next_decision_or_at_the_end() {
        let dir = scratch();
        let reg = Registry::new(dir.clone());
        let (s, _) = Sequence::new(Some(&reg), 0xd0, 4, 1, true);
        let total = |dir: &std::path::Path| read(dir)[0].counts.iter().map(|(_, n)| n).sum::<u64>();
        s.count(4, &dec(1, 2, true));
        s.count_stray(4, &dec(1, 2, true));
        s.count_stray(2, &dec(0, 0, true));
        assert_eq!(s.counts().sum::<u64>(), 3, "the context sees them at once");
        assert_eq!(total(&dir), 1, "outside, not yet");
        s.count(4, &dec(1, 2, true));
        assert_eq!(total(&dir), 4, "folded by the writer's next decision");
        s.count_stray(2, &dec(0, 0, true));
        drop(s);
        let r = &read(&dir)[0];
        assert_eq!(
            r.counts.iter().map(|(_, n)| n).sum::<u64>(),
            5,
            "and at the end"
        );
        assert!(r.counts.contains(&(
            Bucket {
                coll: Some(2),
                algo: Some(0),
                proto: Some(0),
                applied: true
            },
            2
        )));
    }

    #[test]
    fn counts_and_agreement_words_are_published_and_private_records_keep_them() {
        let dir = scratch();
        let reg = Registry::new(dir.clone());
        let (shared, _) = Sequence::new(Some(&reg), 0xc0, 4, 1, true);
        let (private, p) = Sequence::new(None, 0xc1, 4, 1, true);
        assert!(shared.published() && !private.published() && p.is_none());
        for s in [&shared, &private] {
            for _ in 0..3 {
                s.count(4, &dec(1, 2, true));
            }
            s.count(2, &dec(-1, -1, false));
            s.count(77, &dec(9, 0, true));
        }
        let want = vec![
            (
                Bucket {
                    coll: Some(2),
                    algo: Some(-1),
                    proto: Some(-1),
                    applied: false,
                },
                1,
            ),
            (
                Bucket {
                    coll: Some(4),
                    algo: Some(1),
                    proto: Some(2),
                    applied: true,
                },
                3,
            ),
            (
                Bucket {
                    coll: None,
                    algo: None,
                    proto: Some(0),
                    applied: true,
                },
                1,
            ),
        ];
        let from_map = read(&dir);
        assert_eq!(from_map[0].counts, want);
        let own = private.snapshot(0xc1, 9).unwrap();
        assert_eq!((own.comm_id, own.context), (0xc1, 9));
        assert_eq!(own.counts, want, "a private record counts the same");
        assert_eq!(private.counts().sum::<u64>(), 5);
        // No agreement: state none, no epochs.
        assert_eq!(from_map[0].agreement, Some(AgreementWords::NONE));
        let w = AgreementWords {
            state: agreement_state::WAITING,
            used: 3,
            current: 5,
            waiting_for: 4,
            waiting_since_ns: 1_700_000_000_000_000_000,
            epoch: 32,
            delay: 2,
        };
        shared.publish_agreement(&w);
        private.publish_agreement(&w);
        assert_eq!(read(&dir)[0].agreement, Some(w));
        assert_eq!(private.snapshot(0xc1, 0).unwrap().agreement, Some(w));
        // Caught between the two reads of a change: not trusted.
        let r = shared.out();
        let a = r.bytes();
        shared.publish_agreement(&AgreementWords::NONE);
        let s = Snapshot::from_reads(&key(0xc0, 0), &a, &r.bytes()).unwrap();
        assert_eq!(s.agreement, None);
        r.agreement_version.fetch_add(1, Ordering::Relaxed);
        let odd = r.bytes();
        assert_eq!(
            Snapshot::from_reads(&key(0xc0, 0), &odd, &odd)
                .unwrap()
                .agreement,
            None
        );
        assert_eq!(agreement_state::name(3), Some("waiting"));
        assert_eq!(agreement_state::name(5), None);
    }

    #[test]
    fn finalized_records_make_room_live_ones_do_not() {
        let dir = scratch();
        let reg = Registry::new(dir.clone());
        let mut live: Vec<Sequence> = (0..MAX_RECORDS as u64)
            .map(|c| {
                let (s, p) = Sequence::new(Some(&reg), c, 2, 1, true);
                assert_eq!(p, None, "comm {c}");
                s
            })
            .collect();
        // Full of live communicators: the next keeps its sequence to itself, and says why.
        let (s, p) = Sequence::new(Some(&reg), 1000, 2, 1, true);
        assert!(!s.published());
        assert!(p.unwrap().contains("full"));
        let (c, b, d) = decision(1);
        assert_eq!(s.record(c, b, &d).0, 1, "still sequenced");
        // One finalized: its slot goes to the next communicator; the others stay.
        drop(live.remove(10));
        let (s, p) = Sequence::new(Some(&reg), 2000, 2, 1, true);
        assert_eq!(p, None);
        assert!(s.published());
        let comms: Vec<u64> = read(&dir).iter().map(|r| r.comm_id).collect();
        assert_eq!(comms.len(), MAX_RECORDS as usize);
        assert!(comms.contains(&2000) && !comms.contains(&10) && comms.contains(&11));
        // Without a registry, nothing is published and nothing is wrong.
        let (s, p) = Sequence::new(None, 1, 2, 1, false);
        assert!(!s.published() && p.is_none());
    }
}
