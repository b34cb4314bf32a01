//! The per-connection table of the net data path, in shared memory for outside readers.
//!
//! The net plugin claims one slot per connection end and updates it on every post, completion,
//! error and close; `ncclbpf status` (and any other tool of the same user) reads it from
//! outside, without asking the process anything, so it works while the process is stuck
//! inside a collective or stopped.
//!
//! # Layout
//!
//! The table is the plugin's runtime map [`TABLE_NAME`] (`ncclbpf_conns`, listed in the
//! registry like any map, see [`crate::registry`]): an array of `1 + capacity` values of
//! [`SLOT_BYTES`] (128) bytes, every field a little-endian `u64` word written atomically.
//! Entry 0 is the table header, entries `1..` are the slots.
//!
//! ```text
//! header word 0   TABLE_MAGIC ("NCBPCONN")
//!             1   LAYOUT_VERSION (low 32 bits) | SLOT_BYTES (high 32)
//!             2   capacity (slots)
//!             3   clock of every timestamp: 6 = CLOCK_MONOTONIC_COARSE, nanoseconds
//!             4   that clock at creation       } read together: the reference that turns a
//!             5   CLOCK_REALTIME at creation   } timestamp into wall-clock time
//!             6   pid of the writer
//!             7   policy reloads the process accepted (`ncclbpf reload`, also staged)
//!             8   policy reloads the process refused or that failed
//! slot   word 0   state: generation (high 32) | direction (low 8: 0 free, 1 send, 2 recv)
//!             1   connection id (the same at both ends of a connection)
//!             2   communicator id (NCCL's comm hash, net v11+; 0 when unknown)
//!             3   device
//!             4   peer port (bits 0-15) | local port (16-31) | peer address family (32-39:
//!                 0 unknown, 4, 6)
//!             5-6 peer address, 16 bytes big-endian (IPv4 as ::ffff:a.b.c.d)
//!             7   opened at (ns)
//!             8   bytes moved by completed requests
//!             9   requests completed
//!            10   requests failed
//!            11   requests pending (posted, neither completed nor failed)
//!            12   busy since (ns): when the pending count last went from 0 to 1
//!            13   last progress (ns): the last completion, or chunk of a message moved
//!                 (opening counts as progress)
//!            14   runs of the policy program at this end's post hook (`net/isend` of a send
//!                 end, `net/irecv` of a receive end)
//!            15   runs of the policy program at `net/complete` (completions and failures)
//! ```
//!
//! Words 8-15 of a slot are its own cache line: the data path writes only those.
//!
//! A reader refuses a table whose magic, version, slot size or clock it does not know
//! ([`ConnTableView::new`]): a new layout gets a new [`LAYOUT_VERSION`].
//!
//! # Time
//!
//! Timestamps are `CLOCK_MONOTONIC_COARSE` nanoseconds of the writer ([`now_ns`]): the
//! monotonic clock as of the last scheduler tick (a few milliseconds of resolution, plenty for
//! stalls counted in seconds), read through the vDSO without a system call in about 6-10 ns,
//! where a full `CLOCK_MONOTONIC` read cost 33 ns on the (virtual) machine measured. A reader on
//! the same host compares them with its own [`now_ns`] (the same clock). A reader in another
//! time namespace (whose monotonic clock is offset) maps its `CLOCK_REALTIME` through the
//! header's reference pair instead ([`ConnTableView::now_ns`]), and [`TableClock::wall_ns`]
//! turns a timestamp into wall-clock time (for an exporter's `*_timestamp_seconds`), to within
//! a tick.
//!
//! # Stalls
//!
//! A connection with requests pending has been *waiting* since the later of its last
//! progress and the moment it became busy ([`ConnSnapshot::waiting_ns`]); it is *stalled*
//! when that wait is longer than a threshold ([`ConnSnapshot::stalled`]). A connection with
//! nothing pending is idle, never stalled, however long ago it last moved.
//!
//! # Consistency
//!
//! Counters are updated by one writer per slot (the connection's lock), the last-progress word
//! also by the connection's helper threads. A slot is claimed by writing its fields, then its
//! state with a new generation (Release); freed by clearing the direction. A reader reads the
//! state, the fields, then the state again, and keeps the record only if both reads agree.

use crate::map::{MapSpec, MapType};
use crate::registry::{MapView, Registry, RegistryError};
use std::io;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// The runtime map that holds the table.
pub const TABLE_NAME: &str = "ncclbpf_conns";
/// "NCBPCONN", little-endian.
pub const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"NCBPCONN");
/// The layout described in the module documentation.
/// Version 2 added the reload counts (header words 7 and 8) and the policy runs (slot words 14
/// and 15).
pub const LAYOUT_VERSION: u32 = 2;
/// Bytes per slot (and per header).
pub const SLOT_BYTES: u32 = 128;
const WORDS: usize = SLOT_BYTES as usize / 8;
/// The header's clock id: Linux's `CLOCK_MONOTONIC_COARSE`.
pub const CLOCK_ID: u64 = libc::CLOCK_MONOTONIC_COARSE as u64;
/// Clock ids a reader accepts: `CLOCK_MONOTONIC` (1) and `CLOCK_MONOTONIC_COARSE` (6), one
/// timeline at two resolutions.
const KNOWN_CLOCKS: [u64; 2] = [libc::CLOCK_MONOTONIC as u64, CLOCK_ID];

// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_CAPACITY: usize = 2;
const H_CLOCK: usize = 3;
const H_MONO_REF: usize = 4;
const H_REAL_REF: usize = 5;
const H_PID: usize = 6;
const H_RELOADS_OK: usize = 7;
const H_RELOADS_FAILED: usize = 8;

// Slot words.
const S_STATE: usize = 0;
const S_CONN: usize = 1;
const S_COMM: usize = 2;
const S_DEV: usize = 3;
const S_PORTS: usize = 4;
const S_ADDR_HI: usize = 5;
const S_ADDR_LO: usize = 6;
const S_OPENED: usize = 7;
const S_BYTES: usize = 8;
const S_MESSAGES: usize = 9;
const S_ERRORS: usize = 10;
const S_INFLIGHT: usize = 11;
const S_BUSY_SINCE: usize = 12;
const S_PROGRESS: usize = 13;
const S_POST_RUNS: usize = 14;
const S_COMPLETE_RUNS: usize = 15;

/// Which end of a unidirectional NCCL connection a slot describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnDirection {
    Send,
    Recv,
}

impl ConnDirection {
    fn code(self) -> u64 {
        match self {
            ConnDirection::Send => 1,
            ConnDirection::Recv => 2,
        }
    }
    fn from_code(c: u64) -> Option<Self> {
        match c {
            1 => Some(ConnDirection::Send),
            2 => Some(ConnDirection::Recv),
            _ => None,
        }
    }
    /// `send` or `recv`.
    pub fn name(self) -> &'static str {
        match self {
            ConnDirection::Send => "send",
            ConnDirection::Recv => "recv",
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; both clocks exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: the clock of every timestamp in the table (a vDSO
/// read of the last tick's time).
#[inline]
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// What a connection end says about itself when it claims a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLabels {
    pub direction: ConnDirection,
    pub conn_id: u64,
    /// NCCL's communicator hash (net v11+), 0 when unknown.
    pub comm_id: u64,
    pub dev: u32,
    /// The other end's address (its control stream), if known.
    pub peer_ip: Option<IpAddr>,
    pub peer_port: u16,
    /// This end's port of the control stream (the other end's `peer_port`), 0 if unknown.
    pub local_port: u16,
}

impl ConnLabels {
    /// Labels with only a direction, an id and a peer port (the rest unknown).
    pub fn new(direction: ConnDirection, conn_id: u64, peer_port: u16) -> ConnLabels {
        ConnLabels {
            direction,
            conn_id,
            comm_id: 0,
            dev: 0,
            peer_ip: None,
            peer_port,
            local_port: 0,
        }
    }
}

/// One record read out of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnSnapshot {
    /// Slot index (0-based; the map entry is `slot + 1`).
    pub slot: usize,
    pub direction: ConnDirection,
    pub conn_id: u64,
    pub comm_id: u64,
    pub dev: u32,
    pub peer_ip: Option<IpAddr>,
    pub peer_port: u16,
    pub local_port: u16,
    /// Timestamps: the writer's `CLOCK_MONOTONIC_COARSE` in nanoseconds (see the module docs).
    pub opened_ns: u64,
    pub bytes: u64,
    pub messages: u64,
    pub errors: u64,
    pub inflight: u64,
    /// When the pending count last went from 0 to 1 (meaningful while `inflight > 0`).
    pub busy_since_ns: u64,
    /// The last completion or chunk moved (the opening, before any).
    pub last_progress_ns: u64,
    /// Runs of the policy program at the post hook (`net/isend` or `net/irecv`).
    pub post_runs: u64,
    /// Runs of the policy program at `net/complete`.
    pub complete_runs: u64,
}

impl ConnSnapshot {
    /// The peer's address and port, if its address is known.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_ip.map(|ip| SocketAddr::new(ip, self.peer_port))
    }

    /// `addr:port` (`[v6]:port`), or `?:port` when the address is unknown.
    pub fn peer_text(&self) -> String {
        match self.peer_addr() {
            Some(a) => a.to_string(),
            None => format!("?:{}", self.peer_port),
        }
    }

    /// Nanoseconds since the connection last made progress, at `now` (the table's clock).
    pub fn since_progress_ns(&self, now: u64) -> u64 {
        now.saturating_sub(self.last_progress_ns)
    }

