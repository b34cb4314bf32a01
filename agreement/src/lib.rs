//! Rank agreement (issue 9, `docs/design/agreement.md`): every rank of a communicator ends an epoch
//! every K collectives, makes a [`Record`] of it, and the records travel to every other rank
//! over the plugin's own connections; once a rank holds all `nranks` records of an epoch it
//! [`combine`]s them, the same way on every rank, into the values tuner programs see.
//!
//! * [`record`]: a record and its bytes on the wire (a control frame's payload);
//! * [`board`]: the records a process holds, each once, bounded;
//! * [`combine`]: the deterministic combination, and the checks that every rank runs the same
//!   configuration and made the same decisions;
//! * [`local`]: records between the processes of one node, through files in the registry;
//! * [`net_busy`]: per communicator, the time its net connections had a request in flight (the
//!   net plugin keeps it, the tuner's agreement posts it per epoch: both read it here, so
//!   neither plugin crate depends on the other);
//! * this module: the process's exchange, between the tuner (which posts its records and waits
//!   for the others') and the net plugin (which carries them: [`set_net`], [`deliver`]), and the
//!   thread that moves them while a tuner context runs the agreement.
//!
//! Records are flooded: a process sends its own records, and every record it receives for the
//! first time, on every send connection it has (to whichever communicator it belongs), and a
//! connection that opens late first gets every record held ([`backlog`]). So a record reaches
//! every rank that the ranks' connections link together, whichever communicator's connections
//! those are.

pub mod board;
pub mod combine;
pub mod local;
pub mod net_busy;
pub mod record;

pub use board::Insert;
pub use combine::{Combined, Reduce, Verdict, combine};
pub use record::{DecodeError, Record};

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The agreement's settings (the same on every rank, or the first agreement says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Collectives per epoch (K), `NCCL_BPF_AGREEMENT_EPOCH`.
    pub epoch: u64,
    /// Epochs between an epoch's end and the collective that sees it (D), `NCCL_BPF_AGREEMENT_DELAY`.
    pub delay: u64,
    /// How long a rank waits for the records it needs, `NCCL_BPF_AGREEMENT_TIMEOUT` (seconds).
    pub timeout: Duration,
}

pub const EPOCH_ENV: &str = "NCCL_BPF_AGREEMENT_EPOCH";
/// The largest D: ranks are at most D epochs apart, and the board keeps 2·D + 4 epochs of a
/// communicator past what its slowest local context needs.
pub const MAX_DELAY: u64 = 16;
pub const DELAY_ENV: &str = "NCCL_BPF_AGREEMENT_DELAY";
pub const TIMEOUT_ENV: &str = "NCCL_BPF_AGREEMENT_TIMEOUT";

impl Default for Params {
    fn default() -> Params {
        Params {
            epoch: 64,
            delay: 2,
            timeout: Duration::from_secs(60),
        }
    }
}

impl Params {
    /// From the environment; a bad value is an error naming the variable (the caller logs it
    /// and runs without the agreement).
    pub fn from_env() -> Result<Params, String> {
        Params::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Params, String> {
        let d = Params::default();
        let num = |k: &str, lo: u64, hi: u64, dflt: u64| -> Result<u64, String> {
            match get(k) {
                None => Ok(dflt),
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => Ok(n),
                    _ => Err(format!(
                        "{k}={v:?}: expected a whole number from {lo} to {hi}"
                    )),
                },
            }
        };
        Ok(Params {
            epoch: num(EPOCH_ENV, 1, 1 << 20, d.epoch)?,
            delay: num(DELAY_ENV, 2, MAX_DELAY, d.delay)?,
            timeout: Duration::from_secs(num(TIMEOUT_ENV, 1, 86_400, d.timeout.as_secs())?),
        })
    }

    /// The first collective at which epoch `e` is seen: `(e + D)·K`.
    pub fn applies_at(&self, e: u64) -> u64 {
        (e + self.delay).saturating_mul(self.epoch)
    }
}

