//! The interposer: NCCL's traffic carried by another net plugin (`NCCL_BPF_NET_INNER`), with
//! every hook, counter and metric of ncclbpf on top of it.
//!
//! ```text
//! NCCL ──ncclNetPlugin_v7..v12──▶ ncclbpf (hooks, per-connection table, maps, metrics)
//!                                   ├─ our sockets (default)                 netplugin::comm
//!                                   └─ the inner plugin's ncclNetPlugin_v6..v12   this module
//! ```
//!
//! * [`load`]: finding and opening the library, picking its newest version, refusing itself;
//! * [`table`]: its table behind one set of calls in the newest shape (the translations);
//! * [`wrap`]: the data path: connections and requests wrapped, each operation observed.
//!
//! What NCCL gets is the inner plugin's: its devices and properties, its connection handles
//! (the wrapper adds nothing to NCCL's 128-byte handle), its memory handles (GPU pointers and
//! DMA-BUF included: GPUDirect RDMA keeps working), its device handles and return codes. What
//! the wrapper adds is per request: a slot in a fixed array of the connection (no allocation,
//! no blocking lock), the `net/*` programs and the connection's counters.

pub mod load;
pub mod side;
pub mod table;
pub mod wrap;

use crate::error::{NetError, NetResult};
use ncclnet_headers::net::{NET_TRAFFIC_CLASS_UNDEF, NetCommConfig};
use ncclnet_headers::{DebugLogger, NcclResult, ProfilerCallback};
use std::ffi::{CStr, c_void};
use std::sync::{Mutex, OnceLock};
pub use table::Table;

type Vp = *mut c_void;

/// An opened inner plugin and its process-wide state.
pub struct Inner {
    pub table: Table,
    /// What was opened.
    pub path: String,
    /// The plugin's own name (its table's `name`).
    pub name: String,
    /// Another copy of ncclbpf, made a plain backend.
    pub ncclbpf: bool,
    /// Whether a v6 to v10 plugin's one `init` succeeded.
    process_init: Mutex<bool>,
    /// The context of a v11+ plugin for NCCL releases that give none (they call our v7 to v10
    /// tables): made by the first `init`.
    default_ctx: OnceLock<Ctx>,
    /// Where side channels may listen ([`side`]): the interfaces `NCCL_SOCKET_IFNAME` selects,
    /// with their PCI paths; empty: no side channels.
    pub side_devices: Vec<(Option<std::ffi::CString>, std::net::SocketAddr)>,
}

/// What a communicator's calls carry to the inner plugin: its context (v11+; NULL before)
/// and the communicator's config (which v10 takes in `connect`).
#[derive(Clone, Copy)]
pub struct Ctx {
    pub inner: Vp,
    pub config: NetCommConfig,
    pub comm_id: u64,
}

// SAFETY: the context pointer is the inner plugin's, which NCCL hands to any of its threads.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    fn undefined() -> Ctx {
        Ctx {
            inner: std::ptr::null_mut(),
            config: NetCommConfig {
                traffic_class: NET_TRAFFIC_CLASS_UNDEF,
            },
            comm_id: 0,
        }
    }
}

impl Inner {
    /// Opens the plugin `value` names (see [`load`]).
    pub fn open(value: &str) -> NetResult<Inner> {
        let o = load::open(value).map_err(|e| NetError::Backend(e.to_string()))?;
        if let Some(h) = load::gin_rma_hint(&o.path, &o.extras) {
            crate::nlog!(INFO, INIT, "{h}");
        }
        let name = {
            let p = o.table.name();
            if p.is_null() {
                "(unnamed)".to_string()
            } else {
                // SAFETY: a plugin's name is a NUL-terminated string in its own data.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        Ok(Inner {
            table: o.table,
            path: o.path,
            name,
            ncclbpf: o.ncclbpf,
            process_init: Mutex::new(false),
            default_ctx: OnceLock::new(),
            side_devices: Vec::new(),
        })
    }

    /// `init` of a v6 to v10 plugin, once per process (a failure is not remembered).
    fn init_once(&self, log: DebugLogger, prof: ProfilerCallback) -> NetResult<()> {
        let mut done = self.process_init.lock().unwrap_or_else(|e| e.into_inner());
        if !*done {
            // SAFETY: as NCCL calls a v6-v10 `init`: once, with its logger.
            let r = unsafe { self.table.init_process(log, prof) };
            if !r.is_success() {
                return Err(NetError::Inner {
                    op: "init",
                    code: r,
                });
            }
            *done = true;
        }
        Ok(())
    }