    /// While requests are pending: nanoseconds they have waited without any progress (since
    /// the later of the last progress and the moment the connection became busy). `None`
    /// when nothing is pending.
    pub fn waiting_ns(&self, now: u64) -> Option<u64> {
        (self.inflight > 0)
            .then(|| now.saturating_sub(self.last_progress_ns.max(self.busy_since_ns)))
    }

    /// Requests pending and no progress for longer than `after_ns`.
    pub fn stalled(&self, now: u64, after_ns: u64) -> bool {
        self.waiting_ns(now).is_some_and(|w| w > after_ns)
    }
}

/// The writer's clock reference ([`ConnTableView::clock`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableClock {
    /// The writer's `CLOCK_MONOTONIC` and `CLOCK_REALTIME` at the same moment (creation).
    pub mono_ref_ns: u64,
    pub real_ref_ns: u64,
}

impl TableClock {
    /// A timestamp of the table as nanoseconds since the Unix epoch.
    pub fn wall_ns(&self, mono_ns: u64) -> u64 {
        self.real_ref_ns
            .wrapping_add(mono_ns)
            .wrapping_sub(self.mono_ref_ns)
    }
}

fn ip_words(ip: Option<IpAddr>) -> (u64, u64, u64) {
    let (family, octets) = match ip {
        None => (0, [0u8; 16]),
        Some(IpAddr::V4(a)) => (4, a.to_ipv6_mapped().octets()),
        Some(IpAddr::V6(a)) => (6, a.octets()),
    };
    (
        family,
        u64::from_be_bytes(octets[..8].try_into().expect("8 bytes")),
        u64::from_be_bytes(octets[8..].try_into().expect("8 bytes")),
    )
}

fn ip_from_words(family: u64, hi: u64, lo: u64) -> Option<IpAddr> {
    let mut o = [0u8; 16];
    o[..8].copy_from_slice(&hi.to_be_bytes());
    o[8..].copy_from_slice(&lo.to_be_bytes());
    let v6 = Ipv6Addr::from(o);
    match family {
        4 => Some(IpAddr::V4(
            v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
        )),
        6 => Some(IpAddr::V6(v6)),
        _ => None,
    }
}

/// Decodes slot `slot` through `word` (the word at an index from the start of entry 0);
/// `None` when free or changed while read.
fn read_slot(word: &dyn Fn(usize) -> u64, slot: usize) -> Option<ConnSnapshot> {
    let base = (slot + 1) * WORDS;
    let w = |i: usize| word(base + i);
    let state = w(S_STATE);
    let direction = ConnDirection::from_code(state & 0xff)?;
    let ports = w(S_PORTS);
    let snap = ConnSnapshot {
        slot,
        direction,
        conn_id: w(S_CONN),
        comm_id: w(S_COMM),
        dev: w(S_DEV) as u32,
        peer_ip: ip_from_words((ports >> 32) & 0xff, w(S_ADDR_HI), w(S_ADDR_LO)),
        peer_port: ports as u16,
        local_port: (ports >> 16) as u16,
        opened_ns: w(S_OPENED),
        bytes: w(S_BYTES),
        messages: w(S_MESSAGES),
        errors: w(S_ERRORS),
        // Read before the timestamps: a post stores busy-since before it raises the count.
        inflight: w(S_INFLIGHT),
        busy_since_ns: w(S_BUSY_SINCE),
        last_progress_ns: w(S_PROGRESS),
        post_runs: w(S_POST_RUNS),
        complete_runs: w(S_COMPLETE_RUNS),
    };
    fence(Ordering::Acquire);
    (w(S_STATE) == state).then_some(snap)
}

/// Every live record, through `word` as for [`read_slot`]; a slot that changes while read is
/// read again (a few times).
fn read_all(word: &dyn Fn(usize) -> u64, capacity: usize) -> Vec<ConnSnapshot> {
    (0..capacity)
        .filter_map(|slot| {
            (0..4).find_map(|_| {
                if word((slot + 1) * WORDS + S_STATE) & 0xff == 0 {
                    return Some(None);
                }
                read_slot(word, slot).map(Some)
            })?
        })
        .collect()
}

/// What keeps the words alive: the registry's map (an `Arc<Map>`, for outside readers) or
/// private memory (a `Box<[AtomicU64]>`: tests, or when no segment could be made).
type Backing = Box<dyn std::any::Any + Send + Sync>;

/// Per-connection records with a fixed number of slots.
pub struct ConnTable {
    /// Word 0 of entry 0; `(1 + capacity) * WORDS` words, kept alive by `_backing`.
    words: *const AtomicU64,
    capacity: usize,
    free: Mutex<Vec<usize>>,
    _backing: Backing,
}

// SAFETY: every access to the words goes through atomics; the memory lives as long as self.
unsafe impl Send for ConnTable {}
// SAFETY: as above.
unsafe impl Sync for ConnTable {}

/// The map spec of a table of `capacity` slots.
pub fn table_spec(capacity: usize) -> MapSpec {
    MapSpec {
        name: TABLE_NAME.into(),
        kind: MapType::Array,
        key_size: 4,
        value_size: SLOT_BYTES,
        max_entries: (capacity + 1) as u32,
    }
}