/// What became of a frame from the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivered {
    /// A record seen for the first time: kept, and queued to be forwarded.
    New,
    /// Already held (or of an epoch already combined): dropped.
    Old,
    /// Not a record (another kind of control frame).
    NotARecord,
    /// A record that does not decode.
    Bad(DecodeError),
}

/// Counters of the exchange, for the summary line and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub posted: u64,
    pub received_new: u64,
    pub received_old: u64,
    pub bad: u64,
    pub frames_sent: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub combined: u64,
    /// Latency from this process's record to the epoch's last: the largest, and the sum
    /// (over `timed`).
    pub latency_max_us: u64,
    pub latency_sum_us: u64,
    pub timed: u64,
}

struct Exchange {
    board: Mutex<board::Board>,
    /// Signalled when the board gains a record.
    arrived: Condvar,
    outbox: Mutex<VecDeque<Arc<[u8]>>>,
    /// Signalled when the outbox gains a frame.
    queued: Condvar,
    users: AtomicUsize,
    /// Set by [`nudge`]: frames arrived that the mover should take now.
    nudged: std::sync::atomic::AtomicBool,
    net: OnceLock<Net>,
    /// The node-local relay (`None` until first used, or off / unavailable: then the reason).
    local: Mutex<Option<Result<local::Local, String>>>,
    /// Whether the mover thread runs.
    mover: Mutex<bool>,
    stats: Mutex<Stats>,
}

/// What the net plugin does for the exchange: write frames on every send connection, and hand
/// the frames that arrived on every receive connection to [`deliver`].
#[derive(Clone, Copy)]
pub struct Net {
    pub send: fn(&[Arc<[u8]>]),
    pub receive: fn(),
}

