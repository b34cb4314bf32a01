//! ncclbpf's ncclNet plugin: NCCL's point-to-point traffic over our own socket transport.
//!
//! Where things are:
//!
//! * [`ffi`]: the exported `ncclNetPlugin_v7` … `v12` tables, panic guards, pointer checks;
//! * [`plugin`]: process-wide state set up by `init` (devices, settings);
//! * [`devices`]: interface selection (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`);
//! * [`setup`]: non-blocking `listen`/`connect`/`accept`;
//! * [`comm`]: the data path, `isend`/`irecv`/`test`, the control stream ([`rxbuf`]: its
//!   receive buffer);
//! * [`engine`]: who moves large messages over the data streams (`NCCL_BPF_IO`: process-wide
//!   io_uring or epoll workers, or a helper thread per stream);
//! * [`inner`]: the interposer: another net plugin (`NCCL_BPF_NET_INNER`) as the backend,
//!   every call forwarded and observed;
//! * [`hooks`]: where each operation is observed (per-connection counters, BPF hooks);
//! * [`frames`]: the agreement's records between ranks, over the connections' control streams;
//! * [`control`]: the net plugin's part of the control socket, which the host runs
//!   (`ncclbpf_host`): the hooks for `status`, live `reload` of the net programs;
//! * [`wire`]: what goes over the wire (handle, hello, message header, chunking);
//! * [`config`]: `NCCL_BPF_*` settings.
//!
//! The control socket and the metrics endpoint are the host's (`ncclbpf_host`), shared with the
//! tuner and the profiler: `init` holds the host (net v11+: each context until its `finalize`).
//!
//! An operation, `isend` to counter update: [`ffi`]'s `isend_v10` → `Comm::isend` (posts the
//! request, hands chunks to the I/O engine, writes the header) → `test` → `Comm::test`
//! (progresses the control stream, checks chunk counts) → [`hooks::ConnHooks::on_complete`].

pub mod buf;
pub mod comm;
pub mod config;
pub mod control;
pub mod devices;
pub mod engine;
pub mod error;
pub mod ffi;
pub mod frames;
pub mod handshake;
pub mod hooks;
pub mod inner;
pub mod log;
pub mod plugin;
pub mod rxbuf;
pub mod setup;
pub mod wire;
