//! Maps shared by the net plugin (writer) and the tuner and tools (readers).
//!
//! This first piece holds the per-connection statistics table that the net data path updates
//! on every completed operation. Slots are fixed-size records of atomics so that writers on
//! NCCL's proxy threads never lock, and readers take consistent-enough snapshots without
//! stopping them. Shared-memory placement and BPF-visible maps build on this layout.

pub mod conn_table;

pub use conn_table::{ConnDirection, ConnSlotGuard, ConnSnapshot, ConnTable};
