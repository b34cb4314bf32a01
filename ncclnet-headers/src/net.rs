//! The ncclNet (point-to-point network) ABI, versions 6 to 12 (v6 only as an inner plugin's
//! table: the wrapper loads it, it never exports it).
//!
//! Each `NetVn` is the function table NCCL finds under the data symbol `ncclNetPlugin_vN`.
//! Slot *i* sits at byte offset 8·*i*. `NetPropertiesVn` is what `getProperties` fills.

use crate::common::{DebugLogger, NcclResult, ProfilerCallback};
use std::ffi::{c_char, c_int, c_void};

/// Bytes of the opaque connection handle NCCL ships between ranks.
pub const NET_HANDLE_MAXSIZE: usize = 128;
/// Outstanding requests each send/recv comm must support (v7+).
pub const NET_MAX_REQUESTS: usize = 32;
/// Value NCCL pre-stores in `*request` before some `irecv` calls (v9+).
pub const NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
/// Upper bound NCCL accepts for `maxP2pBytes`/`maxCollBytes` (1 TiB).
pub const MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// `vProps.devs` length for v9, v10, v11.
pub const NET_MAX_DEVS_PER_NIC_V11: usize = 4;
/// `vProps.devs` length for v12.
pub const NET_MAX_DEVS_PER_NIC_V12: usize = 8;
/// `railId`/`planeId` unknown.
pub const NET_ID_UNDEF: i16 = -1;
/// Traffic class not set by the user.
pub const NET_TRAFFIC_CLASS_UNDEF: i32 = -1;

/// `ptrSupport` bits and `regMr` types.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PtrType(pub i32);

impl PtrType {
    pub const HOST: Self = Self(0x1);
    pub const CUDA: Self = Self(0x2);
    pub const DMABUF: Self = Self(0x4);
}

/// `ncclNetDeviceType`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct NetDeviceType(pub i32);

impl NetDeviceType {
    pub const HOST: Self = Self(0);
    pub const UNPACK: Self = Self(1);
}

/// `ncclNetDeviceHandle_v7_t` (identical for v7 … v12).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetDeviceHandle {
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

/// `ncclNetVDeviceProps_v9/v10/v11_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NetVDevicePropsV11 {
    pub ndevs: c_int,
    pub devs: [c_int; NET_MAX_DEVS_PER_NIC_V11],
}

/// `ncclNetVDeviceProps_v12_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NetVDevicePropsV12 {
    pub ndevs: c_int,
    pub devs: [c_int; NET_MAX_DEVS_PER_NIC_V12],
}

/// `ncclNetCommConfig_v10/v11/v12_t`. NCCL passes a pointer to a temporary: copy it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetCommConfig {
    pub traffic_class: c_int,
}

/// `ncclNetCommAttr_v11/v12_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetCommAttr {
    pub max_concurrent_peers: c_int,
    pub min_concurrent_peers: c_int,
    pub max_flows_per_peer: c_int,
    pub min_flows_per_peer: c_int,
}

/// `ncclNetAttr_v11/v12_t`. Unset fields hold -1.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetAttr {
    pub send_comm_attr: NetCommAttr,
    pub recv_comm_attr: NetCommAttr,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

/// `ncclNetProperties_v6_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNetProperties_v7_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v9_t`; also `_v10_t`, which is identical.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
    pub v_props: NetVDevicePropsV11,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

pub type NetPropertiesV10 = NetPropertiesV9;

/// `ncclNetProperties_v11_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
    pub v_props: NetVDevicePropsV11,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetProperties_v12_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetPropertiesV12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: NetDeviceType,
    pub net_device_version: c_int,
    pub v_props: NetVDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

// Slot types shared by several versions. `Vp` is `*mut c_void`.
type Vp = *mut c_void;
pub type InitLogFn = Option<unsafe extern "C" fn(DebugLogger) -> NcclResult>;
pub type InitLogProfFn = Option<unsafe extern "C" fn(DebugLogger, ProfilerCallback) -> NcclResult>;
pub type InitCtxFn = Option<
    unsafe extern "C" fn(
        *mut Vp,
        u64,
        *mut NetCommConfig,
        DebugLogger,
        ProfilerCallback,
    ) -> NcclResult,
