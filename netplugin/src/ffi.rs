//! The C ABI: `ncclNetPlugin_v7` … `ncclNetPlugin_v12`, each a thin adapter over one
//! implementation.
//!
//! Every entry point runs inside [`guard`], which catches panics and turns errors into the
//! `ncclResult_t` NCCL expects, with a line in NCCL's log. Raw pointers from NCCL are checked
//! for NULL here and turned into safe Rust values before anything else sees them.
//!
//! # Safety
//!
//! Every `pub unsafe extern "C" fn` here is an adapter for the plugin library's exported tables
//! (`plugin/src`): it must be called only as NCCL calls it, with the pointers NCCL's ABI defines
//! for that slot (`ncclnet-headers`). Each one checks its pointers for NULL and catches panics.
#![allow(clippy::missing_safety_doc)]

use crate::buf::Buf;
use crate::comm::{Comm, ReqSlot};
use crate::error::{NetError, NetResult};
use crate::inner::{self, Ctx, Inner, wrap};
use crate::log::set_logger;
use crate::plugin::{self, NetContext};
use crate::setup::{self, Endpoint, ListenComm};
use crate::wire::HANDLE_SIZE;
use ncclbpf_host::Part;
use ncclnet_headers::net::*;
use ncclnet_headers::{DebugLogger, NcclResult, ProfilerCallback};
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

type Vp = *mut c_void;

/// Runs `f`, catching panics; logs and converts errors.
pub fn guard(what: &'static str, f: impl FnOnce() -> NetResult<()>) -> NcclResult {
    // The error becomes its code (and a log line) inside the unwind boundary, so what crosses
    // it is 4 bytes, not the whole `NetResult`: on the data path, where every call succeeds,
    // copying that through `catch_unwind` stalled on store forwarding (a third of `test`).
    let run = || match f() {
        Ok(()) => NcclResult::SUCCESS,
        Err(e) => {
            let code = e.code();
            crate::nlog!(WARN, NET, "{what} failed: {e} ({})", code.name());
            code
        }
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(code) => code,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let e = NetError::Panic(msg);
            crate::nlog!(WARN, NET, "{what}: {e}");
            e.code()
        }
    }
}

/// Writes `v` through an out-pointer NCCL gave us.
pub(crate) fn put<T>(p: *mut T, v: T, what: &str) -> NetResult<()> {
    if p.is_null() {
        return Err(NetError::Misuse(format!("NULL {what} pointer")));
    }
    // SAFETY: non-null out-pointer from NCCL, valid for one T per the ABI.
    unsafe { p.write(v) };
    Ok(())
}

pub(crate) fn handle_buf<'a>(handle: Vp) -> NetResult<&'a mut [u8; HANDLE_SIZE]> {
    if handle.is_null() {
        return Err(NetError::Misuse("NULL handle".into()));
    }
    // SAFETY: NCCL's handle is a writable 128-byte buffer (NCCL_NET_HANDLE_MAXSIZE).
    Ok(unsafe { &mut *(handle as *mut [u8; HANDLE_SIZE]) })
}

fn comm_ref<'a>(comm: Vp) -> NetResult<&'a Comm> {
    if comm.is_null() {
        return Err(NetError::Misuse("NULL comm".into()));
    }
    // SAFETY: send/recv comms we hand to NCCL are Box<Comm> pointers, live until closed.
    Ok(unsafe { &*(comm as *const Comm) })
}

fn request_out(request: *mut Vp, slot: Option<&ReqSlot>) -> NetResult<()> {
    put(
        request,
        slot.map_or(std::ptr::null_mut(), |s| s as *const ReqSlot as Vp),
        "request",
    )
}

// ---------------------------------------------------------------- shared implementations

/// The inner plugin, when one carries the traffic (`NCCL_BPF_NET_INNER`).
fn inner_backend() -> NetResult<Option<&'static Inner>> {
    Ok(plugin::get()?.inner())
}

