//! The lock around a tuner context's decision state, biased to the thread that calls it.
//!
//! NCCL calls `getCollInfo` for one communicator from one thread at a time, almost always the
//! same thread, but the tuner ABI does not promise it (non-blocking communicators decide on a
//! thread NCCL starts per group). A plain try-lock costs a compare-and-swap per call, a locked
//! instruction that took about 4 ns of the whole call on an Intel Xeon (`perf annotate` of
//! `scripts/tuner-bench.sh`). This lock lets the thread that keeps calling skip it:
//!
//! - Every thread can take `busy` (a try-lock). A thread that takes it [`GRANT_AFTER`] times in
//!   a row, and nobody in between, becomes the **owner** (`owner` holds its thread token).
//! - The owner enters with no locked instruction: it stores `true` into its own `inside` flag,
//!   then reads `owner` again and goes in if it still names it; it leaves with a release store
//!   of `false`. Every thread that is ever granted has a flag of its own ([`SLOTS`] per lock,
//!   bound to the thread's token at its first grant): a former owner that read `owner` before it
//!   was revoked may still store into its flag, and with one shared flag that late `false` could
//!   erase the new owner's `true` (an adversarial review found exactly that interleaving, and
//!   `a_stale_owner_cannot_clear_the_new_owners_flag` replays it). With all slots bound, no
//!   further thread is granted.
//! - Any other thread takes `busy`, **revokes** the ownership (stores `owner = 0`), runs
//!   [`heavy_barrier`] (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: every running thread of
//!   the process executes a full memory barrier before it returns), then reads every `inside`
//!   flag: if one is set, a former owner may be inside and it does not enter (the caller falls
//!   back or retries).
//!
//! Why that is mutual exclusion (the asymmetric Dekker argument that userspace RCU rests on):
//! the owner's store of `inside` and its load of `owner` have only a compiler barrier between
//! them; the revoker's store of `owner` and its load of `inside` have the process-wide barrier
//! between them. Either the owner's load comes after the barrier ran on its CPU, and then it
//! sees `owner = 0` and backs out; or it came before, and then so did its store of `inside`,
//! which the barrier made visible before the revoker's load: the revoker sees `inside` and
//! backs out. A thread that is not running when the barrier is issued passes a full barrier
//! when it is scheduled again. The owner never writes `owner`; only holders of `busy` do.
//!
//! Memory: the owner's writes are released by its store of `inside = false` and acquired by
//! the revoker's load of it; a `busy` holder's writes are released with `busy` and acquired by
//! the next holder, including the one that is then granted the ownership.
//!
//! Where `membarrier` is not available (kernels before 4.14, seccomp), nobody is ever granted
//! the ownership, and every call takes `busy`, as before.
//!
//! Assumed, as by every lock: threads are pthreads (each its own thread pointer, so its own
//! token), and a process does not fork while another thread is inside (the child would find the
//! flag set for ever, as it would find a mutex held; NCCL does not support a fork after init).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, compiler_fence};

/// Consecutive acquisitions of `busy` by one thread after which it becomes the owner.
pub const GRANT_AFTER: u32 = 16;
/// Threads that can own one lock in its lifetime (each has its own `inside` flag); a power of
/// two, at most the alignment of a thread token (`owner` holds token | slot).
pub const SLOTS: usize = 4;

/// `owner` when nobody owns the lock: no thread token matches it (tokens are user-space
/// addresses; a thread whose token read 0 would match a 0 here and enter unlocked).
const NONE: usize = usize::MAX;

/// The lock. `slots` and `streak` are only touched under `busy`.
pub struct BiasedLock {
    /// The owner's thread token | its slot ([`NONE`]: none). Written only by holders of `busy`.
    owner: AtomicUsize,
    /// Per slot: whether its thread is inside as the owner. Written only by that thread.
    inside: [AtomicBool; SLOTS],
    busy: AtomicBool,
    /// The thread token each slot is bound to (0: free).
    slots: UnsafeCell<[usize; SLOTS]>,
    /// The last holder of `busy` and how many times in a row it took it.
    streak: UnsafeCell<(usize, u32)>,
}