fn exchange() -> &'static Exchange {
    static X: OnceLock<Exchange> = OnceLock::new();
    X.get_or_init(|| Exchange {
        board: Mutex::new(board::Board::default()),
        arrived: Condvar::new(),
        outbox: Mutex::new(VecDeque::new()),
        queued: Condvar::new(),
        users: AtomicUsize::new(0),
        nudged: std::sync::atomic::AtomicBool::new(false),
        net: OnceLock::new(),
        local: Mutex::new(None),
        mover: Mutex::new(false),
        stats: Mutex::new(Stats::default()),
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Frames waiting in the outbox at most (beyond, the oldest go: a process with no connection
/// for a long time must not grow without bound; a connection that opens later gets the
/// board's records through [`backlog`] anyway).
const MAX_OUTBOX: usize = 4096;

fn enqueue(x: &Exchange, frame: Arc<[u8]>) {
    let mut q = lock(&x.outbox);
    if q.len() >= MAX_OUTBOX {
        q.pop_front();
    }
    q.push_back(frame);
    drop(q);
    x.queued.notify_all();
}

/// A user of the exchange (a tuner context running the agreement) while it lives: the net
/// plugin moves frames only while there is one ([`active`]).
pub struct User(());

impl Drop for User {
    fn drop(&mut self) {
        exchange().users.fetch_sub(1, Ordering::AcqRel);
    }
}

pub fn join() -> User {
    let x = exchange();
    x.users.fetch_add(1, Ordering::AcqRel);
    start_mover(x);
    User(())
}

/// Starts the mover thread unless it runs: while any user lives it moves frames (net and
/// node-local) every millisecond, or at once when frames are queued or [`nudge`]d.
fn start_mover(x: &'static Exchange) {
    let mut running = lock(&x.mover);
    if *running {
        return;
    }
    *running = std::thread::Builder::new()
        .name("ncclbpf agree".into())
        .spawn(move || mover(x))
        .is_ok();
}

fn mover(x: &'static Exchange) {
    loop {
        {
            // Decided under the lock `start_mover` takes, so a start never finds it set by a
            // thread that is leaving.
            let mut running = lock(&x.mover);
            if x.users.load(Ordering::Acquire) == 0 {
                *running = false;
                return;
            }
        }
        let out = wait_outgoing(Duration::from_millis(1));
        // A panic must not take the host process down: the thread ends and the next user
        // starts another; waiting ranks move frames themselves meanwhile.
        if std::panic::catch_unwind(|| step(out)).is_err() {
            *lock(&x.mover) = false;
            return;
        }
    }
}

/// `NCCL_BPF_AGREEMENT_LOCAL=0` turns the node-local relay off (records then travel over the
/// plugin's connections only).
pub const LOCAL_ENV: &str = "NCCL_BPF_AGREEMENT_LOCAL";

/// Moves frames once: `out` (and whatever it makes new) onto every connection and the node's
/// relay, and every frame that arrived into the board.
pub fn step(mut out: Vec<Arc<[u8]>>) {
    let x = exchange();
    let net = x.net.get().copied();
    // New records found here are forwarded in the same call; a bound keeps a flood of distinct
    // records from holding the caller.
    for _ in 0..4 {
        if let Some(n) = net {
            (n.send)(&out);
            (n.receive)();
        }
        let arrived = {
            let mut l = lock(&x.local);
            let l = l.get_or_insert_with(|| {
                if std::env::var(LOCAL_ENV).is_ok_and(|v| v.trim() == "0") {
                    return Err(format!("{LOCAL_ENV}=0"));
                }
                local::Local::open(&shared_maps::registry_dir()).map_err(|e| e.to_string())
            });
            match l {
                Ok(l) => {
                    let _ = l.publish(&out);
                    l.collect()
                }
                Err(_) => vec![],
            }
        };
        for f in arrived {
            deliver(&f);
        }
        out = take_outgoing();
        if out.is_empty() {
            return;
        }
    }
    requeue(out);
}

/// Turns the node-local relay off in this process (before the agreement first moves frames;
/// for tools and tests that drive tuner contexts in-process, where every "rank" shares one
/// exchange anyway).
pub fn disable_local(why: &str) {
    *lock(&exchange().local) = Some(Err(why.to_string()));
}

/// Why records do not travel through the node-local relay, if they do not.
pub fn local_problem() -> Option<String> {
    match &*lock(&exchange().local) {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    }
}

/// Whether any tuner context of this process runs the agreement.
pub fn active() -> bool {
    exchange().users.load(Ordering::Acquire) > 0
}

/// The net plugin's part of moving frames. Set once.
pub fn set_net(n: Net) {
    let _ = exchange().net.set(n);
}

/// Posts this rank's record: onto the board, and out to every connection.
pub fn post(r: &Record) {
    let x = exchange();
    let frame: Arc<[u8]> = r.encode().into();
    lock(&x.board).insert(r.clone(), true);
    lock(&x.stats).posted += 1;
    x.arrived.notify_all();
    enqueue(x, frame);
}

/// A frame from the wire.
pub fn deliver(frame: &[u8]) -> Delivered {
    let x = exchange();
    let r = match Record::decode(frame) {
        Ok(r) => r,
        Err(DecodeError::NotARecord) => return Delivered::NotARecord,
        Err(e) => {
            lock(&x.stats).bad += 1;
            return Delivered::Bad(e);
        }
    };
    let got = lock(&x.board).insert(r, false);
    {
        let mut s = lock(&x.stats);
        s.bytes_received += frame.len() as u64;
        if got == Insert::New {
            s.received_new += 1;
        } else {
            s.received_old += 1;
        }
    }
    if got != Insert::New {
        return Delivered::Old;
    }
    x.arrived.notify_all();
    enqueue(x, frame.into());
    Delivered::New
}

/// The frames to send on every send connection, oldest first (taken: each is handed out once).
pub fn take_outgoing() -> Vec<Arc<[u8]>> {
    lock(&exchange().outbox).drain(..).collect()
}

/// Puts frames back at the front of the outbox (a mover that could not send them all now).
pub fn requeue(frames: Vec<Arc<[u8]>>) {
    let x = exchange();
    let mut q = lock(&x.outbox);
    for f in frames.into_iter().rev() {
        q.push_front(f);
    }
    q.truncate(MAX_OUTBOX);
}

/// Waits up to `timeout` for frames to send or a [`nudge`] (the net plugin's thread parks
/// here).
pub fn wait_outgoing(timeout: Duration) -> Vec<Arc<[u8]>> {
    let x = exchange();
    let q = lock(&x.outbox);
    let (mut q, _) = x
        .queued
        .wait_timeout_while(q, timeout, |q| {
            q.is_empty() && !x.nudged.load(Ordering::Acquire)
        })
        .unwrap_or_else(|e| e.into_inner());
    x.nudged.store(false, Ordering::Release);
    q.drain(..).collect()
}

/// Wakes the mover: a frame arrived (read inside NCCL's own call) that should be delivered,
/// and forwarded, now rather than at the mover's next round.
pub fn nudge() {
    let x = exchange();
    if x.users.load(Ordering::Relaxed) == 0 {
        return;
    }
    x.nudged.store(true, Ordering::Release);
    // Under the lock, so a mover between its check and its wait cannot miss it.
    let _q = lock(&x.outbox);
    x.queued.notify_all();
}

/// Every record held, as frames, for a connection that opens after they were sent.
pub fn backlog() -> Vec<Arc<[u8]>> {
    lock(&exchange().board)
        .all()
        .map(|r| Arc::from(r.encode()))
        .collect()
}

/// Counts `n` bytes of `frames` frames written to the wire.
pub fn note_sent(frames: u64, bytes: u64) {
    let mut s = lock(&exchange().stats);
    s.frames_sent += frames;
    s.bytes_sent += bytes;
}

pub fn stats() -> Stats {
    *lock(&exchange().stats)
}

/// Why a wait ended without the records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub comm_id: u64,
    pub epoch: u64,
    pub nranks: u32,
    /// Makers (`host:pid`) of the records that did arrive.
    pub have: Vec<String>,
    pub waited: Duration,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "comm {:#018x}: after {:.1} s, {} of {} records of epoch {} (from {}); the others' \
             ranks are stuck or gone, or no ncclbpf connection links them to this one",
            self.comm_id,
            self.waited.as_secs_f64(),
            self.have.len(),
            self.nranks,
            self.epoch,
            if self.have.is_empty() {
                "none".to_string()
            } else {
                self.have.join(", ")
            }
        )
    }
}

