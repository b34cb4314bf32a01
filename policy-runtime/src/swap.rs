//! Hot swap: callers run a program through a slot; replacing it verifies and compiles off the
//! hot path, swaps atomically, and frees the old code only when no caller still uses it.
//!
//! Each caller holds a [`SlotHandle`] (one per thread or per communicator) that caches an
//! `Arc` of the program it last ran and the slot's generation. A call costs one atomic load
//! of the generation (plus the program); only after a swap does a handle take the slot's lock
//! once to fetch the new program. A swap stores the new program, then bumps the generation, so
//! a handle that sees the new generation runs the new program or a newer one, and a call never
//! mixes versions. The old program (its JIT code and map references) is freed when the last
//! handle that held it moves on or is dropped.
//!
//! The mechanism itself is [`Swappable`]: any value (one program, or a set of programs that
//! must change together, as the net hooks' are) replaced as a whole and read through
//! [`Handle`]s. [`ProgramSlot`] is a `Swappable<LoadedProgram>` for one hook.

use crate::ctx::Context;
use crate::program::{LoadError, LoadOptions, LoadedProgram};
use shared_maps::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Shared<T> {
    generation: AtomicU64,
    current: Mutex<Arc<T>>,
}

impl<T> Shared<T> {
    fn snapshot(&self) -> (u64, Arc<T>) {
        // Read the generation first: the value fetched after is at least that new.
        let g = self.generation.load(Ordering::Acquire);
        let p = Arc::clone(&self.current.lock().unwrap_or_else(|e| e.into_inner()));
        (g, p)
    }
}

/// A value replaced as a whole while callers read it through [`Handle`]s.
pub struct Swappable<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Swappable<T> {
    /// Generation 1 holds `value`.
    pub fn new(value: T) -> Swappable<T> {
        Swappable {
            shared: Arc::new(Shared {
                generation: AtomicU64::new(1),
                current: Mutex::new(Arc::new(value)),
            }),
        }
    }

    /// A handle for one caller.
    pub fn handle(&self) -> Handle<T> {
        let (generation, value) = self.shared.snapshot();
        Handle {
            shared: Arc::clone(&self.shared),
            generation,
            value,
        }
    }

    /// The current value.
    pub fn current(&self) -> Arc<T> {
        self.shared.snapshot().1
    }

    /// The current generation and value, consistent with each other as long as nobody else
    /// stores in between (the caller serialises its writers).
    pub fn snapshot(&self) -> (u64, Arc<T>) {
        self.shared.snapshot()
    }

    /// 1, plus one per [`store`](Self::store).
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Replaces the value; returns how long the swap itself took. The old value is dropped
    /// here if no handle holds it, else by the last handle that moves on.
    pub fn store(&self, value: T) -> Duration {
        let new = Arc::new(value);
        let t = Instant::now();
        let old = {
            let mut cur = self
                .shared
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *cur, new)
        };
        self.shared.generation.fetch_add(1, Ordering::Release);
        let took = t.elapsed();
        drop(old);
        took
    }
}

/// One caller's view of a [`Swappable`].
pub struct Handle<T> {
    shared: Arc<Shared<T>>,
    generation: u64,
    value: Arc<T>,
}

impl<T> Handle<T> {
    /// The current value: one atomic load when nothing changed since the last call.
    #[inline]
    pub fn get(&mut self) -> &T {
        if self.shared.generation.load(Ordering::Acquire) != self.generation {
            (self.generation, self.value) = self.shared.snapshot();
        }
        &self.value
    }

    /// The generation of the value [`get`](Self::get) last returned.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// The program of one hook.
pub struct ProgramSlot {
    inner: Swappable<LoadedProgram>,
    section: String,
}

/// What a replacement cost.
#[derive(Clone, Copy, Debug)]
pub struct SwapReport {
    pub verify: Duration,
    pub compile: Duration,
    pub swap: Duration,
}

impl ProgramSlot {
    pub fn new(prog: LoadedProgram) -> ProgramSlot {
        ProgramSlot {
            section: prog.section.clone(),
            inner: Swappable::new(prog),
        }
    }

    /// A handle for one caller.
    pub fn handle(&self) -> SlotHandle {
        SlotHandle {
            inner: self.inner.handle(),
        }
    }

    pub fn current(&self) -> Arc<LoadedProgram> {
        self.inner.current()
    }

    /// How many times the program was replaced, plus one.
    pub fn generation(&self) -> u64 {
        self.inner.generation()
    }

    /// Installs an already loaded program (for the same hook); returns the swap time.
    pub fn install(&self, prog: LoadedProgram) -> Result<Duration, LoadError> {
        if prog.section != self.section {
            return Err(LoadError::NoProgram {
                wanted: format!("a '{}' program", self.section),
                available: vec![format!("{} ({})", prog.name, prog.section)],
            });
        }
        Ok(self.inner.store(prog))
    }

    /// Loads `bytes`, verifies and compiles it, then swaps it in. On any error the running
    /// program stays in place and the error (the verifier's message) is returned.
    pub fn replace(
        &self,
        bytes: &[u8],
        name: Option<&str>,
        registry: &Registry,
        opts: &LoadOptions,
    ) -> Result<SwapReport, LoadError> {
        let p = LoadedProgram::from_elf(bytes, name, registry, opts)?;
        let (verify, compile) = (p.times.verify, p.times.compile);
        let swap = self.install(p)?;
        Ok(SwapReport {
            verify,
            compile,
            swap,
        })
    }
}

/// One caller's view of a slot.
pub struct SlotHandle {
    inner: Handle<LoadedProgram>,
}

impl SlotHandle {
    /// Runs the current program on `ctx`.
    #[inline]
    pub fn call<C: Context>(&mut self, ctx: &mut C) -> u64 {
        self.inner.get().run(ctx)
    }

    /// Runs the current program on `ctx` after `prepare` has seen the program and filled
    /// what it needs of `ctx` (e.g. fields only some programs read, [`policy_verifier::Stats::reads_ctx`]).
    #[inline]
    pub fn call_prepared<C: Context>(
        &mut self,
        ctx: &mut C,
        prepare: impl FnOnce(&LoadedProgram, &mut C),
    ) -> u64 {
        let p = self.inner.get();
        prepare(p, ctx);
        p.run(ctx)
    }

    /// The program the next call will run.
    pub fn program(&mut self) -> &LoadedProgram {
        self.inner.get()
    }
}