// SAFETY: `slots` and `streak` are only read and written by the holder of `busy` (acquired
// with Acquire, released with Release), so one thread at a time, each seeing the previous
// holder's writes. Everything else is atomic.
unsafe impl Sync for BiasedLock {}

/// Inside the lock until dropped.
#[must_use]
pub struct Guard<'a> {
    lock: &'a BiasedLock,
    /// The owner's slot when entered as the owner; [`SLOTS`] when entered through `busy`.
    slot: usize,
    /// `owner`'s next value (token | slot) when letting go (through `busy` only; 0: none).
    grant: usize,
    /// Not `Send`: an owner's guard must let go on the owner's thread (only it writes its flag).
    _here: std::marker::PhantomData<*const ()>,
}

impl Drop for Guard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(f) = self.lock.inside.get(self.slot) {
            f.store(false, Ordering::Release);
        } else {
            if self.grant != 0 {
                self.lock.owner.store(self.grant, Ordering::Relaxed);
            }
            self.lock.busy.store(false, Ordering::Release);
        }
    }
}

impl Guard<'_> {
    /// Whether this entry skipped `busy` (the owner's way in).
    pub fn as_owner(&self) -> bool {
        self.slot < SLOTS
    }
}

impl Default for BiasedLock {
    fn default() -> Self {
        BiasedLock::new()
    }
}

impl BiasedLock {
    pub const fn new() -> BiasedLock {
        BiasedLock {
            owner: AtomicUsize::new(NONE),
            inside: [const { AtomicBool::new(false) }; SLOTS],
            busy: AtomicBool::new(false),
            slots: UnsafeCell::new([0; SLOTS]),
            streak: UnsafeCell::new((0, 0)),
        }
    }

    /// Enters if nobody else is inside; never waits (but a thread that revokes an ownership
    /// pays one `membarrier`, a few microseconds). A thread already inside does not enter again.
    #[inline(always)]
    pub fn try_enter(&self) -> Option<Guard<'_>> {
        self.try_enter_as(thread_token())
    }

    /// [`try_enter`](Self::try_enter) for the thread whose token is `me`.
    #[inline(always)]
    fn try_enter_as(&self, me: usize) -> Option<Guard<'_>> {
        let o = self.owner.load(Ordering::Relaxed);
        if o & !(SLOTS - 1) == me {
            let slot = o & (SLOTS - 1);
            let f = &self.inside[slot];
            // Set already: this thread is inside (a nested call); the way through `busy`
            // refuses it.
            if !f.load(Ordering::Relaxed) {
                f.store(true, Ordering::Relaxed);
                // The revoker's `heavy_barrier` stands for the hardware barrier here.
                compiler_fence(Ordering::SeqCst);
                if self.owner.load(Ordering::Relaxed) == o {
                    compiler_fence(Ordering::SeqCst);
                    return Some(Guard {
                        lock: self,
                        slot,
                        grant: 0,
                        _here: std::marker::PhantomData,
                    });
                }
                f.store(false, Ordering::Release);
            }
        }
        self.try_enter_busy(me)
    }

    /// Enters, waiting (spinning briefly, then yielding) while another thread is inside.
    pub fn enter(&self) -> Guard<'_> {
        spin_until(|| self.try_enter())
    }

    #[inline(never)]
    fn try_enter_busy(&self, me: usize) -> Option<Guard<'_>> {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        if self.owner.load(Ordering::Relaxed) != NONE {
            self.owner.store(NONE, Ordering::Relaxed);
            heavy_barrier();
        }
        // SAFETY: we hold `busy` (see the `Sync` impl).
        let streak = unsafe { &mut *self.streak.get() };
        if self.inside.iter().any(|f| f.load(Ordering::Acquire)) {
            // A former owner is still inside (it leaves without `busy`), or is about to find
            // itself revoked. Nobody took `busy` in between: the streak starts again.
            *streak = (0, 0);
            self.busy.store(false, Ordering::Release);
            return None;
        }
        *streak = match *streak {
            (t, n) if t == me => (t, n.saturating_add(1)),
            _ => (me, 1),
        };
        let mut grant = 0;
        if streak.1 >= GRANT_AFTER && me != 0 && me & (SLOTS - 1) == 0 && barrier_available() {
            // SAFETY: we hold `busy` (see the `Sync` impl).
            let slots = unsafe { &mut *self.slots.get() };
            let slot = slots.iter().position(|&t| t == me).or_else(|| {
                let free = slots.iter().position(|&t| t == 0)?;
                slots[free] = me;
                Some(free)
            });
            if let Some(slot) = slot {
                grant = me | slot;
            }
        }
        Some(Guard {
            lock: self,
            slot: SLOTS,
            grant,
            _here: std::marker::PhantomData,
        })
    }

    /// Enters (as the owner, if the caller is one; else through `busy`) and stays inside until
    /// the guard is dropped, granting nothing (tests: another thread that calls meanwhile finds
    /// the context taken).
    pub fn hold(&self) -> Guard<'_> {
        let mut g = self.enter();
        g.grant = 0;
        g
    }

    /// Whether the calling thread would enter as the owner (tests).
    pub fn owned_by_me(&self) -> bool {
        self.owner.load(Ordering::Relaxed) & !(SLOTS - 1) == thread_token()
    }

    /// Whether a thread is inside now (tests).
    pub fn taken(&self) -> bool {
        self.busy.load(Ordering::Acquire) || self.inside.iter().any(|f| f.load(Ordering::Acquire))
    }

    /// Whether a thread owns the lock now (tests, status).
    pub fn owned(&self) -> bool {
        self.owner.load(Ordering::Relaxed) != NONE
    }
}

