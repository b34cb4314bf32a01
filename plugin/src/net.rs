//! `ncclNetPlugin_v7` … `ncclNetPlugin_v12`: NCCL's net ABI, one table per version over the
//! adapters of [`ncclbpf_netplugin::ffi`] (the transport is `ncclbpf_netplugin`).
//!
//! NCCL 2.19 through 2.30 each pick the newest version they know (2.28 loads v11, 2.30 v12).

use ncclbpf_netplugin::ffi::*;
use ncclbpf_netplugin::plugin::NET_NAME;
use ncclnet_headers::Export;
use ncclnet_headers::net::*;

const NAME: *const std::ffi::c_char = NET_NAME.as_ptr();

#[unsafe(no_mangle)]
pub static ncclNetPlugin_v12: Export<NetV12> = Export(NetV12 {
    name: NAME,
    init: Some(init_v11),
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
pub static ncclNetPlugin_v11: Export<NetV11> = Export(NetV11 {
    name: NAME,
    init: Some(init_v11),
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
pub static ncclNetPlugin_v10: Export<NetV10> = Export(NetV10 {
    name: NAME,
    init: Some(init_v10),
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
pub static ncclNetPlugin_v9: Export<NetV9> = Export(NetV9 {
    name: NAME,
    init: Some(init_v7),
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
pub static ncclNetPlugin_v8: Export<NetV8> = Export(NetV8 {
    name: NAME,
    init: Some(init_v7),
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
pub static ncclNetPlugin_v7: Export<NetV7> = Export(NetV7 {
    name: NAME,
    init: Some(init_v7),
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
