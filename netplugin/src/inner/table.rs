//! An inner plugin's function table, whatever its version (v6 to v12), behind one set of calls
//! in the newest shape.
//!
//! Each call translates what differs between versions, as NCCL's own adapters do: `int` sizes
//! (v6 to v8: a message over 1 GiB and a v6/v7 registration of 2 GiB or more are refused, as
//! NCCL does), NCCL's 0x1 receive hint (v9+ only: reset to NULL for v6 to v8, as NCCL does), no
//! device handles (v6), the communicator config in `connect` (v10), the profiler handles
//! (v10+), one context per communicator (v11+), 4 or 8 devices in a virtual device (v9 to v11,
//! v12). Return codes are the inner plugin's own: the wrapper passes them to NCCL unchanged.
//!
//! The table is read through its pointer at every call, never copied: a plugin may fill some
//! slots in its `init`, as this library does.

use ncclnet_headers::net::*;
use ncclnet_headers::{DebugLogger, NcclResult, ProfilerCallback};
use std::ffi::{c_char, c_int, c_void};

type Vp = *mut c_void;

/// The largest size handed to an inner plugin whose sizes are `int` (v6 to v8): 1 GiB, the
/// bound NCCL's own adapters use (and advertise as `maxP2pBytes`).
pub const MAX_INT_SIZE: usize = 1 << 30;

/// The most receives one `irecv` may group (NCCL's `NCCL_PROXY_MAX_SUBS`, its channel count).
pub const MAX_RECVS: usize = 64;

/// An inner plugin's exported table, by version. The pointers come from `dlsym` on a library
/// that is never unloaded.
#[derive(Clone, Copy)]
pub enum Table {
    V6(*const NetV6),
    V7(*const NetV7),
    V8(*const NetV8),
    V9(*const NetV9),
    V10(*const NetV10),
    V11(*const NetV11),
    V12(*const NetV12),
}

// SAFETY: the table pointers refer to a loaded library's data that lives as long as the process
// (the library is never closed); the calls made through them are the inner plugin's to make
// thread-safe, as they are when NCCL calls it directly.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

/// Reads the same-typed slot `$f` of whatever version `$t` is, into `$e` with the table `$p`.
macro_rules! any {
    ($t:expr, $p:ident => $e:expr) => {
        match $t {
            Table::V6($p) => $e,
            Table::V7($p) => $e,
            Table::V8($p) => $e,
            Table::V9($p) => $e,
            Table::V10($p) => $e,
            Table::V11($p) => $e,
            Table::V12($p) => $e,
        }
    };
}

/// Reads slot `$f` of versions 7 and up, `None` for v6 (which has no such slot).
macro_rules! from_v7 {
    ($t:expr, $f:ident) => {
        match $t {
            Table::V6(_) => None,
            Table::V7(p) => (*p).$f,
            Table::V8(p) => (*p).$f,
            Table::V9(p) => (*p).$f,
            Table::V10(p) => (*p).$f,
            Table::V11(p) => (*p).$f,
            Table::V12(p) => (*p).$f,
        }
    };
}

const MISSING: NcclResult = NcclResult::INTERNAL_ERROR;

fn int_size(size: usize) -> Option<c_int> {
    (size <= MAX_INT_SIZE).then_some(size as c_int)
}

/// A registration's size for a plugin whose `regMr` takes an `int` (v6, v7): whatever the
/// `int` holds, as NCCL's own adapters allow (`size < 2^31`); the 1 GiB bound is a message's
/// (`maxP2pBytes`), not a buffer's (ncclCommRegister registers whole user buffers).
fn reg_int_size(size: usize) -> Option<c_int> {
    c_int::try_from(size).ok()
}