/// Retries `attempt` until it succeeds, spinning briefly and then yielding between tries: for
/// locks held only across a program run or an agreement wait, never across a call into NCCL.
pub(crate) fn spin_until<T>(mut attempt: impl FnMut() -> Option<T>) -> T {
    let mut spins = 0u32;
    loop {
        if let Some(v) = attempt() {
            return v;
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// This thread's token: its thread pointer (what `pthread_self` returns with glibc and musl:
/// the address of the thread's control block), read from the register that holds it, without a
/// call; `pthread_self` elsewhere. Never 0 for a live thread. A token may be reused by a thread
/// started after this one ended; then the new thread inherits an ownership whose former holder
/// can no longer be inside, which is harmless.
#[inline(always)]
fn thread_token() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let t: usize;
        // SAFETY: on x86-64 Linux, %fs:0 holds the thread control block's pointer to itself
        // (the TLS ABI's tcbhead_t.tcb); reading it has no side effects.
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) t, options(nostack, readonly, preserves_flags, pure));
        }
        t
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() as usize }
    }
}

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// 0 not yet asked, 1 available, 2 not available.
static BARRIER: AtomicU8 = AtomicU8::new(0);

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    }
}

/// Whether the process-wide barrier works here (asked once, registering the process).
fn barrier_available() -> bool {
    match BARRIER.load(Ordering::Acquire) {
        1 => true,
        2 => false,
        _ => {
            let q = membarrier(MEMBARRIER_CMD_QUERY);
            let ok = q >= 0
                && q & MEMBARRIER_CMD_PRIVATE_EXPEDITED != 0
                && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
            BARRIER.store(if ok { 1 } else { 2 }, Ordering::Release);
            if !ok {
                crate::tlog!(
                    INFO,
                    TUNING,
                    "membarrier(PRIVATE_EXPEDITED) not available: every getCollInfo takes the \
                     context's try-lock"
                );
            }
            ok
        }
    }
}