>;
pub type DevicesFn = Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>;
pub type ListenFn = Option<unsafe extern "C" fn(c_int, Vp, *mut Vp) -> NcclResult>;
pub type ListenCtxFn = Option<unsafe extern "C" fn(Vp, c_int, Vp, *mut Vp) -> NcclResult>;
pub type ConnectFn =
    Option<unsafe extern "C" fn(c_int, Vp, *mut Vp, *mut *mut NetDeviceHandle) -> NcclResult>;
pub type ConnectV6Fn = Option<unsafe extern "C" fn(c_int, Vp, *mut Vp) -> NcclResult>;
pub type AcceptV6Fn = Option<unsafe extern "C" fn(Vp, *mut Vp) -> NcclResult>;
pub type ConnectCfgFn = Option<
    unsafe extern "C" fn(
        c_int,
        *mut NetCommConfig,
        Vp,
        *mut Vp,
        *mut *mut NetDeviceHandle,
    ) -> NcclResult,
>;
pub type ConnectCtxFn =
    Option<unsafe extern "C" fn(Vp, c_int, Vp, *mut Vp, *mut *mut NetDeviceHandle) -> NcclResult>;
pub type AcceptFn =
    Option<unsafe extern "C" fn(Vp, *mut Vp, *mut *mut NetDeviceHandle) -> NcclResult>;
pub type RegMrIntFn = Option<unsafe extern "C" fn(Vp, Vp, c_int, c_int, *mut Vp) -> NcclResult>;
pub type RegMrFn = Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, *mut Vp) -> NcclResult>;
pub type RegMrDmaBufFn =
    Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, u64, c_int, *mut Vp) -> NcclResult>;
pub type DeregMrFn = Option<unsafe extern "C" fn(Vp, Vp) -> NcclResult>;
pub type IsendIntFn = Option<unsafe extern "C" fn(Vp, Vp, c_int, c_int, Vp, *mut Vp) -> NcclResult>;
pub type IsendFn = Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, *mut Vp) -> NcclResult>;
pub type IsendProfFn =
    Option<unsafe extern "C" fn(Vp, Vp, usize, c_int, Vp, Vp, *mut Vp) -> NcclResult>;
pub type IrecvIntFn = Option<
    unsafe extern "C" fn(
        Vp,
        c_int,
        *mut Vp,
        *mut c_int,
        *mut c_int,
        *mut Vp,
        *mut Vp,
    ) -> NcclResult,
>;
pub type IrecvFn = Option<
    unsafe extern "C" fn(
        Vp,
        c_int,
        *mut Vp,
        *mut usize,
        *mut c_int,
        *mut Vp,
        *mut Vp,
    ) -> NcclResult,
>;
pub type IrecvProfFn = Option<
    unsafe extern "C" fn(
        Vp,
        c_int,
        *mut Vp,
        *mut usize,
        *mut c_int,
        *mut Vp,
        *mut Vp,
        *mut Vp,
    ) -> NcclResult,
>;
pub type IflushFn =
    Option<unsafe extern "C" fn(Vp, c_int, *mut Vp, *mut c_int, *mut Vp, *mut Vp) -> NcclResult>;
pub type TestFn = Option<unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> NcclResult>;
pub type CloseFn = Option<unsafe extern "C" fn(Vp) -> NcclResult>;
pub type GetDeviceMrFn = Option<unsafe extern "C" fn(Vp, Vp, *mut Vp) -> NcclResult>;
pub type IrecvConsumedFn = Option<unsafe extern "C" fn(Vp, c_int, Vp) -> NcclResult>;
pub type MakeVDeviceV11Fn =
    Option<unsafe extern "C" fn(*mut c_int, *mut NetVDevicePropsV11) -> NcclResult>;
pub type MakeVDeviceV12Fn =
    Option<unsafe extern "C" fn(*mut c_int, *mut NetVDevicePropsV12) -> NcclResult>;
pub type FinalizeFn = Option<unsafe extern "C" fn(Vp) -> NcclResult>;
pub type SetNetAttrFn = Option<unsafe extern "C" fn(Vp, *mut NetAttr) -> NcclResult>;

macro_rules! get_props_fn {
    ($props:ty) => {
        Option<unsafe extern "C" fn(c_int, *mut $props) -> NcclResult>
    };
}