/// The inner plugin, for calls that cannot fail for want of `init` (`test`, `iflush`, closes:
/// over our sockets they work on the objects they are given).
fn inner_if_any() -> Option<&'static Inner> {
    plugin::get().ok().and_then(|p| p.inner())
}

/// What a call with NCCL's context `ctx` (NULL before v11) carries to the inner plugin.
fn inner_ctx(i: &Inner, ctx: Vp) -> Ctx {
    if ctx.is_null() {
        return i.default_ctx();
    }
    // SAFETY: a non-null ctx is a NetContext from init_v11, alive until finalize.
    unsafe { (*(ctx as *const NetContext)).inner }.unwrap_or_else(|| i.default_ctx())
}

/// The optional slots the exported tables must offer after a successful `init`: `None` over
/// our sockets (the tables' defaults), the inner plugin's otherwise.
pub fn optional_slots() -> Option<inner::OptionalSlots> {
    plugin::get().ok()?.inner().map(Inner::optional_slots)
}

/// Makes this library a plain backend for another copy of ncclbpf (exported as
/// `ncclbpf_net_backend_only`, called by that copy before our `init`).
pub extern "C" fn backend_only() {
    plugin::set_backend_only();
}

/// The process-wide part of every version's `init`. `per_comm`: NCCL calls our v11+ `init`
/// (once per communicator; the inner plugin's context is made there), else once per process.
fn init_process(log: DebugLogger, prof: ProfilerCallback, per_comm: bool) -> NcclResult {
    set_logger(log);
    guard("init", || {
        let p = plugin::init()?;
        if let Some(i) = p.inner()
            && !per_comm
        {
            i.init_process(log, prof)?;
        }
        if !plugin::backend_only() && !per_comm {
            // Net v7-v10: no finalize, so the hold lasts until the process exits (once).
            static HELD: std::sync::Once = std::sync::Once::new();
            HELD.call_once(|| ncclbpf_host::acquire(Part::Net));
        }
        Ok(())
    })
}

pub unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    guard("devices", || {
        let p = plugin::get()?;
        if let Some(i) = p.inner() {
            // SAFETY: NCCL's out-pointer, passed on.
            return inner::check("devices", unsafe { i.table.devices(ndev) });
        }
        put(ndev, p.socket_devices() as c_int, "ndev")
    })
}

/// Properties in the newest layout; older versions copy from it.
fn props_v12(dev: c_int) -> NetResult<NetPropertiesV12> {
    let p = plugin::get()?;
    if let Some(i) = p.inner() {
        // SAFETY: as NCCL calls getProperties.
        let mut props = unsafe { i.table.properties(dev) }.map_err(|code| NetError::Inner {
            op: "getProperties",
            code,
        })?;
        props.ptr_support = wrap::ptr_support(i, props.ptr_support);
        return Ok(props);
    }
    let d = p.device(dev)?;
    let mut devs = [0; NET_MAX_DEVS_PER_NIC_V12];
    devs[0] = dev;
    Ok(NetPropertiesV12 {
        name: d.name.as_ptr() as *mut _,
        pci_path: d
            .pci_path
            .as_ref()
            .map_or(std::ptr::null_mut(), |s| s.as_ptr() as *mut _),
        guid: dev as u64,
        ptr_support: PtrType::HOST.0,
        reg_is_global: 0,
        force_flush: 0,
        speed: d.speed_mbps,
        port: 0,
        latency: 0.0,
        max_comms: 65536,
        max_recvs: 1,
        net_device_type: NetDeviceType::HOST,
        net_device_version: 0,
        v_props: NetVDevicePropsV12 { ndevs: 1, devs },
        max_p2p_bytes: MAX_MESSAGE,
        max_coll_bytes: 512 << 20,
        max_multi_request_size: 1,
        rail_id: NET_ID_UNDEF,
        plane_id: NET_ID_UNDEF,
    })
}

fn v_props_v11(p: &NetPropertiesV12) -> NetVDevicePropsV11 {
    inner::table::v_props_v11(&p.v_props)
}

