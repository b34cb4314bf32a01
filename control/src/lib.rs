//! The control socket of a process that runs ncclbpf: what travels on it, the client side
//! (`ncclbpf reload`, `ncclbpf status`), and the server loop the plugin runs.
//!
//! Each process where NCCL initialised one of our net plugin, tuner or profiler (the host,
//! `ncclbpf_host`) listens on a Unix stream socket
//! `<registry dir>/<pid>.ctl` (the registry dir is [`shared_maps::registry_dir`]:
//! `$NCCL_BPF_SHM_DIR`, default `/dev/shm/ncclbpf-<uid>`, mode 0700; the socket is mode 0600).
//! A client connects, sends one request line, reads the reply up to its final line, and the
//! server closes the connection. Only the owner of the process (the same effective uid) and
//! root may talk to it: the server checks the peer with `SO_PEERCRED`.
//!
//! * [`protocol`]: requests, replies, their text form;
//! * [`client`]: finding processes and asking them;
//! * [`server`]: the listening thread, the peer check, panics caught per request; the request
//!   handling itself is the plugin's ([`server::Handler`]).
//!
//! This crate does not depend on the plugin: the CLI links it alone.

pub mod client;
pub mod protocol;
pub mod server;
mod sys;

pub use client::{ClientError, live_processes, live_processes_in, request, request_at, request_in};
pub use protocol::{Item, ProgramInfo, Reply, Request, Swap};

/// `<dir>/<pid>.ctl`.
pub fn socket_path_in(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    dir.join(format!("{pid}.ctl"))
}

/// The control socket of process `pid`, in this user's registry dir.
pub fn socket_path(pid: u32) -> std::path::PathBuf {
    socket_path_in(&shared_maps::registry_dir(), pid)
}