/// `ncclNet_v6_t`: no device handles in connect/accept, `int` sizes, no `getDeviceMr` or
/// `irecvConsumed` (fastsocket's newest; NCCL still loads it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetV6 {
    pub name: *const c_char,
    pub init: InitLogFn,
    pub devices: DevicesFn,
    pub get_properties: get_props_fn!(NetPropertiesV6),
    pub listen: ListenFn,
    pub connect: ConnectV6Fn,
    pub accept: AcceptV6Fn,
    pub reg_mr: RegMrIntFn,
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendIntFn,
    pub irecv: IrecvIntFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
}

/// `ncclNet_v7_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetV7 {
    pub name: *const c_char,
    pub init: InitLogFn,
    pub devices: DevicesFn,
    pub get_properties: get_props_fn!(NetPropertiesV7),
    pub listen: ListenFn,
    pub connect: ConnectFn,
    pub accept: AcceptFn,
    pub reg_mr: RegMrIntFn,
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendIntFn,
    pub irecv: IrecvIntFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: GetDeviceMrFn,
    pub irecv_consumed: IrecvConsumedFn,
}

/// `ncclNet_v8_t`: v7 with a `size_t` size in `regMr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetV8 {
    pub name: *const c_char,
    pub init: InitLogFn,
    pub devices: DevicesFn,
    pub get_properties: get_props_fn!(NetPropertiesV8),
    pub listen: ListenFn,
    pub connect: ConnectFn,
    pub accept: AcceptFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendIntFn,
    pub irecv: IrecvIntFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: GetDeviceMrFn,
    pub irecv_consumed: IrecvConsumedFn,
}

/// `ncclNet_v9_t`: `size_t` sizes in isend/irecv, `makeVDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetV9 {
    pub name: *const c_char,
    pub init: InitLogFn,
    pub devices: DevicesFn,
    pub get_properties: get_props_fn!(NetPropertiesV9),
    pub listen: ListenFn,
    pub connect: ConnectFn,
    pub accept: AcceptFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendFn,
    pub irecv: IrecvFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: GetDeviceMrFn,
    pub irecv_consumed: IrecvConsumedFn,
    pub make_v_device: MakeVDeviceV11Fn,
}

/// `ncclNet_v10_t`: profiler callback in init, comm config in connect, profiler handles.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetV10 {
    pub name: *const c_char,
    pub init: InitLogProfFn,
    pub devices: DevicesFn,
    pub get_properties: get_props_fn!(NetPropertiesV10),
    pub listen: ListenFn,
    pub connect: ConnectCfgFn,
    pub accept: AcceptFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendProfFn,
    pub irecv: IrecvProfFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: GetDeviceMrFn,
    pub irecv_consumed: IrecvConsumedFn,
    pub make_v_device: MakeVDeviceV11Fn,
}

/// `ncclNet_v11_t`: one context per communicator.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetV11 {
    pub name: *const c_char,
    pub init: InitCtxFn,
    pub devices: DevicesFn,
    pub get_properties: get_props_fn!(NetPropertiesV11),
    pub listen: ListenCtxFn,
    pub connect: ConnectCtxFn,
    pub accept: AcceptFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendProfFn,
    pub irecv: IrecvProfFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: GetDeviceMrFn,
    pub irecv_consumed: IrecvConsumedFn,
    pub make_v_device: MakeVDeviceV11Fn,
    pub finalize: FinalizeFn,
    pub set_net_attr: SetNetAttrFn,
}