/// Which device and communicator a connection serves (the communicator is known from v11).
fn endpoint(dev: c_int, ctx: Vp) -> Endpoint {
    let comm_id = if ctx.is_null() {
        0
    } else {
        // SAFETY: a non-null ctx is a NetContext from init_v11, alive until finalize.
        unsafe { (*(ctx as *const NetContext)).comm_id }
    };
    Endpoint {
        dev: dev.max(0) as u32,
        comm_id,
        quiet: false,
    }
}

fn listen(dev: c_int, ctx: Vp, handle: Vp, listen_comm: *mut Vp) -> NetResult<()> {
    let p = plugin::get()?;
    if let Some(i) = p.inner() {
        return wrap::listen(i, &inner_ctx(i, ctx), dev, handle, listen_comm);
    }
    let d = p.device(dev)?;
    let l = setup::listen(
        endpoint(dev, ctx),
        d.bind_addr(),
        p.shape(),
        handle_buf(handle)?,
    )?;
    put(listen_comm, Box::into_raw(l) as Vp, "listenComm")
}

fn connect(
    dev: c_int,
    ctx: Vp,
    handle: Vp,
    send_comm: *mut Vp,
    dh: *mut *mut NetDeviceHandle,
) -> NetResult<()> {
    if let Some(i) = inner_backend()? {
        return wrap::connect(i, &inner_ctx(i, ctx), dev, handle, send_comm, dh);
    }
    plugin::get()?.device(dev)?;
    // Report "in progress" unless the comm is up.
    put(send_comm, std::ptr::null_mut(), "sendComm")?;
    if let Some(c) = setup::connect(endpoint(dev, ctx), handle_buf(handle)?)? {
        put(send_comm, Box::into_raw(c) as Vp, "sendComm")?;
    }
    Ok(())
}

pub unsafe extern "C" fn accept(
    listen_comm: Vp,
    recv_comm: *mut Vp,
    dh: *mut *mut NetDeviceHandle,
) -> NcclResult {
    guard("accept", || {
        if let Some(i) = inner_backend()? {
            return wrap::accept(i, listen_comm, recv_comm, dh);
        }
        put(recv_comm, std::ptr::null_mut(), "recvComm")?;
        if listen_comm.is_null() {
            return Err(NetError::Misuse("NULL listenComm".into()));
        }
        // SAFETY: listen comms we hand out are Box<ListenComm>, used by one thread at a time.
        let l = unsafe { &mut *(listen_comm as *mut ListenComm) };
        if let Some(c) = l.accept()? {
            put(recv_comm, Box::into_raw(c) as Vp, "recvComm")?;
        }
        Ok(())
    })
}

fn reg_mr(comm: Vp, data: Vp, size: usize, type_: c_int, mhandle: *mut Vp) -> NetResult<()> {
    if let Some(i) = inner_backend()? {
        return wrap::reg_mr(i, comm, data, size, type_, mhandle);
    }
    comm_ref(comm)?;
    if type_ != PtrType::HOST.0 {
        return Err(NetError::Misuse(format!(
            "regMr of memory type {type_}: this plugin carries host memory only (NCCL_PTR_HOST)"
        )));
    }
    let _ = size;
    // Host memory needs no registration; the handle is only a token.
    put(mhandle, comm, "mhandle")
}

pub unsafe extern "C" fn reg_mr_v8(
    comm: Vp,
    data: Vp,
    size: usize,
    type_: c_int,
    mhandle: *mut Vp,
) -> NcclResult {
    guard("regMr", || reg_mr(comm, data, size, type_, mhandle))
}

pub unsafe extern "C" fn reg_mr_v7(
    comm: Vp,
    data: Vp,
    size: c_int,
    type_: c_int,
    mhandle: *mut Vp,
) -> NcclResult {
    guard("regMr", || {
        reg_mr(comm, data, size.max(0) as usize, type_, mhandle)
    })
}

pub unsafe extern "C" fn dereg_mr(comm: Vp, mhandle: Vp) -> NcclResult {
    guard("deregMr", || match inner_backend()? {
        Some(i) => wrap::dereg_mr(i, comm, mhandle),
        None => Ok(()),
    })
}

