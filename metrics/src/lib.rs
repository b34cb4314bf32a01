//! Prometheus metrics of ncclbpf processes, read from shared memory (`docs/guide/metrics.md`).
//!
//! * [`collect`]: what the metrics say: every process's connection table, tuner decision
//!   records and policy maps, read-only through the registry, never asking the process;
//! * [`profiled`]: the profiler's per-collective figures and counters;
//! * [`expo`]: the text exposition format;
//! * [`http`]: a small HTTP/1.1 server for `GET /metrics`, one thread, one request per
//!   connection, stopped and joined on demand.
//!
//! Used by `ncclbpf exporter` (every process of the user on the node) and by the net plugin's
//! in-process endpoint (`NCCL_BPF_METRICS_ADDR`, its own process), so both serve the same
//! exposition.

pub mod collect;
pub mod expo;
pub mod http;
pub mod profiled;

pub use collect::{Options, render};