/// `ncclNet_v12_t`: the v11 table with v12 properties.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetV12 {
    pub name: *const c_char,
    pub init: InitCtxFn,
    pub devices: DevicesFn,
    pub get_properties: get_props_fn!(NetPropertiesV12),
    pub listen: ListenCtxFn,
    pub connect: ConnectCtxFn,
    pub accept: AcceptFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: RegMrDmaBufFn,
    pub dereg_mr: DeregMrFn,
    pub isend: IsendProfFn,
    pub irecv: IrecvProfFn,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: GetDeviceMrFn,
    pub irecv_consumed: IrecvConsumedFn,
    pub make_v_device: MakeVDeviceV12Fn,
    pub finalize: FinalizeFn,
    pub set_net_attr: SetNetAttrFn,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn small_structs() {
        assert_eq!(size_of::<NetDeviceHandle>(), 32);
        assert_eq!(offset_of!(NetDeviceHandle, handle), 8);
        assert_eq!(offset_of!(NetDeviceHandle, size), 16);
        assert_eq!(offset_of!(NetDeviceHandle, needs_proxy_progress), 24);
        assert_eq!(size_of::<NetVDevicePropsV11>(), 20);
        assert_eq!(size_of::<NetVDevicePropsV12>(), 36);
        assert_eq!(size_of::<NetCommConfig>(), 4);
        assert_eq!(size_of::<NetCommAttr>(), 16);
        assert_eq!(size_of::<NetAttr>(), 44);
        assert_eq!(offset_of!(NetAttr, recv_comm_attr), 16);
        assert_eq!(offset_of!(NetAttr, op), 32);
        assert_eq!(offset_of!(NetAttr, algo), 36);
        assert_eq!(offset_of!(NetAttr, proto), 40);
    }

    // Offsets from the table in nccl-plugin-abi.md §2.1.
    macro_rules! check_props {
        ($t:ty, size $size:expr, $($field:ident = $off:expr),* $(,)?) => {{
            assert_eq!(size_of::<$t>(), $size, concat!("sizeof ", stringify!($t)));
            $(assert_eq!(offset_of!($t, $field), $off,
                concat!(stringify!($t), ".", stringify!($field)));)*
        }};
    }

    #[test]
    fn properties_layouts() {
        check_props!(NetPropertiesV6, size 48, name = 0, pci_path = 8, guid = 16, ptr_support = 24,
            speed = 28, port = 32, latency = 36, max_comms = 40, max_recvs = 44);
        check_props!(NetPropertiesV7, size 56, name = 0, pci_path = 8, guid = 16, ptr_support = 24,
            speed = 28, port = 32, latency = 36, max_comms = 40, max_recvs = 44,
            net_device_type = 48, net_device_version = 52);
        check_props!(NetPropertiesV8, size 64, name = 0, pci_path = 8, guid = 16, ptr_support = 24,
            reg_is_global = 28, speed = 32, port = 36, latency = 40, max_comms = 44,
            max_recvs = 48, net_device_type = 52, net_device_version = 56);
        check_props!(NetPropertiesV9, size 104, ptr_support = 24, reg_is_global = 28,
            force_flush = 32, speed = 36, port = 40, latency = 44, max_comms = 48, max_recvs = 52,
            net_device_type = 56, net_device_version = 60, v_props = 64, max_p2p_bytes = 88,
            max_coll_bytes = 96);
        check_props!(NetPropertiesV11, size 112, force_flush = 32, speed = 36, v_props = 64,
            max_p2p_bytes = 88, max_coll_bytes = 96, max_multi_request_size = 104);
        check_props!(NetPropertiesV12, size 128, force_flush = 32, speed = 36, port = 40,
            latency = 44, max_comms = 48, max_recvs = 52, net_device_type = 56,
            net_device_version = 60, v_props = 64, max_p2p_bytes = 104, max_coll_bytes = 112,
            max_multi_request_size = 120, rail_id = 124, plane_id = 126);
    }

    #[test]
    fn function_table_layouts() {
        // Slot i sits at 8*i; sizes from §2.3.
        check_props!(NetV6, size 136, name = 0, init = 8, get_properties = 24, connect = 40,
            accept = 48, reg_mr = 56, isend = 80, irecv = 88, test = 104, close_listen = 128);
        check_props!(NetV7, size 152, name = 0, init = 8, devices = 16, get_properties = 24,
            listen = 32, connect = 40, accept = 48, reg_mr = 56, reg_mr_dma_buf = 64,
            dereg_mr = 72, isend = 80, irecv = 88, iflush = 96, test = 104, close_send = 112,
            close_recv = 120, close_listen = 128, get_device_mr = 136, irecv_consumed = 144);
        check_props!(NetV8, size 152, reg_mr = 56, isend = 80, irecv_consumed = 144);
        check_props!(NetV9, size 160, test = 104, make_v_device = 152);
        check_props!(NetV10, size 160, connect = 40, isend = 80, irecv = 88, make_v_device = 152);
        check_props!(NetV11, size 176, listen = 32, make_v_device = 152, finalize = 160,
            set_net_attr = 168);
        check_props!(NetV12, size 176, get_properties = 24, finalize = 160, set_net_attr = 168);
    }
}
