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
//! - The owner enters with no locked instruction: it stores `inside = true`, then reads `owner`
//!   again and goes in if it still names it; it leaves with a release store of `inside = false`.
//! - Any other thread takes `busy`, **revokes** the ownership (stores `owner = 0`), runs
//!   [`heavy_barrier`] (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: every running thread of
//!   the process executes a full memory barrier before it returns), then reads `inside`: if the
//!   former owner is inside, it does not enter (the caller falls back or retries).
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

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, compiler_fence};

/// Consecutive acquisitions of `busy` by one thread after which it becomes the owner.
pub const GRANT_AFTER: u32 = 16;

/// The lock. `streak` is only touched under `busy`.
pub struct BiasedLock {
    /// The owner's thread token (0: none). Written only by holders of `busy`.
    owner: AtomicUsize,
    /// Whether the owner is inside. Written only by the owner's thread.
    inside: AtomicBool,
    busy: AtomicBool,
    /// The last holder of `busy` and how many times in a row it took it.
    streak: UnsafeCell<(usize, u32)>,
}

// SAFETY: `streak` is only read and written by the holder of `busy` (acquired with Acquire,
// released with Release), so one thread at a time, each seeing the previous holder's writes.
// Everything else is atomic.
unsafe impl Sync for BiasedLock {}

/// Inside the lock until dropped.
#[must_use]
pub struct Guard<'a> {
    lock: &'a BiasedLock,
    /// Entered as the owner (else through `busy`).
    owner: bool,
    /// Make this thread the owner when letting go (through `busy` only).
    grant: usize,
}

impl Drop for Guard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.owner {
            self.lock.inside.store(false, Ordering::Release);
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
        self.owner
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
            owner: AtomicUsize::new(0),
            inside: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            streak: UnsafeCell::new((0, 0)),
        }
    }

    /// Enters if nobody else is inside; never waits (but a thread that revokes an ownership
    /// pays one `membarrier`, a few microseconds).
    #[inline(always)]
    pub fn try_enter(&self) -> Option<Guard<'_>> {
        let me = thread_token();
        if self.owner.load(Ordering::Relaxed) == me {
            self.inside.store(true, Ordering::Relaxed);
            // The revoker's `heavy_barrier` stands for the hardware barrier here.
            compiler_fence(Ordering::SeqCst);
            if self.owner.load(Ordering::Relaxed) == me {
                compiler_fence(Ordering::SeqCst);
                return Some(Guard {
                    lock: self,
                    owner: true,
                    grant: 0,
                });
            }
            self.inside.store(false, Ordering::Release);
        }
        self.try_enter_busy(me)
    }

    /// Enters, waiting (spinning briefly, then yielding) while another thread is inside.
    pub fn enter(&self) -> Guard<'_> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_enter() {
                return g;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
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
        if self.owner.load(Ordering::Relaxed) != 0 {
            self.owner.store(0, Ordering::Relaxed);
            heavy_barrier();
        }
        if self.inside.load(Ordering::Acquire) {
            // A former owner is still inside (it leaves without `busy`).
            self.busy.store(false, Ordering::Release);
            return None;
        }
        // SAFETY: we hold `busy` (see the `Sync` impl).
        let streak = unsafe { &mut *self.streak.get() };
        *streak = match *streak {
            (t, n) if t == me => (t, n.saturating_add(1)),
            _ => (me, 1),
        };
        let grant = if streak.1 >= GRANT_AFTER && me != 0 && barrier_available() {
            me
        } else {
            0
        };
        Some(Guard {
            lock: self,
            owner: false,
            grant,
        })
    }

    /// Takes `busy` and keeps it until the guard is dropped, granting nothing (tests: another
    /// thread that calls meanwhile finds the context taken).
    pub fn hold(&self) -> Guard<'_> {
        let mut g = self.enter();
        g.grant = 0;
        g
    }

    /// Whether a thread is inside now (tests).
    pub fn taken(&self) -> bool {
        self.busy.load(Ordering::Acquire) || self.inside.load(Ordering::Acquire)
    }

    /// Whether a thread owns the lock now (tests, status).
    pub fn owned(&self) -> bool {
        self.owner.load(Ordering::Relaxed) != 0
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
/// Only called after a grant, so after [`barrier_available`] said yes. Should the barrier fail
/// anyway (a forked child's new address space is not registered), the process registers
/// again; failing that, nobody is granted an ownership any more and this waits 10 ms, by which
/// any running thread's store buffer has long drained and a descheduled one passed the full
/// barrier of a context switch.
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
