//! Runs verified policies.
//!
//! * [`program`]: loading (maps bound through the registry, verification, map references
//!   patched to addresses, compilation) and running a [`LoadedProgram`];
//! * [`jit`]: the x86-64 JIT (encoder, translator, executable memory);
//! * [`interp`]: the interpreter (portable tier, and a memory-checking oracle);
//! * [`raw`]: both engines on unverified instruction sequences (conformance vectors);
//! * [`helpers`]: the helpers programs call;
//! * [`swap`]: hot swap of a running program;
//! * [`setting`]: which objects a process loads (`NCCL_BPF_POLICY` and its aliases);
//! * [`ctx`]: the contexts of each hook.

#![allow(clippy::result_large_err)]

pub mod ctx;
pub mod helpers;
pub mod interp;
pub mod jit;
pub mod program;
pub mod raw;
pub mod setting;
pub mod swap;

pub use ctx::{NetCtx, ProfilerCtx, TunerChunkCtx, TunerCtx, TunerEpochCtx, TunerInitCtx};
pub use program::{LoadError, LoadOptions, LoadedProgram, Tier};
pub use swap::{Handle, ProgramSlot, SlotHandle, Swappable};
