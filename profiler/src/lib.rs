//! ncclbpf's profiler plugin: NCCL's profiler events, followed safely, timed on the GPU's
//! clock, published as per-collective metrics, and handed to verified policy programs.
//!
//! NCCL's own profiler plugins have crashed and hung jobs on exactly what a profiler must
//! survive: events after a stop, handles used after finalize, teardown racing the proxy
//! thread. Here, by construction:
//!
//! * [`handles`]: what NCCL holds is a number, never a pointer: generation-tagged slots
//!   that every call looks up, so an unknown, stale or doubly stopped handle names nothing;
//! * [`tracker`]: `init`, `startEvent`, `stopEvent`, `recordEventState` and `finalize` over
//!   those tables; no lock held across a call out, nothing left behind by a finalize;
//! * [`collective`]: a collective from its host start to its last channel's end on the GPU,
//!   bytes and bus bytes as nccl-tests count them;
//! * [`stats`]: per communicator, collective, size, algorithm and protocol, in shared memory
//!   (`ncclbpf_collectives`) for the metrics endpoint and `ncclbpf exporter`;
//! * [`counters`]: what was followed, ignored and misused (`ncclbpf_profiler`), with
//!   rate-limited log lines;
//! * [`mask`]: which events NCCL reports (`NCCL_PROFILE_EVENT_MASK`, `NCCL_BPF_PROFILER`);
//! * [`programs`]: the `profiler/*` hooks' programs from `NCCL_BPF_POLICY`;
//! * [`event`]: descriptors in our own types (the adapters in `plugin/src/profiler.rs` copy
//!   NCCL's into them).

pub mod collective;
pub mod counters;
pub mod event;
pub mod handles;
pub mod mask;
pub mod programs;
pub mod stats;
pub mod tracker;

/// `plog!(WARN, PROFILE, "format", args...)`: a line prefixed `PROFILER/BPF` in NCCL's log.
#[macro_export]
macro_rules! plog {
    ($level:ident, $subsys:ident, $($arg:tt)*) => {
        ::ncclnet_headers::log::log(
            "PROFILER/BPF",
            ::ncclnet_headers::LogLevel::$level,
            ::ncclnet_headers::LogSubsys::$subsys,
            file!(),
            line!(),
            &format!($($arg)*),
        )
    };
}