/// A virtual device as NCCL's v9 to v11 tables carry it (4 devices) from the v12 layout (8).
/// `ndevs` never says more than the 4-entry array holds: NCCL reads `ndevs` entries, and past
/// the array it would read `maxP2pBytes` as device indexes. A v12 inner plugin's virtual device
/// of more than 4 NICs is reported as its first 4 (said once in NCCL's log); a negative count
/// as 0.
pub fn v_props_v11(p: &NetVDevicePropsV12) -> NetVDevicePropsV11 {
    let n = p.ndevs.clamp(0, NET_MAX_DEVS_PER_NIC_V11 as c_int);
    if n < p.ndevs {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            crate::nlog!(
                WARN,
                NET,
                "a virtual device of {} NICs is reported to this NCCL (net v9-v11, at most {}) \
                 as its first {}",
                p.ndevs,
                NET_MAX_DEVS_PER_NIC_V11,
                NET_MAX_DEVS_PER_NIC_V11
            )
        });
    }
    let mut devs = [0; NET_MAX_DEVS_PER_NIC_V11];
    devs[..n as usize].copy_from_slice(&p.devs[..n as usize]);
    NetVDevicePropsV11 { ndevs: n, devs }
}

impl Table {
    pub fn version(&self) -> u32 {
        match self {
            Table::V6(_) => 6,
            Table::V7(_) => 7,
            Table::V8(_) => 8,
            Table::V9(_) => 9,
            Table::V10(_) => 10,
            Table::V11(_) => 11,
            Table::V12(_) => 12,
        }
    }

    /// The plugin's name (for logs).
    pub fn name(&self) -> *const c_char {
        // SAFETY: see the type: a live table.
        unsafe { any!(*self, p => (*p).name) }
    }

    /// Whether the plugin takes one `init` per communicator (v11+) rather than one per process.
    pub fn per_comm(&self) -> bool {
        self.version() >= 11
    }