impl ConnTable {
    /// A table in private memory: counts connections, invisible to outside readers.
    pub fn new(capacity: usize) -> Self {
        let mem: Box<[AtomicU64]> = (0..(capacity + 1) * WORDS)
            .map(|_| AtomicU64::new(0))
            .collect();
        let words = mem.as_ptr();
        ConnTable::over(words, capacity, Box::new(mem))
    }

    /// A table in `registry`'s runtime map [`TABLE_NAME`], which outside readers find through
    /// the registry ([`ConnTableView`]).
    pub fn shared(registry: &Registry, capacity: usize) -> Result<Self, RegistryError> {
        let map = registry.runtime(&table_spec(capacity))?;
        let layout = map.array_layout().expect("an array map with 4-byte keys");
        let words = layout.values as *const AtomicU64;
        Ok(ConnTable::over(words, capacity, Box::new(map)))
    }

    fn over(words: *const AtomicU64, capacity: usize, backing: Backing) -> ConnTable {
        let t = ConnTable {
            words,
            capacity,
            free: Mutex::new((0..capacity).rev().collect()),
            _backing: backing,
        };
        let (mono, real) = (now_ns(), realtime_ns());
        let h = |i: usize, v: u64| t.word(i).store(v, Ordering::Relaxed);
        h(
            H_VERSION,
            u64::from(LAYOUT_VERSION) | (u64::from(SLOT_BYTES) << 32),
        );
        h(H_CAPACITY, capacity as u64);
        h(H_CLOCK, CLOCK_ID);
        h(H_MONO_REF, mono);
        h(H_REAL_REF, real);
        h(H_PID, u64::from(std::process::id()));
        t.word(H_MAGIC).store(TABLE_MAGIC, Ordering::Release);
        t
    }

    #[inline]
    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < (self.capacity + 1) * WORDS);
        // SAFETY: i is inside the table's words (callers index slots below capacity), which
        // the backing keeps alive as long as self; 8-aligned (map values are, and so is a
        // boxed slice of AtomicU64).
        unsafe { &*self.words.add(i) }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts a policy reload request this process answered: accepted (`ok`) or not. Rare
    /// (a person asked), so an atomic add.
    pub fn count_reload(&self, ok: bool) {
        let w = if ok { H_RELOADS_OK } else { H_RELOADS_FAILED };
        self.word(w).fetch_add(1, Ordering::Relaxed);
    }

    /// Claims a slot for a new connection; `None` when the table is full (the connection
    /// still works, it is just not counted).
    pub fn register(&self, labels: &ConnLabels) -> Option<ConnSlotGuard<'_>> {
        let idx = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        let base = (idx + 1) * WORDS;
        let w = |i: usize| self.word(base + i);
        let generation = (w(S_STATE).load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
        // The state is free (direction 0) since the slot was released: a reader that sees any
        // field below sees that or the new state after it (seqlock).
        fence(Ordering::Release);
        let (family, hi, lo) = ip_words(labels.peer_ip);
        let now = now_ns();
        for (i, v) in [
            (S_CONN, labels.conn_id),
            (S_COMM, labels.comm_id),
            (S_DEV, u64::from(labels.dev)),
            (
                S_PORTS,
                u64::from(labels.peer_port) | (u64::from(labels.local_port) << 16) | (family << 32),
            ),
            (S_ADDR_HI, hi),
            (S_ADDR_LO, lo),
            (S_OPENED, now),
            (S_BYTES, 0),
            (S_MESSAGES, 0),
            (S_ERRORS, 0),
            (S_INFLIGHT, 0),
            (S_BUSY_SINCE, 0),
            (S_PROGRESS, now),
            (S_POST_RUNS, 0),
            (S_COMPLETE_RUNS, 0),
        ] {
            w(i).store(v, Ordering::Relaxed);
        }
        w(S_STATE).store(
            (generation << 32) | labels.direction.code(),
            Ordering::Release,
        );
        Some(ConnSlotGuard {
            table: self,
            idx,
            _not_sync: PhantomData,
        })
    }

    /// Every live connection's record.
    pub fn snapshot(&self) -> Vec<ConnSnapshot> {
        read_all(&|i| self.word(i).load(Ordering::Acquire), self.capacity)
    }
}