/// A context of this process (`origin`) of `comm` starts: the board keeps the communicator's
/// records from epoch 0 on for it.
pub fn arrive(comm: u64, origin: u64) {
    lock(&exchange().board).needs(comm, origin, 0);
}

/// The makers (`host:pid`) of the records of `epoch` of `comm` this process holds.
pub fn held(comm: u64, epoch: u64) -> Vec<String> {
    lock(&exchange().board)
        .records(comm, epoch)
        .map(|rs| rs.values().map(Record::maker).collect())
        .unwrap_or_default()
}

/// The context `origin` of `comm` ended.
pub fn leave(comm: u64, origin: u64) {
    lock(&exchange().board).leave(comm, origin);
}

/// The records of `epoch` a wait returns: those of `members` once all are there, or (no
/// members yet) the first `nranks` once there are that many.
fn ready(
    rs: &std::collections::BTreeMap<u64, Record>,
    nranks: u32,
    members: Option<&[u64]>,
) -> Option<Vec<Record>> {
    match members {
        Some(m) => m.iter().map(|o| rs.get(o).cloned()).collect(),
        None => (rs.len() >= nranks as usize).then(|| rs.values().cloned().collect()),
    }
}

/// Waits (at most `timeout`) until this process holds the records of `epoch` of `comm` that
/// context `origin` combines: those of `members` (the origins of its first combination), or
/// before it has any, `nranks` records; returns them sorted by origin. Records of any other
/// origin are left out: once a communicator's members are known, a record more (a peer's
/// mistake, or another communicator with the same hash) cannot change what this rank combines.
/// Moves frames itself while it waits ([`step`]).
pub fn wait_for(
    comm: u64,
    origin: u64,
    epoch: u64,
    nranks: u32,
    members: Option<&[u64]>,
    timeout: Duration,
) -> Result<Vec<Record>, Missing> {
    let x = exchange();
    let start = Instant::now();
    let deadline = start + timeout;
    let mut b = lock(&x.board);
    loop {
        if let Some(out) = b
            .records(comm, epoch)
            .and_then(|rs| ready(rs, nranks, members))
        {
            let latency = b.latency(comm, epoch);
            b.needs(comm, origin, epoch + 1);
            drop(b);
            let mut s = lock(&x.stats);
            s.combined += 1;
            if let Some(l) = latency {
                let us = l.as_micros() as u64;
                s.latency_max_us = s.latency_max_us.max(us);
                s.latency_sum_us += us;
                s.timed += 1;
            }
            return Ok(out);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Missing {
                comm_id: comm,
                epoch,
                nranks,
                have: b
                    .records(comm, epoch)
                    .map(|rs| rs.values().map(Record::maker).collect())
                    .unwrap_or_default(),
                waited: now - start,
            });
        }
        drop(b);
        step(take_outgoing());
        b = lock(&x.board);
        if b.records(comm, epoch)
            .is_some_and(|rs| ready(rs, nranks, members).is_some())
        {
            continue;
        }
        let pause = (deadline - now).min(Duration::from_micros(200));
        b = x
            .arrived
            .wait_timeout(b, pause)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// A random origin for a tuner context (unique in practice: two ranks never share one).
pub fn new_origin() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// This host's name, for records (empty if it cannot be read).
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_have_defaults_and_bounds() {
        let p = Params::from_lookup(|_| None).unwrap();
        assert_eq!(p, Params::default());
        assert_eq!(p.applies_at(0), 128);
        let p = Params::from_lookup(|k| (k == EPOCH_ENV).then(|| "16".into())).unwrap();
        assert_eq!((p.epoch, p.applies_at(3)), (16, 80));
        for (k, v) in [
            (EPOCH_ENV, "0"),
            (DELAY_ENV, "1"),
            (TIMEOUT_ENV, "x"),
            (EPOCH_ENV, "-4"),
        ] {
            let e = Params::from_lookup(|q| (q == k).then(|| v.into())).unwrap_err();
            assert!(e.starts_with(k), "{e}");
        }
    }

    fn rec(comm: u64, origin: u64, epoch: u64) -> Record {
        crate::record::test_record(comm, origin, epoch, 2)
    }

    /// These tests share the process's exchange, and one's wait moves (and, with no
    /// connection, drops) what another put in the outbox: they take turns, holding the guard
    /// this returns. None of them writes to the real registry.
    fn no_relay() -> MutexGuard<'static, ()> {
        static TURN: Mutex<()> = Mutex::new(());
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        disable_local("off in unit tests");
        turn
    }

    #[test]
    fn a_wait_ends_when_the_last_record_arrives_and_new_records_are_forwarded() {
        let _turn = no_relay();
        let comm = 0x5151_0001;
        post(&rec(comm, 1, 0));
        let out = take_outgoing();
        assert!(
            out.iter()
                .any(|f| Record::decode(f).unwrap().comm_id == comm)
        );
        let other = rec(comm, 2, 0).encode();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(deliver(&other), Delivered::New);
            assert_eq!(deliver(&other), Delivered::Old);
        });
        let got = wait_for(comm, 1, 0, 2, None, Duration::from_secs(10)).unwrap();
        t.join().unwrap();
        assert_eq!(got.iter().map(|r| r.origin).collect::<Vec<_>>(), [1, 2]);
        let fwd = take_outgoing();
        assert!(
            fwd.iter()
                .any(|f| Record::decode(f).unwrap() == rec(comm, 2, 0)),
            "the new record is forwarded once"
        );
        assert_eq!(deliver(b"something else"), Delivered::NotARecord);
        assert!(matches!(deliver(b"NBAR\x01\x00"), Delivered::Bad(_)));
    }

    #[test]
    fn a_wait_is_bounded_and_says_who_is_missing() {
        let _turn = no_relay();
        let comm = 0x5151_0002;
        post(&rec(comm, 1, 3));
        let m = wait_for(comm, 1, 3, 2, None, Duration::from_millis(50)).unwrap_err();
        assert_eq!((m.have.len(), m.nranks, m.epoch), (1, 2, 3));
        assert!(
            m.to_string()
                .contains("1 of 2 records of epoch 3 (from h:1)"),
            "{m}"
        );
    }
}