    /// The slots NCCL cannot do without; the names of those missing.
    pub fn missing_required(&self) -> Vec<&'static str> {
        // SAFETY: a live table.
        let have: [(&str, bool); 13] = unsafe {
            [
                ("init", self.has_init()),
                ("devices", any!(*self, p => (*p).devices.is_some())),
                (
                    "getProperties",
                    any!(*self, p => (*p).get_properties.is_some()),
                ),
                ("listen", any!(*self, p => (*p).listen.is_some())),
                ("connect", any!(*self, p => (*p).connect.is_some())),
                ("accept", any!(*self, p => (*p).accept.is_some())),
                ("regMr", any!(*self, p => (*p).reg_mr.is_some())),
                ("deregMr", any!(*self, p => (*p).dereg_mr.is_some())),
                ("isend", any!(*self, p => (*p).isend.is_some())),
                ("irecv", any!(*self, p => (*p).irecv.is_some())),
                ("test", any!(*self, p => (*p).test.is_some())),
                ("closeSend", any!(*self, p => (*p).close_send.is_some())),
                ("closeRecv", any!(*self, p => (*p).close_recv.is_some())),
            ]
        };
        let mut missing: Vec<&str> = have.iter().filter(|(_, ok)| !ok).map(|(n, _)| *n).collect();
        // SAFETY: a live table.
        if unsafe { any!(*self, p => (*p).close_listen.is_none()) } {
            missing.push("closeListen");
        }
        missing
    }

    unsafe fn has_init(&self) -> bool {
        // SAFETY: a live table (the caller's contract).
        unsafe {
            match *self {
                Table::V6(p) => (*p).init.is_some(),
                Table::V7(p) => (*p).init.is_some(),
                Table::V8(p) => (*p).init.is_some(),
                Table::V9(p) => (*p).init.is_some(),
                Table::V10(p) => (*p).init.is_some(),
                Table::V11(p) => (*p).init.is_some(),
                Table::V12(p) => (*p).init.is_some(),
            }
        }
    }

    /// `init` of a v6 to v10 plugin (once per process).
    ///
    /// # Safety
    /// As NCCL calls `init`.
    pub unsafe fn init_process(&self, log: DebugLogger, prof: ProfilerCallback) -> NcclResult {
        // SAFETY: the caller's contract; a live table.
        unsafe {
            let r = match *self {
                Table::V6(p) => (*p).init.map(|f| f(log)),
                Table::V7(p) => (*p).init.map(|f| f(log)),
                Table::V8(p) => (*p).init.map(|f| f(log)),
                Table::V9(p) => (*p).init.map(|f| f(log)),
                Table::V10(p) => (*p).init.map(|f| f(log, prof)),
                Table::V11(_) | Table::V12(_) => None,
            };
            r.unwrap_or(MISSING)
        }
    }

    /// `init` of a v11+ plugin (once per communicator).
    ///
    /// # Safety
    /// As NCCL calls `init`.
    pub unsafe fn init_comm(
        &self,
        ctx: *mut Vp,
        comm_id: u64,
        config: *mut NetCommConfig,
        log: DebugLogger,
        prof: ProfilerCallback,
    ) -> NcclResult {
        // SAFETY: the caller's contract; a live table.
        unsafe {
            let r = match *self {
                Table::V11(p) => (*p).init.map(|f| f(ctx, comm_id, config, log, prof)),
                Table::V12(p) => (*p).init.map(|f| f(ctx, comm_id, config, log, prof)),
                _ => None,
            };
            r.unwrap_or(MISSING)
        }
    }

    /// # Safety
    /// As NCCL calls `finalize` (v11+; older plugins have none).
    pub unsafe fn finalize(&self, ctx: Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            let f = match *self {
                Table::V11(p) => (*p).finalize,
                Table::V12(p) => (*p).finalize,
                _ => None,
            };
            f.map_or(NcclResult::SUCCESS, |f| f(ctx))
        }
    }

    /// # Safety
    /// As NCCL calls `devices`.
    pub unsafe fn devices(&self, ndev: *mut c_int) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { any!(*self, p => (*p).devices.map_or(MISSING, |f| f(ndev))) }
    }

    /// The device's properties in the newest layout: fields an older version lacks get the
    /// values NCCL's own adapters give them.
    ///
    /// # Safety
    /// As NCCL calls `getProperties`.
    pub unsafe fn properties(&self, dev: c_int) -> Result<NetPropertiesV12, NcclResult> {
        let mut devs = [0; NET_MAX_DEVS_PER_NIC_V12];
        devs[0] = dev;
        let mut out = NetPropertiesV12 {
            name: std::ptr::null_mut(),
            pci_path: std::ptr::null_mut(),
            guid: 0,
            ptr_support: 0,
            reg_is_global: 0,
            force_flush: 0,
            speed: 0,
            port: 0,
            latency: 0.0,
            max_comms: 0,
            max_recvs: 1,
            net_device_type: NetDeviceType::HOST,
            net_device_version: 0,
            v_props: NetVDevicePropsV12 { ndevs: 1, devs },
            max_p2p_bytes: MAX_INT_SIZE,
            max_coll_bytes: MAX_INT_SIZE,
            max_multi_request_size: 1,
            rail_id: NET_ID_UNDEF,
            plane_id: NET_ID_UNDEF,
        };
        macro_rules! get {
            ($p:expr, $ty:ty) => {{
                // SAFETY: an all-zero properties struct is valid (pointers NULL, numbers 0).
                let mut v: $ty = unsafe { std::mem::zeroed() };
                // SAFETY: the caller's contract; `v` is the version's own struct.
                let r = unsafe { (*$p).get_properties.map_or(MISSING, |f| f(dev, &mut v)) };
                if !r.is_success() {
                    return Err(r);
                }
                v
            }};
        }
        macro_rules! common {
            ($v:expr) => {{
                out.name = $v.name;
                out.pci_path = $v.pci_path;
                out.guid = $v.guid;
                out.ptr_support = $v.ptr_support;
                out.speed = $v.speed;
                out.port = $v.port;
                out.latency = $v.latency;
                out.max_comms = $v.max_comms;
                out.max_recvs = $v.max_recvs;
            }};
        }
        macro_rules! v7_fields {
            ($v:expr) => {{
                common!($v);
                out.net_device_type = $v.net_device_type;
                out.net_device_version = $v.net_device_version;
            }};
        }
        macro_rules! v9_fields {
            ($v:expr) => {{
                v7_fields!($v);
                out.reg_is_global = $v.reg_is_global;
                out.force_flush = $v.force_flush;
                out.max_p2p_bytes = $v.max_p2p_bytes;
                out.max_coll_bytes = $v.max_coll_bytes;
                let n = ($v.v_props.ndevs.max(0) as usize).min(NET_MAX_DEVS_PER_NIC_V11);
                out.v_props.ndevs = n as c_int;
                out.v_props.devs[..n].copy_from_slice(&$v.v_props.devs[..n]);
            }};
        }
        match *self {
            Table::V6(p) => common!(get!(p, NetPropertiesV6)),
            Table::V7(p) => v7_fields!(get!(p, NetPropertiesV7)),
            Table::V8(p) => {
                let v = get!(p, NetPropertiesV8);
                v7_fields!(v);
                out.reg_is_global = v.reg_is_global;
            }
            Table::V9(p) => v9_fields!(get!(p, NetPropertiesV9)),
            Table::V10(p) => v9_fields!(get!(p, NetPropertiesV10)),
            Table::V11(p) => {
                let v = get!(p, NetPropertiesV11);
                v9_fields!(v);
                out.max_multi_request_size = v.max_multi_request_size;
            }
            Table::V12(p) => out = get!(p, NetPropertiesV12),
        }
        Ok(out)
    }

    /// # Safety
    /// As NCCL calls `listen`; `ctx` is the plugin's own (v11+) or ignored.
    pub unsafe fn listen(&self, ctx: Vp, dev: c_int, handle: Vp, lc: *mut Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            match *self {
                Table::V11(p) => (*p).listen.map_or(MISSING, |f| f(ctx, dev, handle, lc)),
                Table::V12(p) => (*p).listen.map_or(MISSING, |f| f(ctx, dev, handle, lc)),
                Table::V6(p) => (*p).listen.map_or(MISSING, |f| f(dev, handle, lc)),
                Table::V7(p) => (*p).listen.map_or(MISSING, |f| f(dev, handle, lc)),
                Table::V8(p) => (*p).listen.map_or(MISSING, |f| f(dev, handle, lc)),
                Table::V9(p) => (*p).listen.map_or(MISSING, |f| f(dev, handle, lc)),
                Table::V10(p) => (*p).listen.map_or(MISSING, |f| f(dev, handle, lc)),
            }
        }
    }

    /// # Safety
    /// As NCCL calls `connect`; `ctx` is the plugin's own (v11+), `config` the communicator's
    /// (v10).
    pub unsafe fn connect(
        &self,
        ctx: Vp,
        config: *mut NetCommConfig,
        dev: c_int,
        handle: Vp,
        sc: *mut Vp,
        dh: *mut *mut NetDeviceHandle,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            match *self {
                Table::V6(p) => (*p).connect.map_or(MISSING, |f| f(dev, handle, sc)),
                Table::V7(p) => (*p).connect.map_or(MISSING, |f| f(dev, handle, sc, dh)),
                Table::V8(p) => (*p).connect.map_or(MISSING, |f| f(dev, handle, sc, dh)),
                Table::V9(p) => (*p).connect.map_or(MISSING, |f| f(dev, handle, sc, dh)),
                Table::V10(p) => (*p)
                    .connect
                    .map_or(MISSING, |f| f(dev, config, handle, sc, dh)),
                Table::V11(p) => (*p)
                    .connect
                    .map_or(MISSING, |f| f(ctx, dev, handle, sc, dh)),
                Table::V12(p) => (*p)
                    .connect
                    .map_or(MISSING, |f| f(ctx, dev, handle, sc, dh)),
            }
        }
    }

    /// # Safety
    /// As NCCL calls `accept`.
    pub unsafe fn accept(&self, lc: Vp, rc: *mut Vp, dh: *mut *mut NetDeviceHandle) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            match *self {
                Table::V6(p) => (*p).accept.map_or(MISSING, |f| f(lc, rc)),
                Table::V7(p) => (*p).accept.map_or(MISSING, |f| f(lc, rc, dh)),
                Table::V8(p) => (*p).accept.map_or(MISSING, |f| f(lc, rc, dh)),
                Table::V9(p) => (*p).accept.map_or(MISSING, |f| f(lc, rc, dh)),
                Table::V10(p) => (*p).accept.map_or(MISSING, |f| f(lc, rc, dh)),
                Table::V11(p) => (*p).accept.map_or(MISSING, |f| f(lc, rc, dh)),
                Table::V12(p) => (*p).accept.map_or(MISSING, |f| f(lc, rc, dh)),
            }
        }
    }

    /// # Safety
    /// As NCCL calls `regMr`.
    pub unsafe fn reg_mr(
        &self,
        comm: Vp,
        data: Vp,
        size: usize,
        ty: c_int,
        mh: *mut Vp,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            match *self {
                Table::V6(p) => match reg_int_size(size) {
                    Some(s) => (*p).reg_mr.map_or(MISSING, |f| f(comm, data, s, ty, mh)),
                    None => NcclResult::INTERNAL_ERROR,
                },
                Table::V7(p) => match reg_int_size(size) {
                    Some(s) => (*p).reg_mr.map_or(MISSING, |f| f(comm, data, s, ty, mh)),
                    None => NcclResult::INTERNAL_ERROR,
                },
                Table::V8(p) => (*p).reg_mr.map_or(MISSING, |f| f(comm, data, size, ty, mh)),
                Table::V9(p) => (*p).reg_mr.map_or(MISSING, |f| f(comm, data, size, ty, mh)),
                Table::V10(p) => (*p).reg_mr.map_or(MISSING, |f| f(comm, data, size, ty, mh)),
                Table::V11(p) => (*p).reg_mr.map_or(MISSING, |f| f(comm, data, size, ty, mh)),
                Table::V12(p) => (*p).reg_mr.map_or(MISSING, |f| f(comm, data, size, ty, mh)),
            }
        }
    }

    pub fn has_reg_mr_dma_buf(&self) -> bool {
        // SAFETY: a live table.
        unsafe { any!(*self, p => (*p).reg_mr_dma_buf.is_some()) }
    }

    /// # Safety
    /// As NCCL calls `regMrDmaBuf`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reg_mr_dma_buf(
        &self,
        comm: Vp,
        data: Vp,
        size: usize,
        ty: c_int,
        offset: u64,
        fd: c_int,
        mh: *mut Vp,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            any!(*self, p => (*p).reg_mr_dma_buf.map_or(MISSING, |f| f(comm, data, size, ty, offset, fd, mh)))
        }
    }

    /// # Safety
    /// As NCCL calls `deregMr`.
    pub unsafe fn dereg_mr(&self, comm: Vp, mh: Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { any!(*self, p => (*p).dereg_mr.map_or(MISSING, |f| f(comm, mh))) }
    }

    /// # Safety
    /// As NCCL calls `isend`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn isend(
        &self,
        comm: Vp,
        data: Vp,
        size: usize,
        tag: c_int,
        mh: Vp,
        phandle: Vp,
        req: *mut Vp,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            macro_rules! int {
                ($p:expr) => {
                    match int_size(size) {
                        Some(s) => (*$p)
                            .isend
                            .map_or(MISSING, |f| f(comm, data, s, tag, mh, req)),
                        None => NcclResult::INTERNAL_ERROR,
                    }
                };
            }
            match *self {
                Table::V6(p) => int!(p),
                Table::V7(p) => int!(p),
                Table::V8(p) => int!(p),
                Table::V9(p) => (*p)
                    .isend
                    .map_or(MISSING, |f| f(comm, data, size, tag, mh, req)),
                Table::V10(p) => (*p)
                    .isend
                    .map_or(MISSING, |f| f(comm, data, size, tag, mh, phandle, req)),
                Table::V11(p) => (*p)
                    .isend
                    .map_or(MISSING, |f| f(comm, data, size, tag, mh, phandle, req)),
                Table::V12(p) => (*p)
                    .isend
                    .map_or(MISSING, |f| f(comm, data, size, tag, mh, phandle, req)),
            }
        }
    }

    /// # Safety
    /// As NCCL calls `irecv`, with `n <= MAX_RECVS` entries in each array.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn irecv(
        &self,
        comm: Vp,
        n: c_int,
        data: *mut Vp,
        sizes: *mut usize,
        tags: *mut c_int,
        mhs: *mut Vp,
        phandles: *mut Vp,
        req: *mut Vp,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            macro_rules! int {
                ($p:expr) => {{
                    // NCCL's optional-completion hint (`*req == 0x1`) is for v9+ plugins: its
                    // own adapters for v6 to v8 reset it to NULL first (such a plugin may
                    // leave `*req` alone on "try again", and 0x1 would then be tested as a
                    // request).
                    if !req.is_null() && *req as usize == NET_OPTIONAL_RECV_COMPLETION {
                        *req = std::ptr::null_mut();
                    }
                    let count = n.clamp(0, MAX_RECVS as c_int) as usize;
                    let mut ints = [0 as c_int; MAX_RECVS];
                    if !sizes.is_null() {
                        for (i, slot) in ints.iter_mut().enumerate().take(count) {
                            match int_size(*sizes.add(i)) {
                                Some(s) => *slot = s,
                                None => return NcclResult::INTERNAL_ERROR,
                            }
                        }
                    }
                    let s = if sizes.is_null() {
                        std::ptr::null_mut()
                    } else {
                        ints.as_mut_ptr()
                    };
                    (*$p)
                        .irecv
                        .map_or(MISSING, |f| f(comm, n, data, s, tags, mhs, req))
                }};
            }
            match *self {
                Table::V6(p) => int!(p),
                Table::V7(p) => int!(p),
                Table::V8(p) => int!(p),
                Table::V9(p) => (*p)
                    .irecv
                    .map_or(MISSING, |f| f(comm, n, data, sizes, tags, mhs, req)),
                Table::V10(p) => (*p).irecv.map_or(MISSING, |f| {
                    f(comm, n, data, sizes, tags, mhs, phandles, req)
                }),
                Table::V11(p) => (*p).irecv.map_or(MISSING, |f| {
                    f(comm, n, data, sizes, tags, mhs, phandles, req)
                }),
                Table::V12(p) => (*p).irecv.map_or(MISSING, |f| {
                    f(comm, n, data, sizes, tags, mhs, phandles, req)
                }),
            }
        }
    }

    /// `iflush`; a plugin without one has nothing to flush (`*req` = NULL: done).
    ///
    /// # Safety
    /// As NCCL calls `iflush`.
    pub unsafe fn iflush(
        &self,
        comm: Vp,
        n: c_int,
        data: *mut Vp,
        sizes: *mut c_int,
        mhs: *mut Vp,
        req: *mut Vp,
    ) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            match any!(*self, p => (*p).iflush) {
                Some(f) => f(comm, n, data, sizes, mhs, req),
                None => {
                    if !req.is_null() {
                        *req = std::ptr::null_mut();
                    }
                    NcclResult::SUCCESS
                }
            }
        }
    }

    /// # Safety
    /// As NCCL calls `test`.
    pub unsafe fn test(&self, req: Vp, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { any!(*self, p => (*p).test.map_or(MISSING, |f| f(req, done, sizes))) }
    }

    /// # Safety
    /// As NCCL calls `closeSend`.
    pub unsafe fn close_send(&self, c: Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { any!(*self, p => (*p).close_send.map_or(MISSING, |f| f(c))) }
    }

    /// # Safety
    /// As NCCL calls `closeRecv`.
    pub unsafe fn close_recv(&self, c: Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { any!(*self, p => (*p).close_recv.map_or(MISSING, |f| f(c))) }
    }

    /// # Safety
    /// As NCCL calls `closeListen`.
    pub unsafe fn close_listen(&self, c: Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { any!(*self, p => (*p).close_listen.map_or(MISSING, |f| f(c))) }
    }

    pub fn has_get_device_mr(&self) -> bool {
        // SAFETY: a live table.
        unsafe { from_v7!(*self, get_device_mr).is_some() }
    }

    /// # Safety
    /// As NCCL calls `getDeviceMr`.
    pub unsafe fn get_device_mr(&self, comm: Vp, mh: Vp, dptr: *mut Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { from_v7!(*self, get_device_mr).map_or(MISSING, |f| f(comm, mh, dptr)) }
    }

    pub fn has_irecv_consumed(&self) -> bool {
        // SAFETY: a live table.
        unsafe { from_v7!(*self, irecv_consumed).is_some() }
    }

    /// # Safety
    /// As NCCL calls `irecvConsumed`.
    pub unsafe fn irecv_consumed(&self, comm: Vp, n: c_int, req: Vp) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe { from_v7!(*self, irecv_consumed).map_or(MISSING, |f| f(comm, n, req)) }
    }

    pub fn has_make_v_device(&self) -> bool {
        // SAFETY: a live table.
        unsafe {
            match *self {
                Table::V6(_) | Table::V7(_) | Table::V8(_) => false,
                Table::V9(p) => (*p).make_v_device.is_some(),
                Table::V10(p) => (*p).make_v_device.is_some(),
                Table::V11(p) => (*p).make_v_device.is_some(),
                Table::V12(p) => (*p).make_v_device.is_some(),
            }
        }
    }

    /// `makeVDevice` in the newest layout (8 devices); an older plugin takes at most 4.
    ///
    /// # Safety
    /// As NCCL calls `makeVDevice`.
    pub unsafe fn make_v_device(
        &self,
        d: *mut c_int,
        props: *const NetVDevicePropsV12,
    ) -> NcclResult {
        // SAFETY: the caller's contract: `props` points to a v12 struct for this call.
        unsafe {
            let mut v12 = *props;
            let n = v12.ndevs.max(0) as usize;
            let mut v11 = NetVDevicePropsV11 {
                ndevs: v12.ndevs,
                devs: [0; NET_MAX_DEVS_PER_NIC_V11],
            };
            let old = |v11: &mut NetVDevicePropsV11| {
                if n > NET_MAX_DEVS_PER_NIC_V11 {
                    return false;
                }
                v11.devs[..n].copy_from_slice(&v12.devs[..n]);
                true
            };
            match *self {
                Table::V9(p) if old(&mut v11) => {
                    (*p).make_v_device.map_or(MISSING, |f| f(d, &mut v11))
                }
                Table::V10(p) if old(&mut v11) => {
                    (*p).make_v_device.map_or(MISSING, |f| f(d, &mut v11))
                }
                Table::V11(p) if old(&mut v11) => {
                    (*p).make_v_device.map_or(MISSING, |f| f(d, &mut v11))
                }
                Table::V12(p) => (*p).make_v_device.map_or(MISSING, |f| f(d, &mut v12)),
                Table::V9(_) | Table::V10(_) | Table::V11(_) => NcclResult::INVALID_ARGUMENT,
                _ => MISSING,
            }
        }
    }

    pub fn has_set_net_attr(&self) -> bool {
        // SAFETY: a live table.
        unsafe {
            match *self {
                Table::V11(p) => (*p).set_net_attr.is_some(),
                Table::V12(p) => (*p).set_net_attr.is_some(),
                _ => false,
            }
        }
    }

    /// # Safety
    /// As NCCL calls `setNetAttr`; a plugin without one ignores the attributes.
    pub unsafe fn set_net_attr(&self, ctx: Vp, attr: *mut NetAttr) -> NcclResult {
        // SAFETY: the caller's contract.
        unsafe {
            let f = match *self {
                Table::V11(p) => (*p).set_net_attr,
                Table::V12(p) => (*p).set_net_attr,
                _ => None,
            };
            f.map_or(NcclResult::SUCCESS, |f| f(ctx, attr))
        }
    }
}
