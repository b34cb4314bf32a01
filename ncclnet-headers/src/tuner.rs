//! The tuner plugin ABI, versions 2 to 6 (`ncclTunerPlugin_vN`).

use crate::common::{DebugLogger, NcclFunc, NcclResult};
use std::ffi::{c_char, c_int, c_void};

/// `NCCL_ALGO_*` indices into the cost table.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Algo(pub i32);

impl Algo {
    pub const UNDEF: Self = Self(-1);
    pub const TREE: Self = Self(0);
    pub const RING: Self = Self(1);
    pub const COLLNET_DIRECT: Self = Self(2);
    pub const COLLNET_CHAIN: Self = Self(3);
    pub const NVLS: Self = Self(4);
    pub const NVLS_TREE: Self = Self(5);
    /// From NCCL 2.23 (`NCCL_NUM_ALGORITHMS` 7).
    pub const PAT: Self = Self(6);
}

/// `NCCL_PROTO_*` indices into the cost table.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Proto(pub i32);

impl Proto {
    pub const UNDEF: Self = Self(-1);
    pub const LL: Self = Self(0);
    pub const LL128: Self = Self(1);
    pub const SIMPLE: Self = Self(2);
}

pub const NUM_PROTOCOLS: usize = 3;
/// `NCCL_NUM_ALGORITHMS` in the headers this crate mirrors (6 up to 2.22).
pub const NUM_ALGORITHMS: usize = 7;
pub const NUM_HW_LINKS: usize = 3;
pub const NUM_COMPCAPS_V5: usize = 4;
pub const NUM_TUNING_SCALES: usize = 3;
/// Cost-table value that marks a combination unavailable.
pub const ALGO_PROTO_IGNORE: f32 = -1.0;

/// `ncclNvlDomainInfo_v5_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvlDomainInfoV5 {
    pub n_nvl_domains: c_int,
    pub min_ranks_per_nvl_domain: c_int,
    pub max_ranks_per_nvl_domain: c_int,
}

type Bw = [[f64; NUM_TUNING_SCALES]; NUM_COMPCAPS_V5];

/// `ncclTunerConstants_v5_t` (also v6), pre-filled by NCCL, modifiable in `init`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TunerConstantsV5 {
    pub base_latencies: [[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS],
    pub hw_latencies: [[[f64; NUM_PROTOCOLS]; NUM_ALGORITHMS]; NUM_HW_LINKS],
    pub ll_max_bws: Bw,
    pub per_ch_max_ring_ll128_bws: Bw,
    pub per_ch_max_tree_ll128_bws: Bw,
    pub per_ch_max_tree_bws: Bw,
    pub per_ch_max_nvls_tree_bws: Bw,
}

type Vp = *mut c_void;
pub type TunerInitV2Fn =
    Option<unsafe extern "C" fn(usize, usize, DebugLogger, *mut Vp) -> NcclResult>;
pub type TunerInitV5Fn = Option<
    unsafe extern "C" fn(
        *mut Vp,
        u64,
        usize,
        usize,
        DebugLogger,
        *mut NvlDomainInfoV5,
        *mut TunerConstantsV5,
    ) -> NcclResult,
>;
pub type GetCollInfoV2Fn = Option<
    unsafe extern "C" fn(
        Vp,
        NcclFunc,
        usize,
        c_int,
        c_int,
        c_int,
        *mut c_int,
        *mut c_int,
        *mut c_int,
    ) -> NcclResult,
>;
pub type GetCollInfoV3Fn = Option<
    unsafe extern "C" fn(
        Vp,
        NcclFunc,
        usize,
        c_int,
        *mut *mut f32,
        c_int,
        c_int,
        *mut c_int,
    ) -> NcclResult,
>;
pub type GetCollInfoV4Fn = Option<
    unsafe extern "C" fn(
        Vp,
        NcclFunc,
        usize,
        c_int,
        *mut *mut f32,
        c_int,
        c_int,
        c_int,
        *mut c_int,
    ) -> NcclResult,
>;
pub type GetChunkSizeFn = Option<
    unsafe extern "C" fn(Vp, NcclFunc, usize, c_int, c_int, c_int, *mut usize) -> NcclResult,
>;
pub type TunerFinalizeFn = Option<unsafe extern "C" fn(Vp) -> NcclResult>;

/// `ncclTuner_v2_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TunerV2 {
    pub name: *const c_char,
    pub init: TunerInitV2Fn,
    pub get_coll_info: GetCollInfoV2Fn,
    pub destroy: TunerFinalizeFn,
}

/// `ncclTuner_v3_t`: the cost table.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TunerV3 {
    pub name: *const c_char,
    pub init: TunerInitV2Fn,
    pub get_coll_info: GetCollInfoV3Fn,
    pub destroy: TunerFinalizeFn,
}

/// `ncclTuner_v4_t`: `regBuff` before `nChannels`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TunerV4 {
    pub name: *const c_char,
    pub init: TunerInitV2Fn,
    pub get_coll_info: GetCollInfoV4Fn,
    pub destroy: TunerFinalizeFn,
}

/// `ncclTuner_v5_t`: per-communicator init with constants, `finalize`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TunerV5 {
    pub name: *const c_char,
    pub init: TunerInitV5Fn,
    pub get_coll_info: GetCollInfoV4Fn,
    pub finalize: TunerFinalizeFn,
}

/// `ncclTuner_v6_t`: v5 plus the optional `getChunkSize`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TunerV6 {
    pub name: *const c_char,
    pub init: TunerInitV5Fn,
    pub get_coll_info: GetCollInfoV4Fn,
    pub finalize: TunerFinalizeFn,
    pub get_chunk_size: GetChunkSizeFn,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn tuner_tables() {
        assert_eq!(size_of::<TunerV2>(), 32);
        assert_eq!(size_of::<TunerV3>(), 32);
        assert_eq!(size_of::<TunerV4>(), 32);
        assert_eq!(size_of::<TunerV5>(), 32);
        assert_eq!(size_of::<TunerV6>(), 40);
        assert_eq!(offset_of!(TunerV5, get_coll_info), 16);
        assert_eq!(offset_of!(TunerV5, finalize), 24);
        assert_eq!(offset_of!(TunerV6, get_chunk_size), 32);
    }

    #[test]
    fn tuner_constants() {
        assert_eq!(size_of::<NvlDomainInfoV5>(), 12);
        assert_eq!(size_of::<TunerConstantsV5>(), 1152);
        assert_eq!(offset_of!(TunerConstantsV5, hw_latencies), 168);
        assert_eq!(offset_of!(TunerConstantsV5, ll_max_bws), 672);
        assert_eq!(offset_of!(TunerConstantsV5, per_ch_max_ring_ll128_bws), 768);
        assert_eq!(offset_of!(TunerConstantsV5, per_ch_max_tree_ll128_bws), 864);
        assert_eq!(offset_of!(TunerConstantsV5, per_ch_max_tree_bws), 960);
        assert_eq!(offset_of!(TunerConstantsV5, per_ch_max_nvls_tree_bws), 1056);
    }

    #[test]
    fn constants() {
        assert_eq!(Algo::PAT.0, 6);
        assert_eq!(Proto::SIMPLE.0, 2);
        assert_eq!(NcclFunc::ALL_REDUCE.0, 4);
    }
}
