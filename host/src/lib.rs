//! The host: what ncclbpf keeps once per process, whichever of its plugin types NCCL loaded.
//!
//! * [`life`]: the lifecycle. The net plugin, the tuner and the profiler each hold the host
//!   while NCCL has one of their contexts open ([`acquire`], [`release`]); the first hold starts
//!   it, the last release stops what must not outlive NCCL's use of the library. The env plugin
//!   has no communicator and holds nothing.
//! * [`peers`]: what the plugin types contribute to requests: the net plugin its hooks and
//!   `reload` of net programs ([`peers::NetPeer`]), the tuner its staged swaps, config updates
//!   and contexts ([`peers::TunerPeer`]). Each registers when NCCL first initialises it.
//! * [`control`]: the control socket (`ncclbpf status`, `reload`, `reload --at-seq`,
//!   `config`), answered from whichever peers are registered.
//! * [`metrics_endpoint`]: `NCCL_BPF_METRICS_ADDR`, Prometheus metrics of this process.
//!
//! The rest of what is process-wide already lives in crates every plugin type shares: the map
//! registry ([`shared_maps::Registry::global`]), the policy setting
//! ([`policy_runtime::setting`], read by each plugin type for its own sections), and the
//! agreement's exchange and the net busy clocks (`ncclbpf-agreement`).
//!
//! Design: `docs/design/architecture.md` ("The host").

pub mod control;
pub mod life;
pub mod metrics_endpoint;
pub mod peers;

pub use life::{Part, acquire, release};

/// `hlog!(INFO, INIT, "format", args...)`: a line prefixed `HOST/BPF` in NCCL's log.
#[macro_export]
macro_rules! hlog {
    ($level:ident, $subsys:ident, $($arg:tt)*) => {
        ::ncclnet_headers::log::log(
            "HOST/BPF",
            ::ncclnet_headers::LogLevel::$level,
            ::ncclnet_headers::LogSubsys::$subsys,
            file!(),
            line!(),
            &format!($($arg)*),
        )
    };
}