/// Every running thread of the process executes a full memory barrier before this returns.
/// Only called after a grant, so after [`barrier_available`] said yes (a forked child inherits
/// the registration). Should the barrier fail anyway, the process registers again; failing
/// that, nobody is granted an ownership any more and this waits 10 ms, by which any running
/// thread's store buffer has long drained and a descheduled one passed the full barrier of a
/// context switch (sound in practice, not an architectural guarantee).
#[cold]
fn heavy_barrier() {
    if membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 {
        return;
    }
    if membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
        && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0
    {
        return;
    }
    BARRIER.store(2, Ordering::Release);
    crate::tlog!(
        WARN,
        TUNING,
        "membarrier(PRIVATE_EXPEDITED) failed after it had worked: tuner contexts take their \
         try-lock from now on"
    );
    std::thread::sleep(std::time::Duration::from_millis(10));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    /// A counter that is only safe to touch inside the lock.
    struct Shared {
        lock: BiasedLock,
        value: UnsafeCell<u64>,
    }
    // SAFETY: `value` is only touched inside `lock` (what the tests check).
    unsafe impl Sync for Shared {}

    #[test]
    fn thread_tokens_are_pthread_self_and_differ_between_threads() {
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() as usize };
        assert_eq!(thread_token(), me);
        let other = std::thread::spawn(thread_token).join().unwrap();
        assert_ne!(other, me);
        assert_ne!(other, 0);
    }

    #[test]
    fn the_thread_that_keeps_calling_becomes_the_owner() {
        let l = BiasedLock::new();
        for i in 0..GRANT_AFTER {
            let g = l.try_enter().expect("nobody else is inside");
            assert!(!g.as_owner(), "call {i}: not the owner yet");
        }
        if !barrier_available() {
            return;
        }
        assert!(l.owned());
        for _ in 0..100 {
            let g = l.try_enter().expect("owner");
            assert!(g.as_owner());
        }
    }

    #[test]
    fn another_thread_revokes_the_ownership_and_waits_for_the_owner_to_leave() {
        if !barrier_available() {
            return;
        }
        let s = Arc::new(Shared {
            lock: BiasedLock::new(),
            value: UnsafeCell::new(0),
        });
        for _ in 0..GRANT_AFTER + 1 {
            drop(s.lock.try_enter().unwrap());
        }
        let inside = s.lock.try_enter().unwrap();
        assert!(inside.as_owner());
        let t = {
            let s = s.clone();
            std::thread::spawn(move || {
                // The owner is inside: a try fails, and the ownership is gone.
                assert!(s.lock.try_enter().is_none());
                assert!(!s.lock.owned());
                let g = s.lock.enter();
                assert!(!g.as_owner());
                // SAFETY: inside the lock.
                unsafe { *s.value.get() += 1 };
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: inside the lock (as the owner).
        unsafe { *s.value.get() += 1 };
        drop(inside);
        t.join().unwrap();
        let g = s.lock.try_enter().unwrap();
        assert!(!g.as_owner(), "revoked: back through busy");
        // SAFETY: inside the lock.
        assert_eq!(unsafe { *s.value.get() }, 2);
    }

    /// Makes the calling thread the owner (GRANT_AFTER entries through `busy`).
    fn own(l: &BiasedLock) {
        for _ in 0..GRANT_AFTER {
            drop(l.try_enter().expect("nobody else is inside"));
        }
        assert!(l.owned_by_me());
    }

    /// The review's interleaving, replayed at the level of the flags: owner A reads `owner`,
    /// stalls before storing its flag; B revokes A, is granted and is inside as the owner; A
    /// resumes, stores its flag, finds itself revoked and clears its flag again, then tries
    /// through `busy`. With one flag shared by all owners, A's late `false` erased B's `true`
    /// and A entered while B was inside.
    #[test]
    fn a_stale_owner_cannot_clear_the_new_owners_flag() {
        if !barrier_available() {
            return;
        }
        let l = Arc::new(BiasedLock::new());
        own(&l);
        // What A read before it stalled.
        let stale = l.owner.load(Ordering::Relaxed);
        let a_slot = stale & (SLOTS - 1);
        let (b_inside, b_release) = (
            Arc::new(std::sync::Barrier::new(2)),
            Arc::new(std::sync::Barrier::new(2)),
        );
        let b = {
            let (l, inside, release) = (l.clone(), b_inside.clone(), b_release.clone());
            std::thread::spawn(move || {
                own(&l);
                let g = l.try_enter().unwrap();
                assert!(g.as_owner());
                inside.wait();
                release.wait();
                drop(g);
            })
        };
        b_inside.wait();
        // A resumes its fast path with the stale value.
        let f = &l.inside[a_slot];
        f.store(true, Ordering::Relaxed);
        assert_ne!(l.owner.load(Ordering::Relaxed), stale, "A was revoked");
        f.store(false, Ordering::Release);
        assert!(
            l.try_enter().is_none(),
            "A entered while B is inside as the owner"
        );
        b_release.wait();
        b.join().unwrap();
        assert!(l.try_enter().is_some(), "B left");
    }

    /// A thread whose token read 0 (a runtime that points the thread register elsewhere) must
    /// not match "nobody owns the lock".
    #[test]
    fn no_token_matches_an_unowned_lock() {
        let l = BiasedLock::new();
        assert!(!l.owned());
        let held = l.hold();
        assert!(
            l.try_enter_as(0).is_none(),
            "token 0 entered while busy was held"
        );
        drop(held);
        assert!(l.try_enter_as(0).is_some_and(|g| !g.as_owner()));
    }

    #[test]
    fn a_thread_inside_does_not_enter_again() {
        let l = BiasedLock::new();
        let outer = l.try_enter().unwrap();
        assert!(l.try_enter().is_none(), "through busy");
        drop(outer);
        if !barrier_available() {
            return;
        }
        own(&l);
        let outer = l.try_enter().unwrap();
        assert!(outer.as_owner());
        assert!(l.try_enter().is_none(), "as the owner");
        // Another thread must still find the lock taken.
        std::thread::scope(|s| {
            s.spawn(|| assert!(l.try_enter().is_none()));
        });
        drop(outer);
    }

    #[test]
    fn each_owner_has_a_slot_of_its_own_and_they_run_out() {
        if !barrier_available() {
            return;
        }
        let l = BiasedLock::new();
        let turn = std::sync::Mutex::new(0usize);
        let moved = std::sync::Condvar::new();
        let all_done = std::sync::Barrier::new(SLOTS + 2);
        // All threads alive at once (distinct tokens), each in its turn calling in a long run.
        let owned: Vec<Option<usize>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..SLOTS + 2)
                .map(|t| {
                    let (l, turn, moved, all_done) = (&l, &turn, &moved, &all_done);
                    s.spawn(move || {
                        let mut now = turn.lock().unwrap();
                        while *now != t {
                            now = moved.wait(now).unwrap();
                        }
                        for _ in 0..GRANT_AFTER + 1 {
                            drop(l.try_enter().unwrap());
                        }
                        let slot = l
                            .owned_by_me()
                            .then(|| l.owner.load(Ordering::Relaxed) & (SLOTS - 1));
                        *now += 1;
                        moved.notify_all();
                        drop(now);
                        all_done.wait();
                        slot
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let slots: Vec<usize> = owned[..SLOTS].iter().map(|s| s.expect("granted")).collect();
        let mut distinct = slots.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), SLOTS, "one slot each: {slots:?}");
        assert_eq!(owned[SLOTS..], [None, None], "no slot left for the others");
    }

    /// Threads that call in long runs (and get the ownership) and threads that cut in: every
    /// entry is exclusive (a non-atomic read-modify-write under the lock loses nothing).
    #[test]
    fn entries_exclude_each_other_under_contention() {
        let s = Arc::new(Shared {
            lock: BiasedLock::new(),
            value: UnsafeCell::new(0),
        });
        let entered = Arc::new(AtomicU64::new(0));
        let owned = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (s, entered, owned) = (s.clone(), entered.clone(), owned.clone());
                std::thread::spawn(move || {
                    for round in 0..200u32 {
                        // Thread 0 calls in long runs; the others now and then.
                        let run = if t == 0 { 200 } else { 1 + round % 3 };
                        for _ in 0..run {
                            let g = if t == 3 {
                                Some(s.lock.enter())
                            } else {
                                s.lock.try_enter()
                            };
                            if let Some(g) = g {
                                // SAFETY: inside the lock.
                                unsafe {
                                    let v = std::ptr::read_volatile(s.value.get());
                                    std::hint::spin_loop();
                                    std::ptr::write_volatile(s.value.get(), v + 1);
                                }
                                entered.fetch_add(1, Ordering::Relaxed);
                                if g.as_owner() {
                                    owned.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        if t != 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let g = s.lock.enter();
        // SAFETY: inside the lock.
        let v = unsafe { *s.value.get() };
        drop(g);
        assert_eq!(v, entered.load(Ordering::Relaxed));
        if barrier_available() {
            assert!(
                owned.load(Ordering::Relaxed) > 0,
                "the long runs were never granted the ownership"
            );
        }
    }
}