/// A claimed slot; the slot is released when the guard drops. One writer per slot: the guard
/// is `Send` but not `Sync` (the plugin calls it under its connection's lock); helper threads
/// stamp progress through a [`ProgressMark`].
pub struct ConnSlotGuard<'a> {
    table: &'a ConnTable,
    idx: usize,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl<'a> ConnSlotGuard<'a> {
    #[inline]
    fn w(&self, i: usize) -> &'a AtomicU64 {
        self.table.word((self.idx + 1) * WORDS + i)
    }
    pub fn index(&self) -> usize {
        self.idx
    }
    /// This connection's record now.
    pub fn snapshot(&self) -> ConnSnapshot {
        let t = self.table;
        read_slot(&|i| t.word(i).load(Ordering::Acquire), self.idx)
            .expect("a claimed slot is live and only this guard changes its state")
    }
    /// A request was posted. Reads the (coarse) clock only when the connection becomes busy.
    #[inline]
    pub fn posted(&self) {
        let n = self.w(S_INFLIGHT).load(Ordering::Relaxed);
        if n == 0 {
            self.w(S_BUSY_SINCE).store(now_ns(), Ordering::Relaxed);
        }
        // Release: a reader that sees the count sees busy-since with it.
        self.w(S_INFLIGHT).store(n + 1, Ordering::Release);
    }
    /// A request completed with `bytes` moved: one (coarse) clock read.
    #[inline]
    pub fn completed(&self, bytes: u64) {
        self.w(S_PROGRESS).store(now_ns(), Ordering::Relaxed);
        let n = self.w(S_INFLIGHT).load(Ordering::Relaxed);
        self.w(S_INFLIGHT)
            .store(n.saturating_sub(1), Ordering::Release);
        let m = self.w(S_MESSAGES);
        m.store(m.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let b = self.w(S_BYTES);
        b.store(
            b.load(Ordering::Relaxed).wrapping_add(bytes),
            Ordering::Relaxed,
        );
    }
    /// The policy program at this end's post hook ran (`complete`: at `net/complete`). A
    /// load and a store on the slot's counter line, only when a program is attached.
    #[inline]
    pub fn ran(&self, complete: bool) {
        let c = self.w(if complete {
            S_COMPLETE_RUNS
        } else {
            S_POST_RUNS
        });
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    /// A request failed (not progress).
    #[inline]
    pub fn failed(&self) {
        let n = self.w(S_INFLIGHT).load(Ordering::Relaxed);
        self.w(S_INFLIGHT)
            .store(n.saturating_sub(1), Ordering::Release);
        let e = self.w(S_ERRORS);
        e.store(e.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    /// A handle that stamps this slot's last progress from another thread (a helper moving a
    /// chunk). It must not be used after the guard drops: the plugin joins its helpers first
    /// (a late stamp would only touch the next owner's timestamp, never memory).
    pub fn progress_mark(&self) -> ProgressMark<'a> {
        ProgressMark {
            word: self.w(S_PROGRESS),
        }
    }
}

impl Drop for ConnSlotGuard<'_> {
    fn drop(&mut self) {
        let s = self.w(S_STATE);
        // Keep the generation, clear the direction.
        s.store(s.load(Ordering::Relaxed) & !0xff, Ordering::Release);
        self.table
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.idx);
    }
}

/// Stamps a connection's last progress ([`ConnSlotGuard::progress_mark`]).
#[derive(Clone, Copy)]
pub struct ProgressMark<'a> {
    word: &'a AtomicU64,
}

impl ProgressMark<'_> {
    /// Bytes moved now: one (coarse) clock read and a relaxed store.
    #[inline]
    pub fn stamp(&self) {
        self.word.store(now_ns(), Ordering::Relaxed);
    }
}

/// A table of another process, read through its registry's [`TABLE_NAME`] map.
pub struct ConnTableView<'a> {
    view: &'a MapView,
    capacity: usize,
    clock: TableClock,
    /// The writer's monotonic clock is ours (same time namespace).
    same_clock: bool,
}