/// The inner plugin, for a slot offered only when it has one (a call without is misuse).
fn inner_for(what: &str) -> NetResult<&'static Inner> {
    inner_backend()?
        .ok_or_else(|| NetError::Misuse(format!("{what} without an inner plugin that offers it")))
}

/// `regMrDmaBuf`, offered exactly when the inner plugin has one.
pub unsafe extern "C" fn reg_mr_dma_buf(
    comm: Vp,
    data: Vp,
    size: usize,
    type_: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut Vp,
) -> NcclResult {
    guard("regMrDmaBuf", || {
        wrap::reg_mr_dma_buf(
            inner_for("regMrDmaBuf")?,
            comm,
            data,
            size,
            type_,
            offset,
            fd,
            mhandle,
        )
    })
}

/// `getDeviceMr`, offered exactly when the inner plugin has one.
pub unsafe extern "C" fn get_device_mr(comm: Vp, mhandle: Vp, dptr: *mut Vp) -> NcclResult {
    guard("getDeviceMr", || {
        wrap::get_device_mr(inner_for("getDeviceMr")?, comm, mhandle, dptr)
    })
}

/// `irecvConsumed`, offered exactly when the inner plugin has one.
pub unsafe extern "C" fn irecv_consumed(comm: Vp, n: c_int, request: Vp) -> NcclResult {
    guard("irecvConsumed", || {
        wrap::irecv_consumed(inner_for("irecvConsumed")?, comm, n, request)
    })
}

/// `makeVDevice` of net v12 (8 devices), offered exactly when the inner plugin has one.
pub unsafe extern "C" fn make_v_device_v12(
    d: *mut c_int,
    props: *mut NetVDevicePropsV12,
) -> NcclResult {
    guard("makeVDevice", || {
        let i = inner_for("makeVDevice")?;
        if props.is_null() {
            return Err(NetError::Misuse("NULL vProps".into()));
        }
        // SAFETY: NCCL's vProps for this call.
        inner::check("makeVDevice", unsafe { i.table.make_v_device(d, props) })
    })
}

/// `makeVDevice` of net v9 to v11 (4 devices).
pub unsafe extern "C" fn make_v_device_v11(
    d: *mut c_int,
    props: *mut NetVDevicePropsV11,
) -> NcclResult {
    guard("makeVDevice", || {
        let i = inner_for("makeVDevice")?;
        if props.is_null() {
            return Err(NetError::Misuse("NULL vProps".into()));
        }
        // SAFETY: NCCL's vProps for this call.
        let old = unsafe { *props };
        let n = (old.ndevs.max(0) as usize).min(NET_MAX_DEVS_PER_NIC_V11);
        let mut devs = [0; NET_MAX_DEVS_PER_NIC_V12];
        devs[..n].copy_from_slice(&old.devs[..n]);
        let v12 = NetVDevicePropsV12 {
            ndevs: old.ndevs,
            devs,
        };
        // SAFETY: a v12 copy of NCCL's vProps.
        inner::check("makeVDevice", unsafe { i.table.make_v_device(d, &v12) })
    })
}

/// The largest message: what `test()` can report back in its `int` sizes (advertised as
/// `maxP2pBytes`).
pub const MAX_MESSAGE: usize = i32::MAX as usize;

