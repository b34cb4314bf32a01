//! Maps shared by the net plugin, the tuner, their BPF programs and outside readers.
//!
//! * [`map`]: BPF maps (array, hash, per-CPU array) with the kernel's helper semantics, laid
//!   out in one shared-memory segment each;
//! * [`region`]: the segments (sealed memfds) and read-only mappings of another process's;
//! * [`identity`]: what makes two declarations of a name one map (shape, scope, epoch source,
//!   reduction);
//! * [`registry`]: maps by name within a process, and views by process id for tools;
//! * [`conn_table`]: the per-connection records of the net data path (counters, progress
//!   and pending times for stall finding), in shared memory for outside readers.

pub mod conn_table;
pub mod identity;
pub mod map;
pub mod region;
pub mod registry;

pub use conn_table::{
    ConnDirection, ConnLabels, ConnSlotGuard, ConnSnapshot, ConnTable, ConnTableView, ProgressMark,
};
pub use identity::{Difference, MapIdentity, MapReduce, MapScope};
pub use map::{ArrayLayout, BPF_ANY, BPF_EXIST, BPF_NOEXIST, Map, MapError, MapSpec, MapType};
pub use registry::{
    Conflict, MapView, RUNTIME_PREFIX, Registry, RegistryError, compare, pid_alive, registry_dir,
};