    /// The context for a communicator NCCL just initialised (net v11+ calls us once per
    /// communicator).
    pub fn init_comm(
        &self,
        comm_id: u64,
        config: Option<NetCommConfig>,
        log: DebugLogger,
        prof: ProfilerCallback,
    ) -> NetResult<Ctx> {
        let mut ctx = Ctx::undefined();
        ctx.comm_id = comm_id;
        if let Some(c) = config {
            ctx.config = c;
        }
        if self.table.per_comm() {
            let mut cfg = ctx.config;
            // SAFETY: as NCCL calls a v11+ `init`; `cfg` lives for the call (NCCL's own is a
            // temporary too).
            let r = unsafe {
                self.table
                    .init_comm(&mut ctx.inner, comm_id, &mut cfg, log, prof)
            };
            if !r.is_success() {
                return Err(NetError::Inner {
                    op: "init",
                    code: r,
                });
            }
        } else {
            self.init_once(log, prof)?;
        }
        Ok(ctx)
    }

    /// `init` from an NCCL that gives no communicator (our v7 to v10 tables).
    pub fn init_process(&self, log: DebugLogger, prof: ProfilerCallback) -> NetResult<()> {
        if !self.table.per_comm() {
            return self.init_once(log, prof);
        }
        if self.default_ctx.get().is_some() {
            return Ok(());
        }
        let _g = self.process_init.lock().unwrap_or_else(|e| e.into_inner());
        if self.default_ctx.get().is_none() {
            let c = self.init_comm(0, None, log, prof)?;
            let _ = self.default_ctx.set(c);
        }
        Ok(())
    }

    /// The context calls without one use (NCCL's v7 to v10 tables).
    pub fn default_ctx(&self) -> Ctx {
        self.default_ctx
            .get()
            .copied()
            .unwrap_or_else(Ctx::undefined)
    }

    /// A communicator's context is finished (v11+).
    pub fn finalize(&self, ctx: &Ctx) -> NetResult<()> {
        if !self.table.per_comm() {
            return Ok(());
        }
        // SAFETY: the context this plugin's `init` returned, finalised once.
        let r = unsafe { self.table.finalize(ctx.inner) };
        if r.is_success() {
            Ok(())
        } else {
            Err(NetError::Inner {
                op: "finalize",
                code: r,
            })
        }
    }

    /// Whether connections get side channels here.
    pub fn sides(&self) -> bool {
        !self.side_devices.is_empty()
    }

    /// Where the side channel of a connection on the inner plugin's device `dev` listens: the
    /// interface of the same NIC (same PCI path: a RoCE or TCP NIC's own network device);
    /// with another copy of ncclbpf, the same device index (the same interface there); else
    /// the first interface, as NCCL's IB transport picks one for its own handshake.
    pub fn side_bind_for(&self, dev: std::ffi::c_int) -> Option<std::net::SocketAddr> {
        let (_, first) = self.side_devices.first()?;
        // SAFETY: as NCCL calls getProperties (the inner plugin is initialised).
        let props = unsafe { self.table.properties(dev) }.ok();
        if let Some(p) = props.filter(|p| !p.pci_path.is_null()) {
            // SAFETY: a plugin's pciPath is a NUL-terminated string it owns.
            let path = unsafe { CStr::from_ptr(p.pci_path) };
            if let Some((_, a)) = self
                .side_devices
                .iter()
                .find(|(pp, _)| pp.as_deref() == Some(path))
            {
                return Some(*a);
            }
        }
        if self.ncclbpf
            && let Some((_, a)) = usize::try_from(dev)
                .ok()
                .and_then(|d| self.side_devices.get(d))
        {
            return Some(*a);
        }
        Some(*first)
    }

    /// One line for NCCL's log: who carries the data.
    pub fn describe(&self) -> String {
        format!(
            "traffic carried by inner net plugin '{}' (ncclNetPlugin_v{}, {}){}",
            self.name,
            self.table.version(),
            self.path,
            if self.ncclbpf {
                ", another copy of ncclbpf as a plain backend"
            } else {
                ""
            }
        )
    }

    /// Which optional slots the wrapper offers NCCL (it offers exactly what the inner
    /// plugin has: NCCL behaves differently when a slot is non-NULL).
    pub fn optional_slots(&self) -> OptionalSlots {
        OptionalSlots {
            reg_mr_dma_buf: self.table.has_reg_mr_dma_buf(),
            get_device_mr: self.table.has_get_device_mr(),
            irecv_consumed: self.table.has_irecv_consumed(),
            make_v_device: self.table.has_make_v_device(),
        }
    }
}

/// The optional slots of the net table that depend on the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptionalSlots {
    pub reg_mr_dma_buf: bool,
    pub get_device_mr: bool,
    pub irecv_consumed: bool,
    pub make_v_device: bool,
}

/// Turns an inner plugin's return code into a result.
pub fn check(op: &'static str, r: NcclResult) -> NetResult<()> {
    if r.is_success() {
        Ok(())
    } else {
        Err(NetError::Inner { op, code: r })
    }
}
