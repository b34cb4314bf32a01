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

use crate::ctx::Context;
use crate::program::{LoadError, LoadOptions, LoadedProgram};
use shared_maps::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Shared {
    generation: AtomicU64,
    current: Mutex<Arc<LoadedProgram>>,
}

pub struct ProgramSlot {
    shared: Arc<Shared>,
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
            shared: Arc::new(Shared {
                generation: AtomicU64::new(1),
                current: Mutex::new(Arc::new(prog)),
            }),
        }
    }

    /// A handle for one caller.
    pub fn handle(&self) -> SlotHandle {
        let (generation, prog) = self.snapshot();
        SlotHandle {
            shared: Arc::clone(&self.shared),
            generation,
            prog,
        }
    }

    fn snapshot(&self) -> (u64, Arc<LoadedProgram>) {
        self.shared.snapshot()
    }

    pub fn current(&self) -> Arc<LoadedProgram> {
        self.snapshot().1
    }

    /// How many times the program was replaced.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Installs an already loaded program (for the same hook); returns the swap time.
    pub fn install(&self, prog: LoadedProgram) -> Result<Duration, LoadError> {
        if prog.section != self.section {
            return Err(LoadError::NoProgram {
                wanted: format!("a '{}' program", self.section),
                available: vec![format!("{} ({})", prog.name, prog.section)],
            });
        }
        let new = Arc::new(prog);
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
        // Freed here only if no handle holds it, else by the last handle to move on.
        drop(old);
        Ok(took)
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

impl Shared {
    fn snapshot(&self) -> (u64, Arc<LoadedProgram>) {
        // Read the generation first: the program fetched after is at least that new.
        let g = self.generation.load(Ordering::Acquire);
        let p = Arc::clone(&self.current.lock().unwrap_or_else(|e| e.into_inner()));
        (g, p)
    }
}

/// One caller's view of a slot.
pub struct SlotHandle {
    shared: Arc<Shared>,
    generation: u64,
    prog: Arc<LoadedProgram>,
}

impl SlotHandle {
    /// Runs the current program on `ctx`.
    #[inline]
    pub fn call<C: Context>(&mut self, ctx: &mut C) -> u64 {
        self.refresh();
        self.prog.run(ctx)
    }

    #[inline]
    fn refresh(&mut self) {
        if self.shared.generation.load(Ordering::Acquire) != self.generation {
            (self.generation, self.prog) = self.shared.snapshot();
        }
    }

    /// The program the next call will run.
    pub fn program(&mut self) -> &LoadedProgram {
        self.refresh();
        &self.prog
    }
}
