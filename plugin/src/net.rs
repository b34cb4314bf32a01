//! `ncclNetPlugin_v7` … `ncclNetPlugin_v12`: NCCL's net ABI, one table per version over the
//! adapters of [`ncclbpf_netplugin::ffi`] (the transport is `ncclbpf_netplugin`).
//!
//! NCCL 2.19 through 2.30 each pick the newest version they know (2.28 loads v11, 2.30 v12).

use ncclbpf_netplugin::ffi::*;
use ncclbpf_netplugin::plugin::NET_NAME;
use ncclnet_headers::net::*;
use ncclnet_headers::{DebugLogger, ExportCell, NcclResult, ProfilerCallback};
use std::ffi::c_void;
use std::sync::Once;

const NAME: *const std::ffi::c_char = NET_NAME.as_ptr();

#[unsafe(no_mangle)]
pub static ncclNetPlugin_v12: ExportCell<NetV12> = ExportCell::new(NetV12 {
    name: NAME,
    init: Some(init_v11_then_fill),
    devices: Some(devices),
    get_properties: Some(get_properties_v12),
    listen: Some(listen_v11),
    connect: Some(connect_v11),
    accept: Some(accept),
    reg_mr: Some(reg_mr_v8),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v10),
    irecv: Some(irecv_v10),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_comm),
    close_recv: Some(close_comm),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
    finalize: Some(finalize),
    set_net_attr: Some(set_net_attr),
});

#[unsafe(no_mangle)]
pub static ncclNetPlugin_v11: ExportCell<NetV11> = ExportCell::new(NetV11 {
    name: NAME,
    init: Some(init_v11_then_fill),
    devices: Some(devices),
    get_properties: Some(get_properties_v11),
    listen: Some(listen_v11),
    connect: Some(connect_v11),
    accept: Some(accept),
    reg_mr: Some(reg_mr_v8),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v10),
    irecv: Some(irecv_v10),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_comm),
    close_recv: Some(close_comm),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
    finalize: Some(finalize),
    set_net_attr: Some(set_net_attr),
});

#[unsafe(no_mangle)]
pub static ncclNetPlugin_v10: ExportCell<NetV10> = ExportCell::new(NetV10 {
    name: NAME,
    init: Some(init_v10_then_fill),
    devices: Some(devices),
    get_properties: Some(get_properties_v9),
    listen: Some(listen_v7),
    connect: Some(connect_v10),
    accept: Some(accept),
    reg_mr: Some(reg_mr_v8),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v10),
    irecv: Some(irecv_v10),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_comm),
    close_recv: Some(close_comm),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
});

#[unsafe(no_mangle)]
pub static ncclNetPlugin_v9: ExportCell<NetV9> = ExportCell::new(NetV9 {
    name: NAME,
    init: Some(init_v7_then_fill),
    devices: Some(devices),
    get_properties: Some(get_properties_v9),
    listen: Some(listen_v7),
    connect: Some(connect_v7),
    accept: Some(accept),
    reg_mr: Some(reg_mr_v8),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v9),
    irecv: Some(irecv_v9),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_comm),
    close_recv: Some(close_comm),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
});

#[unsafe(no_mangle)]
pub static ncclNetPlugin_v8: ExportCell<NetV8> = ExportCell::new(NetV8 {
    name: NAME,
    init: Some(init_v7_then_fill),
    devices: Some(devices),
    get_properties: Some(get_properties_v8),
    listen: Some(listen_v7),
    connect: Some(connect_v7),
    accept: Some(accept),
    reg_mr: Some(reg_mr_v8),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v7),
    irecv: Some(irecv_v7),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_comm),
    close_recv: Some(close_comm),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
});

/// v7 lets NCCL 2.19 (which looks for v7 … v5) load the library.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v7: ExportCell<NetV7> = ExportCell::new(NetV7 {
    name: NAME,
    init: Some(init_v7_then_fill),
    devices: Some(devices),
    get_properties: Some(get_properties_v7),
    listen: Some(listen_v7),
    connect: Some(connect_v7),
    accept: Some(accept),
    reg_mr: Some(reg_mr_v7),
    reg_mr_dma_buf: None,
    dereg_mr: Some(dereg_mr),
    isend: Some(isend_v7),
    irecv: Some(irecv_v7),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_comm),
    close_recv: Some(close_comm),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
});

/// Another copy of ncclbpf that loads this one as its inner plugin calls this before `init`:
/// this copy then carries traffic over its sockets and does nothing else.
#[unsafe(no_mangle)]
pub extern "C" fn ncclbpf_net_backend_only() {
    backend_only();
}

/// Offers NCCL the optional slots the backend has (`regMrDmaBuf`, `getDeviceMr`,
/// `irecvConsumed`, `makeVDevice`), once, after the first successful `init` and before it
/// returns: NCCL reads them only after `init` (its adapters for v7 to v10 copy them then, v11
/// and v12 read them at each use), and a non-NULL slot changes what NCCL does, so each is set
/// exactly when the inner plugin has it. Over our own sockets they stay NULL.
fn fill_optional_slots() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some(s) = optional_slots() else { return };
        let dma = s.reg_mr_dma_buf.then_some(reg_mr_dma_buf as _);
        let dmr = s.get_device_mr.then_some(get_device_mr as _);
        let consumed = s.irecv_consumed.then_some(irecv_consumed as _);
        let mv11 = s.make_v_device.then_some(make_v_device_v11 as _);
        let mv12 = s.make_v_device.then_some(make_v_device_v12 as _);
        macro_rules! fill {
            ($t:expr $(, $f:ident = $v:expr)*) => {{
                let p = $t.get();
                // SAFETY: single fields written in place through the table's pointer, once,
                // under `ONCE`, before NCCL reads them (see above); no reference to the whole
                // table is made while NCCL may read its other fields.
                unsafe {
                    std::ptr::addr_of_mut!((*p).reg_mr_dma_buf).write(dma);
                    std::ptr::addr_of_mut!((*p).get_device_mr).write(dmr);
                    std::ptr::addr_of_mut!((*p).irecv_consumed).write(consumed);
                    $(std::ptr::addr_of_mut!((*p).$f).write($v);)*
                }
            }};
        }
        fill!(ncclNetPlugin_v12, make_v_device = mv12);
        fill!(ncclNetPlugin_v11, make_v_device = mv11);
        fill!(ncclNetPlugin_v10, make_v_device = mv11);
        fill!(ncclNetPlugin_v9, make_v_device = mv11);
        fill!(ncclNetPlugin_v8);
        fill!(ncclNetPlugin_v7);
    });
}

fn filled(r: NcclResult) -> NcclResult {
    if r.is_success() {
        fill_optional_slots();
    }
    r
}

unsafe extern "C" fn init_v7_then_fill(log: DebugLogger) -> NcclResult {
    // SAFETY: as NCCL calls init.
    filled(unsafe { init_v7(log) })
}

unsafe extern "C" fn init_v10_then_fill(log: DebugLogger, prof: ProfilerCallback) -> NcclResult {
    // SAFETY: as NCCL calls init.
    filled(unsafe { init_v10(log, prof) })
}

unsafe extern "C" fn init_v11_then_fill(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NetCommConfig,
    log: DebugLogger,
    prof: ProfilerCallback,
) -> NcclResult {
    // SAFETY: as NCCL calls init.
    filled(unsafe { init_v11(ctx, comm_id, config, log, prof) })
}