/// Checks a buffer NCCL hands to `isend`/`irecv` before anything is taken for it.
fn check_buffer(op: &str, data: Vp, size: usize) -> NetResult<()> {
    if size > MAX_MESSAGE {
        return Err(NetError::InvalidArgument(format!(
            "{op} of {size} bytes: over maxP2pBytes ({MAX_MESSAGE})"
        )));
    }
    if data.is_null() && size > 0 {
        return Err(NetError::InvalidArgument(format!(
            "{op} of {size} bytes from a NULL buffer"
        )));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn isend(
    comm: Vp,
    data: Vp,
    size: usize,
    tag: c_int,
    mh: Vp,
    phandle: Vp,
    request: *mut Vp,
) -> NetResult<()> {
    if let Some(i) = inner_backend()? {
        return wrap::isend(i, comm, data, size, tag, mh, phandle, request);
    }
    let c = comm_ref(comm)?;
    check_buffer("isend", data, size)?;
    // SAFETY: NCCL lends `data` for `size` bytes until the request completes.
    let buf = unsafe { Buf::new(data.cast(), size) };
    let slot = c.isend(buf)?;
    request_out(request, slot)
}

fn irecv(
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    size0: Option<usize>,
    request: *mut Vp,
) -> NetResult<()> {
    // Always overwrite *request: NCCL may have stored the 0x1 hint there.
    put(request, std::ptr::null_mut(), "request")?;
    let c = comm_ref(comm)?;
    if n != 1 {
        return Err(NetError::Misuse(format!(
            "irecv with n={n}, but maxRecvs is 1"
        )));
    }
    let size = size0.ok_or_else(|| NetError::Misuse("NULL sizes".into()))?;
    if data.is_null() {
        return Err(NetError::Misuse("NULL data".into()));
    }
    // SAFETY: a non-null data array holds n = 1 buffer pointers.
    check_buffer("irecv", unsafe { *data }, size)?;
    // SAFETY: data points to n = 1 buffer pointers; that buffer is lent for `size` bytes.
    let buf = unsafe { Buf::new((*data).cast(), size) };
    let slot = c.irecv(buf)?;
    request_out(request, slot)
}

pub unsafe extern "C" fn isend_v9(
    comm: Vp,
    data: Vp,
    size: usize,
    tag: c_int,
    mh: Vp,
    request: *mut Vp,
) -> NcclResult {
    guard("isend", || {
        isend(comm, data, size, tag, mh, std::ptr::null_mut(), request)
    })
}

pub unsafe extern "C" fn isend_v7(
    comm: Vp,
    data: Vp,
    size: c_int,
    tag: c_int,
    mh: Vp,
    request: *mut Vp,
) -> NcclResult {
    guard("isend", || {
        let size = usize::try_from(size)
            .map_err(|_| NetError::InvalidArgument(format!("isend of a negative size {size}")))?;
        isend(comm, data, size, tag, mh, std::ptr::null_mut(), request)
    })
}

pub unsafe extern "C" fn isend_v10(
    comm: Vp,
    data: Vp,
    size: usize,
    tag: c_int,
    mh: Vp,
    phandle: Vp,
    request: *mut Vp,
) -> NcclResult {
    guard("isend", || {
        isend(comm, data, size, tag, mh, phandle, request)
    })
}

/// Reads `sizes[0]` of type `T` if the array is non-NULL.
fn first<T: Copy>(p: *mut T) -> Option<T> {
    // SAFETY: a non-null sizes array holds n >= 1 entries.
    (!p.is_null()).then(|| unsafe { *p })
}

/// `irecv` over the inner plugin from a version with `int` sizes: widened on the stack.
#[allow(clippy::too_many_arguments)]
fn irecv_inner_int(
    i: &Inner,
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut c_int,
    tags: *mut c_int,
    mh: *mut Vp,
    request: *mut Vp,
) -> NetResult<()> {
    let mut wide = [0usize; inner::table::MAX_RECVS];
    let count = n.clamp(0, wide.len() as c_int) as usize;
    if !sizes.is_null() {
        for (k, w) in wide.iter_mut().enumerate().take(count) {
            // SAFETY: NCCL's sizes array holds n entries.
            let s = unsafe { *sizes.add(k) };
            *w = usize::try_from(s)
                .map_err(|_| NetError::InvalidArgument(format!("irecv of a negative size {s}")))?;
        }
    }
    let wide_ptr = if sizes.is_null() {
        std::ptr::null_mut()
    } else {
        wide.as_mut_ptr()
    };
    wrap::irecv(
        i,
        comm,
        n,
        data,
        wide_ptr,
        tags,
        mh,
        std::ptr::null_mut(),
        request,
    )
}

pub unsafe extern "C" fn irecv_v7(
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut c_int,
    tags: *mut c_int,
    mh: *mut Vp,
    request: *mut Vp,
) -> NcclResult {
    guard("irecv", || {
        if let Some(i) = inner_backend()? {
            return irecv_inner_int(i, comm, n, data, sizes, tags, mh, request);
        }
        let s =
            match first(sizes) {
                Some(s) => Some(usize::try_from(s).map_err(|_| {
                    NetError::InvalidArgument(format!("irecv of a negative size {s}"))
                })?),
                None => None,
            };
        irecv(comm, n, data, s, request)
    })
}

pub unsafe extern "C" fn irecv_v9(
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut Vp,
    request: *mut Vp,
) -> NcclResult {
    guard("irecv", || {
        if let Some(i) = inner_backend()? {
            let none = std::ptr::null_mut();
            return wrap::irecv(i, comm, n, data, sizes, tags, mh, none, request);
        }
        irecv(comm, n, data, first(sizes), request)
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn irecv_v10(
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut usize,
    tags: *mut c_int,
    mh: *mut Vp,
    phandles: *mut Vp,
    request: *mut Vp,
) -> NcclResult {
    guard("irecv", || {
        if let Some(i) = inner_backend()? {
            return wrap::irecv(i, comm, n, data, sizes, tags, mh, phandles, request);
        }
        irecv(comm, n, data, first(sizes), request)
    })
}

pub unsafe extern "C" fn iflush(
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut c_int,
    mh: *mut Vp,
    request: *mut Vp,
) -> NcclResult {
    guard("iflush", || {
        if let Some(i) = inner_if_any() {
            return wrap::iflush(i, comm, n, data, sizes, mh, request);
        }
        // Host memory needs no flush: a NULL request means "already done".
        put(request, std::ptr::null_mut(), "request")
    })
}

pub unsafe extern "C" fn test(request: Vp, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    guard("test", || {
        if let Some(i) = inner_if_any() {
            return wrap::test(i, request, done, sizes);
        }
        if request.is_null() {
            return Err(NetError::Misuse("test() on a NULL request".into()));
        }
        // SAFETY: requests we hand out point to ReqSlots of live comms; `comm()` checks a magic.
        let slot = unsafe { &*(request as *const ReqSlot) };
        let (comm, idx) = slot.comm()?;
        match comm.test(idx)? {
            Some(size) => {
                if !sizes.is_null() {
                    put(sizes, size.min(c_int::MAX as usize) as c_int, "sizes")?;
                }
                put(done, 1, "done")
            }
            None => put(done, 0, "done"),
        }
    })
}

pub unsafe extern "C" fn close_comm(comm: Vp) -> NcclResult {
    guard("close", || {
        if let Some(i) = inner_if_any() {
            return wrap::close(i, comm);
        }
        if !comm.is_null() {
            // SAFETY: NCCL closes each comm we created exactly once.
            unsafe { Box::from_raw(comm as *mut Comm) }.close();
        }
        Ok(())
    })
}

pub unsafe extern "C" fn close_listen(comm: Vp) -> NcclResult {
    guard("closeListen", || {
        if let Some(i) = inner_if_any() {
            return wrap::close_listen(i, comm);
        }
        if !comm.is_null() {
            // SAFETY: NCCL closes each listen comm we created exactly once.
            drop(unsafe { Box::from_raw(comm as *mut ListenComm) });
        }
        Ok(())
    })
}

// ---------------------------------------------------------------- version adapters

pub unsafe extern "C" fn init_v7(log: DebugLogger) -> NcclResult {
    init_process(log, None, false)
}

pub unsafe extern "C" fn init_v10(log: DebugLogger, prof: ProfilerCallback) -> NcclResult {
    init_process(log, prof, false)
}

pub unsafe extern "C" fn init_v11(
    ctx: *mut Vp,
    comm_id: u64,
    config: *mut NetCommConfig,
    log: DebugLogger,
    prof: ProfilerCallback,
) -> NcclResult {
    let r = init_process(log, prof, true);
    if !r.is_success() {
        return r;
    }
    guard("init", || {
        // SAFETY: NCCL's config points to a temporary we copy now (or is NULL).
        let cfg = (!config.is_null()).then(|| unsafe { *config });
        let traffic_class = cfg.map_or(NET_TRAFFIC_CLASS_UNDEF, |c| c.traffic_class);
        let inner = match plugin::get()?.inner() {
            Some(i) => Some(i.init_comm(comm_id, cfg, log, prof)?),
            None => None,
        };
        let c = Box::new(NetContext {
            comm_id,
            traffic_class,
            attr: Mutex::new(None),
            inner,
        });
        put(ctx, Box::into_raw(c) as Vp, "ctx")?;
        if !plugin::backend_only() {
            ncclbpf_host::acquire(Part::Net);
        }
        Ok(())
    })
}

pub unsafe extern "C" fn finalize(ctx: Vp) -> NcclResult {
    guard("finalize", || {
        if !ctx.is_null() {
            // SAFETY: ctx came from init_v11 and NCCL finalizes it once.
            let c = unsafe { Box::from_raw(ctx as *mut NetContext) };
            if !plugin::backend_only() {
                ncclbpf_host::release(Part::Net);
            }
            if let (Some(i), Some(ic)) = (plugin::get()?.inner(), c.inner.as_ref()) {
                i.finalize(ic)?;
            }
        }
        Ok(())
    })
}

pub unsafe extern "C" fn set_net_attr(ctx: Vp, attr: *mut NetAttr) -> NcclResult {
    guard("setNetAttr", || {
        if ctx.is_null() || attr.is_null() {
            return Ok(());
        }
        // SAFETY: ctx is a live NetContext; attr points to a NetAttr for this call.
        let (c, a) = unsafe { (&*(ctx as *const NetContext), *attr) };
        *c.attr.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
        if let (Some(i), Some(ic)) = (plugin::get()?.inner(), c.inner.as_ref()) {
            // SAFETY: the inner plugin's context and NCCL's attributes for this call.
            return inner::check("setNetAttr", unsafe {
                i.table.set_net_attr(ic.inner, attr)
            });
        }
        Ok(())
    })
}

pub unsafe extern "C" fn listen_v7(dev: c_int, handle: Vp, listen_comm: *mut Vp) -> NcclResult {
    guard("listen", || {
        listen(dev, std::ptr::null_mut(), handle, listen_comm)
    })
}

pub unsafe extern "C" fn listen_v11(
    ctx: Vp,
    dev: c_int,
    handle: Vp,
    listen_comm: *mut Vp,
) -> NcclResult {
    guard("listen", || listen(dev, ctx, handle, listen_comm))
}

pub unsafe extern "C" fn connect_v7(
    dev: c_int,
    handle: Vp,
    send_comm: *mut Vp,
    dc: *mut *mut NetDeviceHandle,
) -> NcclResult {
    guard("connect", || {
        connect(dev, std::ptr::null_mut(), handle, send_comm, dc)
    })
}

pub unsafe extern "C" fn connect_v10(
    dev: c_int,
    config: *mut NetCommConfig,
    handle: Vp,
    send_comm: *mut Vp,
    dc: *mut *mut NetDeviceHandle,
) -> NcclResult {
    guard("connect", || {
        if let Some(i) = inner_backend()? {
            // v10 gives the communicator's config here: it reaches a v10 inner plugin.
            let mut c = i.default_ctx();
            if !config.is_null() {
                // SAFETY: NCCL's config for this call.
                c.config = unsafe { *config };
            }
            return wrap::connect(i, &c, dev, handle, send_comm, dc);
        }
        connect(dev, std::ptr::null_mut(), handle, send_comm, dc)
    })
}

pub unsafe extern "C" fn connect_v11(
    ctx: Vp,
    dev: c_int,
    handle: Vp,
    send_comm: *mut Vp,
    dc: *mut *mut NetDeviceHandle,
) -> NcclResult {
    guard("connect", || connect(dev, ctx, handle, send_comm, dc))
}

pub unsafe extern "C" fn get_properties_v12(
    dev: c_int,
    props: *mut NetPropertiesV12,
) -> NcclResult {
    guard("getProperties", || put(props, props_v12(dev)?, "props"))
}

/// An older properties struct filled from the v12 one: the listed fields copy over by name,
/// the rest are given.
macro_rules! older_props {
    ($p:ident, $ty:ident { $($f:ident),* } $(, $extra:ident: $val:expr)*) => {
        $ty { $($f: $p.$f,)* $($extra: $val,)* }
    };
}

pub unsafe extern "C" fn get_properties_v11(
    dev: c_int,
    props: *mut NetPropertiesV11,
) -> NcclResult {
    guard("getProperties", || {
        let p = props_v12(dev)?;
        let v = older_props!(p, NetPropertiesV11 {
            name, pci_path, guid, ptr_support, reg_is_global, force_flush, speed, port, latency,
            max_comms, max_recvs, net_device_type, net_device_version, max_p2p_bytes,
            max_coll_bytes, max_multi_request_size
        }, v_props: v_props_v11(&p));
        put(props, v, "props")
    })
}

pub unsafe extern "C" fn get_properties_v9(dev: c_int, props: *mut NetPropertiesV9) -> NcclResult {
    guard("getProperties", || {
        let p = props_v12(dev)?;
        let v = older_props!(p, NetPropertiesV9 {
            name, pci_path, guid, ptr_support, reg_is_global, force_flush, speed, port, latency,
            max_comms, max_recvs, net_device_type, net_device_version, max_p2p_bytes,
            max_coll_bytes
        }, v_props: v_props_v11(&p));
        put(props, v, "props")
    })
}

pub unsafe extern "C" fn get_properties_v8(dev: c_int, props: *mut NetPropertiesV8) -> NcclResult {
    guard("getProperties", || {
        let p = props_v12(dev)?;
        let v = older_props!(
            p,
            NetPropertiesV8 {
                name,
                pci_path,
                guid,
                ptr_support,
                reg_is_global,
                speed,
                port,
                latency,
                max_comms,
                max_recvs,
                net_device_type,
                net_device_version
            }
        );
        put(props, v, "props")
    })
}

pub unsafe extern "C" fn get_properties_v7(dev: c_int, props: *mut NetPropertiesV7) -> NcclResult {
    guard("getProperties", || {
        let p = props_v12(dev)?;
        let v = older_props!(
            p,
            NetPropertiesV7 {
                name,
                pci_path,
                guid,
                ptr_support,
                speed,
                port,
                latency,
                max_comms,
                max_recvs,
                net_device_type,
                net_device_version
            }
        );
        put(props, v, "props")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_catches_panics_and_maps_errors() {
        assert_eq!(guard("t", || Ok(())), NcclResult::SUCCESS);
        assert_eq!(guard("t", || panic!("boom")), NcclResult::INTERNAL_ERROR);
        let e = guard("t", || {
            Err(NetError::Truncated {
                incoming: 2,
                posted: 1,
            })
        });
        assert_eq!(e, NcclResult::INVALID_USAGE);
        let e = guard("t", || {
            Err(NetError::PeerClosed {
                op: "x",
                detail: "y".into(),
            })
        });
        assert_eq!(e, NcclResult::REMOTE_ERROR);
    }

    #[test]
    fn null_out_pointers_are_errors_not_crashes() {
        // SAFETY: the entry points check every pointer for NULL.
        unsafe {
            assert_eq!(
                test(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                NcclResult::INTERNAL_ERROR
            );
            assert_eq!(
                accept(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                NcclResult::INTERNAL_ERROR
            );
            let mut req: Vp = 1 as Vp;
            assert_eq!(
                iflush(
                    std::ptr::null_mut(),
                    1,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut req
                ),
                NcclResult::SUCCESS
            );
            assert!(req.is_null());
        }
    }
}
