//! `libnccl-net-bpf.so`: the one library NCCL loads, with four plugin types.
//!
//! Each module holds one plugin type's exported tables, thin adapters over the crate that does
//! the work:
//!
//! | module | symbols | NCCL finds it through | crate |
//! |---|---|---|---|
//! | [`net`] | `ncclNetPlugin_v7` … `v12` | `NCCL_NET_PLUGIN` | `ncclbpf_netplugin` (transport, hooks) |
//! | [`tuner`] | `ncclTunerPlugin_v2` … `v6` | `NCCL_TUNER_PLUGIN`, or the net library (2.21+) | `ncclbpf_tuner` (policies, agreement) |
//! | [`profiler`] | `ncclProfiler_v4` … `v7` | `NCCL_PROFILER_PLUGIN`, or the net library (2.28+) | `ncclbpf_profiler` (events, per-collective metrics) |
//! | [`env`] | `ncclEnvPlugin_v1`, `v2` | `NCCL_ENV_PLUGIN` (2.28+) | `ncclbpf_env` (settings file, defaults) |
//!
//! Every entry point catches panics and returns an NCCL error code with a line in NCCL's log;
//! none blocks on another plugin type.

pub mod env;
pub mod net;
pub mod profiler;
pub mod tuner;