impl<'a> ConnTableView<'a> {
    /// Checks that `view` is a table whose layout this reader knows, written by `pid`.
    pub fn new(view: &'a MapView, pid: u32) -> Result<ConnTableView<'a>, String> {
        let s = &view.spec;
        let bad = |why: String| Err(format!("{TABLE_NAME}: {why}"));
        if view.name != TABLE_NAME || s.kind != MapType::Array || s.key_size != 4 {
            return bad(format!("not a connection table ({})", s));
        }
        let h = |i: usize| view.array_word(0, i);
        if h(H_MAGIC) != Some(TABLE_MAGIC) {
            return bad("no table header (not a connection table, or not written yet)".into());
        }
        let v = h(H_VERSION).unwrap_or(0);
        let (version, slot_bytes) = (v as u32, (v >> 32) as u32);
        if version != LAYOUT_VERSION || slot_bytes != SLOT_BYTES || s.value_size != SLOT_BYTES {
            return bad(format!(
                "layout version {version} with {slot_bytes}-byte slots; this reader knows \
                 version {LAYOUT_VERSION} with {SLOT_BYTES}-byte slots (use the ncclbpf of the \
                 plugin that wrote it)"
            ));
        }
        let capacity = h(H_CAPACITY).unwrap_or(0) as usize;
        if capacity + 1 != s.max_entries as usize {
            return bad(format!(
                "header says {capacity} slots, the map has {} entries",
                s.max_entries
            ));
        }
        if !h(H_CLOCK).is_some_and(|c| KNOWN_CLOCKS.contains(&c)) {
            return bad(format!("unknown clock {}", h(H_CLOCK).unwrap_or(0)));
        }
        let clock = TableClock {
            mono_ref_ns: h(H_MONO_REF).unwrap_or(0),
            real_ref_ns: h(H_REAL_REF).unwrap_or(0),
        };
        Ok(ConnTableView {
            view,
            capacity,
            clock,
            same_clock: same_time_namespace(pid),
        })
    }

    /// Finds and checks the table among a process's views; `Ok(None)` when it has none (no
    /// connection opened yet, or no net plugin).
    pub fn find(views: &'a [MapView], pid: u32) -> Result<Option<ConnTableView<'a>>, String> {
        views
            .iter()
            .find(|v| v.name == TABLE_NAME)
            .map(|v| ConnTableView::new(v, pid))
            .transpose()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn clock(&self) -> TableClock {
        self.clock
    }

    /// Policy reloads the process accepted and refused ([`ConnTable::count_reload`]).
    pub fn reloads(&self) -> (u64, u64) {
        let h = |i: usize| self.view.array_word(0, i).unwrap_or(0);
        (h(H_RELOADS_OK), h(H_RELOADS_FAILED))
    }

    /// Now, on the writer's clock: our [`now_ns`] when we share its time namespace, else our
    /// `CLOCK_REALTIME` mapped through the table's reference.
    pub fn now_ns(&self) -> u64 {
        if self.same_clock {
            now_ns()
        } else {
            realtime_ns()
                .wrapping_sub(self.clock.real_ref_ns)
                .wrapping_add(self.clock.mono_ref_ns)
        }
    }

    /// Every live connection's record.
    pub fn snapshot(&self) -> Vec<ConnSnapshot> {
        read_all(
            &|i| {
                self.view
                    .array_word((i / WORDS) as u32, i % WORDS)
                    .unwrap_or(0)
            },
            self.capacity,
        )
    }
}

/// Whether process `pid` reads the same `CLOCK_MONOTONIC` as we do: true unless both time
/// namespaces can be read and differ (kernels before 5.6 have none: one clock).
fn same_time_namespace(pid: u32) -> bool {
    let mine = std::fs::read_link("/proc/self/ns/time");
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/time"));
    match (mine, theirs) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    }
}

/// What a reader got from one process ([`read_process_in`]).
pub struct ProcessConns {
    pub capacity: usize,
    pub clock: TableClock,
    /// Now on the table's clock, when the records were read.
    pub now_ns: u64,
    pub conns: Vec<ConnSnapshot>,
}

/// Reads process `pid`'s table through the registry in `dir`: `Ok(None)` if it registered
/// none; an error if its maps cannot be read or the table's layout is unknown.
pub fn read_process_in(dir: &Path, pid: u32) -> Result<Option<ProcessConns>, String> {
    let views = MapView::open_all_in(dir, pid).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => format!("no maps registered ({e})"),
        _ => format!("maps unreadable: {e}"),
    })?;
    let Some(t) = ConnTableView::find(&views, pid)? else {
        return Ok(None);
    };
    let conns = t.snapshot();
    Ok(Some(ProcessConns {
        capacity: t.capacity(),
        clock: t.clock(),
        now_ns: t.now_ns(),
        conns,
    }))
}

