//! Hot swap: callers run a program through a slot; replacing it verifies and compiles off the
//! hot path, swaps atomically, and frees the old code only when no caller still uses it.
//!
//! Each caller holds a [`SlotHandle`] (one per thread or per communicator): its `call` costs
//! an `arc_swap::Cache` check (a few ns) plus the program. The old program's memory is freed
//! when the last handle that ran it moves on to the new one or is dropped, so a call is never
//! cut off mid-program and every call runs exactly one whole version.

use crate::ctx::Context;
use crate::program::{LoadError, LoadOptions, LoadedProgram};
use arc_swap::{ArcSwap, Cache};
use shared_maps::Registry;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct ProgramSlot {
    current: Arc<ArcSwap<LoadedProgram>>,
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
            current: Arc::new(ArcSwap::from_pointee(prog)),
        }
    }

    /// A handle for one caller.
    pub fn handle(&self) -> SlotHandle {
        SlotHandle {
            cache: Cache::new(Arc::clone(&self.current)),
        }
    }

    pub fn current(&self) -> Arc<LoadedProgram> {
        self.current.load_full()
    }

    /// Installs an already loaded program (for the same hook).
    pub fn install(&self, prog: LoadedProgram) -> Result<Duration, LoadError> {
        if prog.section != self.section {
            return Err(LoadError::NoProgram {
                wanted: format!("a '{}' program", self.section),
                available: vec![format!("{} ({})", prog.name, prog.section)],
            });
        }
        let t = Instant::now();
        self.current.store(Arc::new(prog));
        Ok(t.elapsed())
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
    cache: Cache<Arc<ArcSwap<LoadedProgram>>, Arc<LoadedProgram>>,
}

impl SlotHandle {
    /// Runs the current program on `ctx`.
    #[inline]
    pub fn call<C: Context>(&mut self, ctx: &mut C) -> u64 {
        self.cache.load().run(ctx)
    }

    /// The program the next call will run.
    pub fn program(&mut self) -> &LoadedProgram {
        self.cache.load()
    }
}
