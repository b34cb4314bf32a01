//! `#[repr(C)]` mirrors of NCCL's plugin ABI, written from `shared/docs/nccl-plugin-abi.md`.
//!
//! * [`common`]: `ncclResult_t`, the logger, the profiler callback, shared constants.
//! * [`net`]: `ncclNet_v7` … `ncclNet_v12` function tables and their property structs.
//! * [`tuner`]: `ncclTuner_v2` … `ncclTuner_v6` function tables and their constants;
//! * [`profiler`]: `ncclProfiler_v4` … `v7` tables, event descriptors and state arguments;
//! * [`env`]: `ncclEnvPlugin_v1` and `v2` tables;
//! * [`log`]: calling the (variadic) logger NCCL hands to plugins, safely.
//!
//! NCCL enums are never Rust enums here: NCCL adds values over time, and an unknown
//! discriminant in a Rust enum is undefined behaviour. Every enum is an `i32` newtype with
//! associated constants. Every struct's size and field offsets are pinned by unit tests to the
//! values of the ABI reference (which were computed from the real C headers).

pub mod common;
pub mod env;
pub mod log;
pub mod net;
pub mod profiler;
pub mod tuner;

pub use common::*;