/// Live processes whose registry in `dir` lists a connection table, ascending.
pub fn processes_with_table_in(dir: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<u32> = rd
        .flatten()
        .filter_map(|e| {
            let pid = e
                .file_name()
                .to_str()?
                .strip_suffix(".maps")?
                .parse::<u32>()
                .ok()?;
            let text = std::fs::read_to_string(e.path()).ok()?;
            let listed = text
                .lines()
                .any(|l| l.rsplit(' ').next() == Some(TABLE_NAME));
            (listed && crate::registry::pid_alive(pid)).then_some(pid)
        })
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64 as Counter;

    fn labels(direction: ConnDirection, conn_id: u64, peer_port: u16) -> ConnLabels {
        ConnLabels::new(direction, conn_id, peer_port)
    }

    #[test]
    fn counts_and_releases() {
        let t = ConnTable::new(2);
        let a = t.register(&labels(ConnDirection::Send, 7, 1234)).unwrap();
        let b = t.register(&labels(ConnDirection::Recv, 8, 99)).unwrap();
        assert!(
            t.register(&labels(ConnDirection::Send, 9, 0)).is_none(),
            "table is full"
        );
        a.posted();
        a.posted();
        a.completed(100);
        a.failed();
        a.ran(false);
        a.ran(true);
        a.ran(true);
        b.posted();
        let snap = t.snapshot();
        assert_eq!(snap.len(), 2);
        let sa = snap.iter().find(|s| s.conn_id == 7).unwrap();
        assert_eq!(
            (sa.bytes, sa.messages, sa.errors, sa.inflight),
            (100, 1, 1, 0)
        );
        assert_eq!((sa.post_runs, sa.complete_runs), (1, 2));
        assert_eq!(sa.direction, ConnDirection::Send);
        assert_eq!(sa.peer_port, 1234);
        let sb = snap.iter().find(|s| s.conn_id == 8).unwrap();
        assert_eq!(sb.inflight, 1);
        drop(a);
        assert_eq!(t.snapshot().len(), 1);
        let c = t.register(&labels(ConnDirection::Send, 10, 0)).unwrap();
        assert_eq!(
            t.snapshot().iter().find(|s| s.conn_id == 10).unwrap().bytes,
            0,
            "reused slot is reset"
        );
        drop(c);
        drop(b);
        assert!(t.snapshot().is_empty());
    }

    #[test]
    fn labels_round_trip() {
        let t = ConnTable::new(3);
        let v4 = ConnLabels {
            direction: ConnDirection::Recv,
            conn_id: 0xfeed_0000_0000_0001,
            comm_id: 0xa9ee,
            dev: 3,
            peer_ip: Some("10.1.2.3".parse().unwrap()),
            peer_port: 40001,
            local_port: 5555,
        };
        let v6 = ConnLabels {
            peer_ip: Some("fe80::1:2".parse().unwrap()),
            conn_id: 2,
            ..v4
        };
        let none = ConnLabels {
            peer_ip: None,
            conn_id: 3,
            ..v4
        };
        let _g: Vec<_> = [v4, v6, none]
            .iter()
            .map(|l| t.register(l).unwrap())
            .collect();
        let snap = t.snapshot();
        for l in [v4, v6, none] {
            let s = snap.iter().find(|s| s.conn_id == l.conn_id).unwrap();
            assert_eq!(
                (
                    s.direction,
                    s.comm_id,
                    s.dev,
                    s.peer_ip,
                    s.peer_port,
                    s.local_port
                ),
                (
                    l.direction,
                    l.comm_id,
                    l.dev,
                    l.peer_ip,
                    l.peer_port,
                    l.local_port
                )
            );
        }
        let s4 = snap.iter().find(|s| s.conn_id == v4.conn_id).unwrap();
        assert_eq!(s4.peer_text(), "10.1.2.3:40001");
        let s6 = snap.iter().find(|s| s.conn_id == 2).unwrap();
        assert_eq!(s6.peer_text(), "[fe80::1:2]:40001");
        let sn = snap.iter().find(|s| s.conn_id == 3).unwrap();
        assert_eq!(sn.peer_text(), "?:40001");
    }

    /// Longer than two ticks of the coarse clock (HZ 100 and up).
    const TICK: std::time::Duration = std::time::Duration::from_millis(25);

    #[test]
    fn progress_and_pending_times() {
        let t = ConnTable::new(1);
        let before = now_ns();
        let g = t.register(&labels(ConnDirection::Recv, 1, 2)).unwrap();
        let s = g.snapshot();
        assert!(s.opened_ns >= before && s.last_progress_ns == s.opened_ns);
        assert_eq!(s.waiting_ns(s.opened_ns + 5), None, "nothing pending");
        assert!(!s.stalled(u64::MAX, 0), "idle is never stalled");

        std::thread::sleep(TICK);
        g.posted();
        let s = g.snapshot();
        assert!(s.busy_since_ns > s.last_progress_ns, "busy since the post");
        // Waiting counts from the post, not from the (older) last progress.
        assert_eq!(s.waiting_ns(s.busy_since_ns + 7), Some(7));
        assert!(s.stalled(s.busy_since_ns + 8, 7));
        assert!(!s.stalled(s.busy_since_ns + 7, 7));

        // A second post while busy keeps the start of the busy period.
        let busy = s.busy_since_ns;
        g.posted();
        assert_eq!(g.snapshot().busy_since_ns, busy);

        // A completion is progress: waiting counts from it while one request is pending.
        std::thread::sleep(TICK);
        g.completed(10);
        let s = g.snapshot();
        assert!(s.last_progress_ns > busy);
        assert_eq!(s.inflight, 1);
        assert_eq!(s.waiting_ns(s.last_progress_ns + 3), Some(3));

        // A helper's chunk is progress too.
        std::thread::sleep(TICK);
        let mark = g.progress_mark();
        std::thread::scope(|sc| {
            sc.spawn(move || mark.stamp());
        });
        let after = g.snapshot();
        assert!(after.last_progress_ns > s.last_progress_ns);

        // A failure is not progress; counts never wrap below zero.
        g.failed();
        g.failed();
        let f = g.snapshot();
        assert_eq!((f.inflight, f.errors), (0, 2));
        assert_eq!(f.last_progress_ns, after.last_progress_ns);
        g.completed(1);
        assert_eq!(g.snapshot().inflight, 0);
        assert!(now_ns() >= f.last_progress_ns);
    }

    #[test]
    fn the_clock_reference_maps_to_wall_time() {
        let c = TableClock {
            mono_ref_ns: 1_000,
            real_ref_ns: 1_700_000_000_000_000_000,
        };
        assert_eq!(c.wall_ns(1_500), 1_700_000_000_000_000_500);
    }

    fn scratch() -> std::path::PathBuf {
        static N: Counter = Counter::new(0);
        let d = std::env::temp_dir().join(format!(
            "ncclbpf-conns-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn outside_readers_see_the_shared_table() {
        let dir = scratch();
        let r = Registry::new(dir.clone());
        let pid = std::process::id();
        assert!(read_process_in(&dir, pid).is_err(), "nothing registered");
        let t = ConnTable::shared(&r, 4).unwrap();
        assert_eq!(processes_with_table_in(&dir), vec![pid]);
        let l = ConnLabels {
            direction: ConnDirection::Recv,
            conn_id: 42,
            comm_id: 0xc0ffee,
            dev: 1,
            peer_ip: Some("127.0.0.1".parse().unwrap()),
            peer_port: 41000,
            local_port: 42000,
        };
        let g = t.register(&l).unwrap();
        g.posted();
        g.completed(4096);
        g.posted();
        t.count_reload(true);
        t.count_reload(false);
        t.count_reload(true);
        let views = MapView::open_all_in(&dir, pid).unwrap();
        let view = ConnTableView::find(&views, pid).unwrap().unwrap();
        assert_eq!(view.reloads(), (2, 1));
        let got = read_process_in(&dir, pid).unwrap().unwrap();
        assert_eq!(got.capacity, 4);
        assert_eq!(got.conns, t.snapshot(), "the same records inside and out");
        let c = &got.conns[0];
        assert_eq!(
            (c.conn_id, c.bytes, c.messages, c.inflight),
            (42, 4096, 1, 1)
        );
        assert!(got.now_ns >= c.last_progress_ns, "one clock");
        let wall = got.clock.wall_ns(c.opened_ns);
        let real = realtime_ns();
        assert!(
            wall <= real && real - wall < 60_000_000_000,
            "{wall} {real}"
        );
        drop(g);
        assert!(
            read_process_in(&dir, pid)
                .unwrap()
                .unwrap()
                .conns
                .is_empty()
        );
    }

    #[test]
    fn readers_refuse_layouts_they_do_not_know() {
        let dir = scratch();
        let r = Registry::new(dir.clone());
        let pid = std::process::id();
        // A map of the table's name and shape whose header says version 1 (before the reload
        // counts).
        let m = r.runtime(&table_spec(2)).unwrap();
        let mut header = vec![0u8; SLOT_BYTES as usize];
        header[..8].copy_from_slice(&TABLE_MAGIC.to_le_bytes());
        header[8..16].copy_from_slice(&(1u64 | (u64::from(SLOT_BYTES) << 32)).to_le_bytes());
        header[16..24].copy_from_slice(&2u64.to_le_bytes());
        header[24..32].copy_from_slice(&CLOCK_ID.to_le_bytes());
        m.update(&0u32.to_le_bytes(), &header, 0).unwrap();
        let e = read_process_in(&dir, pid).err().unwrap();
        assert!(
            e.contains("layout version 1") && e.contains("knows version 2"),
            "{e}"
        );
        // No header at all.
        m.update(&0u32.to_le_bytes(), &[0u8; SLOT_BYTES as usize], 0)
            .unwrap();
        let e = read_process_in(&dir, pid).err().unwrap();
        assert!(e.contains("no table header"), "{e}");
        // The right version but a capacity that does not match the map.
        header[8..16].copy_from_slice(
            &(u64::from(LAYOUT_VERSION) | (u64::from(SLOT_BYTES) << 32)).to_le_bytes(),
        );
        header[16..24].copy_from_slice(&7u64.to_le_bytes());
        m.update(&0u32.to_le_bytes(), &header, 0).unwrap();
        let e = read_process_in(&dir, pid).err().unwrap();
        assert!(e.contains("7 slots"), "{e}");
    }

    #[test]
    fn a_slot_changing_under_a_reader_is_never_mixed() {
        // A writer re-registers one slot with paired values while readers check the pairs.
        let t = ConnTable::new(1);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..20_000u64 {
                    let l = ConnLabels {
                        comm_id: i,
                        dev: i as u32,
                        ..labels(ConnDirection::Send, i, i as u16)
                    };
                    drop(t.register(&l).unwrap());
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut seen = 0;
            while !stop.load(Ordering::Relaxed) {
                for c in t.snapshot() {
                    assert_eq!(c.comm_id, c.conn_id);
                    assert_eq!(u64::from(c.dev), c.conn_id);
                    assert_eq!(c.peer_port, c.conn_id as u16);
                    seen += 1;
                }
            }
            let _ = seen;
        });
    }
}
