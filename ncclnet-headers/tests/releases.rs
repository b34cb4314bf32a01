//! Our mirrors against each NCCL release's own headers.
//!
//! Each table below holds `sizeof`/`offsetof` values printed by a small C++ program compiled
//! (g++, x86_64 LP64) against `src/include/plugin/**` of one release tag of NVIDIA/nccl (tag
//! and files in each table's comment), with a stub `nccl.h` for `ncclResult_t` and friends.
//! No NCCL header is in this repository and CI needs none: the numbers are the test vectors.
//! A mirror that drifts from any release that has the struct fails here, with the release
//! named.
//!
//! What the releases look up, for the plugin types we export (newest first):
//!
//! | release | net | tuner | profiler | env |
//! |---|---|---|---|---|
//! | 2.27.7 | v10 … v6 | v4 … v2 | v4 … v1 | none |
//! | 2.28.9 | v11 … v6 | v5 … v2 | v5 … v1 | v1 |
//! | 2.29.7 | v11 … v6 | v5 … v2 | v6 … v1 | v1 |
//! | 2.30.7 | v12 … v6 | v6 … v2 | v6 … v1 | v2, v1 |
//! | 2.31.2 (NVIDIA/nccl 88980683) | v12 … v6 | v6 … v2 | v7 … v1 | v2, v1 |
//!
//! The v7 profiler's vectors are in `src/profiler.rs` (`v7_layout`).

use ncclnet_headers::env::{EnvV1, EnvV2};
use ncclnet_headers::net::*;
use ncclnet_headers::profiler::*;
use ncclnet_headers::tuner::*;
use std::mem::{offset_of, size_of};

/// Our value for a probe line's name (`sizeof T`, `offset T.field` or `const NAME`, in NCCL's
/// names); `None` for a name this test does not know (reported as a failure: every vector is
/// checked).
fn ours(name: &str) -> Option<i64> {
    let v = match name {
        "sizeof ncclNetProperties_v12_t" => size_of::<NetPropertiesV12>(),
        "offset ncclNetProperties_v12_t.vProps" => offset_of!(NetPropertiesV12, v_props),
        "offset ncclNetProperties_v12_t.maxP2pBytes" => offset_of!(NetPropertiesV12, max_p2p_bytes),
        "offset ncclNetProperties_v12_t.maxCollBytes" => {
            offset_of!(NetPropertiesV12, max_coll_bytes)
        }
        "offset ncclNetProperties_v12_t.maxMultiRequestSize" => {
            offset_of!(NetPropertiesV12, max_multi_request_size)
        }
        "offset ncclNetProperties_v12_t.railId" => offset_of!(NetPropertiesV12, rail_id),
        "offset ncclNetProperties_v12_t.planeId" => offset_of!(NetPropertiesV12, plane_id),
        "sizeof ncclNetVDeviceProps_v12_t" => size_of::<NetVDevicePropsV12>(),
        "sizeof ncclNet_v12_t" => size_of::<NetV12>(),
        "offset ncclNet_v12_t.regMr" => offset_of!(NetV12, reg_mr),
        "offset ncclNet_v12_t.makeVDevice" => offset_of!(NetV12, make_v_device),
        "offset ncclNet_v12_t.finalize" => offset_of!(NetV12, finalize),
        "offset ncclNet_v12_t.setNetAttr" => offset_of!(NetV12, set_net_attr),
        "sizeof ncclNetAttr_v12_t" | "sizeof ncclNetAttr_v11_t" => size_of::<NetAttr>(),
        "sizeof ncclNetCommConfig_v12_t" => size_of::<NetCommConfig>(),
        "const NCCL_NET_ID_UNDEF" => return Some(NET_ID_UNDEF.into()),
        "const NCCL_NET_MAX_DEVS_PER_NIC_V12" => NET_MAX_DEVS_PER_NIC_V12,
        "sizeof ncclNetProperties_v11_t" => size_of::<NetPropertiesV11>(),
        "offset ncclNetProperties_v11_t.maxMultiRequestSize" => {
            offset_of!(NetPropertiesV11, max_multi_request_size)
        }
        "sizeof ncclNet_v11_t" => size_of::<NetV11>(),
        "offset ncclNet_v11_t.setNetAttr" => offset_of!(NetV11, set_net_attr),
        "sizeof ncclNetProperties_v10_t" => size_of::<NetPropertiesV10>(),
        "sizeof ncclNet_v10_t" => size_of::<NetV10>(),
        "sizeof ncclTuner_v6_t" => size_of::<TunerV6>(),
        "offset ncclTuner_v6_t.init" => offset_of!(TunerV6, init),
        "offset ncclTuner_v6_t.getCollInfo" => offset_of!(TunerV6, get_coll_info),
        "offset ncclTuner_v6_t.finalize" => offset_of!(TunerV6, finalize),
        "offset ncclTuner_v6_t.getChunkSize" => offset_of!(TunerV6, get_chunk_size),
        "sizeof ncclTunerConstants_v6_t" | "sizeof ncclTunerConstants_v5_t" => {
            size_of::<TunerConstantsV5>()
        }
        "sizeof ncclNvlDomainInfo_v6_t" | "sizeof ncclNvlDomainInfo_v5_t" => {
            size_of::<NvlDomainInfoV5>()
        }
        "sizeof ncclTuner_v5_t" => size_of::<TunerV5>(),
        "offset ncclTuner_v5_t.finalize" => offset_of!(TunerV5, finalize),
        "sizeof ncclTuner_v4_t" => size_of::<TunerV4>(),
        "sizeof ncclEnv_v1_t" => size_of::<EnvV1>(),
        "offset ncclEnv_v1_t.init" => offset_of!(EnvV1, init),
        "offset ncclEnv_v1_t.finalize" => offset_of!(EnvV1, finalize),
        "offset ncclEnv_v1_t.getEnv" => offset_of!(EnvV1, get_env),
        "sizeof ncclEnv_v2_t" => size_of::<EnvV2>(),
        "offset ncclEnv_v2_t.init" => offset_of!(EnvV2, init),
        "offset ncclEnv_v2_t.finalize" => offset_of!(EnvV2, finalize),
        "offset ncclEnv_v2_t.getEnv" => offset_of!(EnvV2, get_env),
        "sizeof ncclProfiler_v4_t" => size_of::<ProfilerV4>(),
        "sizeof ncclProfilerEventDescr_v4_t" => size_of::<EventDescrV4>(),
        "sizeof ncclProfiler_v5_t" => size_of::<ProfilerV5>(),
        "sizeof ncclProfilerEventDescr_v5_t" => size_of::<EventDescrV5>(),
        "sizeof ncclProfilerEventStateArgs_v5_t" | "sizeof ncclProfilerEventStateArgs_v6_t" => {
            size_of::<StateArgs>()
        }
        "sizeof ncclProfiler_v6_t" => size_of::<ProfilerV6>(),
        "sizeof ncclProfilerEventDescr_v6_t" => size_of::<EventDescrV6>(),
        _ => return None,
    };
    Some(v as i64)
}

fn check(tag: &str, vectors: &[(&str, i64)]) {
    let mut wrong = vec![];
    for (name, want) in vectors {
        match ours(name) {
            Some(got) if got == *want => {}
            Some(got) => wrong.push(format!("{name}: NCCL {want}, ours {got}")),
            None => wrong.push(format!("{name}: not checked by this test")),
        }
    }
    assert!(wrong.is_empty(), "NCCL {tag}:\n{}", wrong.join("\n"));
}

/// NVIDIA/nccl tag `v2.27.7-1`, `src/include/plugin/`: net/net_v10.h, tuner/tuner_v4.h, profiler/profiler_v4.h.
#[test]
fn nccl_2_27_7() {
    check(
        "v2.27.7-1",
        &[
            ("sizeof ncclNetProperties_v10_t", 104),
            ("sizeof ncclNet_v10_t", 160),
            ("sizeof ncclTuner_v4_t", 32),
            ("sizeof ncclProfiler_v4_t", 48),
            ("sizeof ncclProfilerEventDescr_v4_t", 104),
        ],
    );
}

/// NVIDIA/nccl tag `v2.28.9-1`, `src/include/plugin/`: net/net_v10.h, net_v11.h, tuner/tuner_v4.h, tuner_v5.h, env/env_v1.h, profiler/profiler_v4.h, profiler_v5.h.
#[test]
fn nccl_2_28_9() {
    check(
        "v2.28.9-1",
        &[
            ("sizeof ncclNetProperties_v11_t", 112),
            ("offset ncclNetProperties_v11_t.maxMultiRequestSize", 104),
            ("sizeof ncclNet_v11_t", 176),
            ("offset ncclNet_v11_t.setNetAttr", 168),
            ("sizeof ncclNetAttr_v11_t", 44),
            ("sizeof ncclNetProperties_v10_t", 104),
            ("sizeof ncclNet_v10_t", 160),
            ("sizeof ncclTuner_v5_t", 32),
            ("offset ncclTuner_v5_t.finalize", 24),
            ("sizeof ncclTunerConstants_v5_t", 1152),
            ("sizeof ncclNvlDomainInfo_v5_t", 12),
            ("sizeof ncclTuner_v4_t", 32),
            ("sizeof ncclEnv_v1_t", 32),
            ("offset ncclEnv_v1_t.init", 8),
            ("offset ncclEnv_v1_t.finalize", 16),
            ("offset ncclEnv_v1_t.getEnv", 24),
            ("sizeof ncclProfiler_v4_t", 48),
            ("sizeof ncclProfilerEventDescr_v4_t", 104),
            ("sizeof ncclProfiler_v5_t", 48),
            ("sizeof ncclProfilerEventDescr_v5_t", 112),
            ("sizeof ncclProfilerEventStateArgs_v5_t", 8),
        ],
    );
}

/// NVIDIA/nccl tag `v2.29.7-1`, `src/include/plugin/`: as 2.28.9, and profiler/profiler_v6.h.
#[test]
fn nccl_2_29_7() {
    check(
        "v2.29.7-1",
        &[
            ("sizeof ncclNetProperties_v11_t", 112),
            ("offset ncclNetProperties_v11_t.maxMultiRequestSize", 104),
            ("sizeof ncclNet_v11_t", 176),
            ("offset ncclNet_v11_t.setNetAttr", 168),
            ("sizeof ncclNetAttr_v11_t", 44),
            ("sizeof ncclNetProperties_v10_t", 104),
            ("sizeof ncclNet_v10_t", 160),
            ("sizeof ncclTuner_v5_t", 32),
            ("offset ncclTuner_v5_t.finalize", 24),
            ("sizeof ncclTunerConstants_v5_t", 1152),
            ("sizeof ncclNvlDomainInfo_v5_t", 12),
            ("sizeof ncclTuner_v4_t", 32),
            ("sizeof ncclEnv_v1_t", 32),
            ("offset ncclEnv_v1_t.init", 8),
            ("offset ncclEnv_v1_t.finalize", 16),
            ("offset ncclEnv_v1_t.getEnv", 24),
            ("sizeof ncclProfiler_v4_t", 48),
            ("sizeof ncclProfilerEventDescr_v4_t", 104),
            ("sizeof ncclProfiler_v5_t", 48),
            ("sizeof ncclProfilerEventDescr_v5_t", 112),
            ("sizeof ncclProfilerEventStateArgs_v5_t", 8),
            ("sizeof ncclProfiler_v6_t", 48),
            ("sizeof ncclProfilerEventDescr_v6_t", 112),
            ("sizeof ncclProfilerEventStateArgs_v6_t", 8),
        ],
    );
}

/// NVIDIA/nccl tag `v2.30.7-1`, `src/include/plugin/`: net/net_v10.h … net_v12.h, tuner/tuner_v4.h … tuner_v6.h, env/env_v1.h, env_v2.h, profiler/profiler_v4.h … v6.h.
#[test]
fn nccl_2_30_7() {
    check(
        "v2.30.7-1",
        &[
            ("sizeof ncclNetProperties_v12_t", 128),
            ("offset ncclNetProperties_v12_t.vProps", 64),
            ("offset ncclNetProperties_v12_t.maxP2pBytes", 104),
            ("offset ncclNetProperties_v12_t.maxCollBytes", 112),
            ("offset ncclNetProperties_v12_t.maxMultiRequestSize", 120),
            ("offset ncclNetProperties_v12_t.railId", 124),
            ("offset ncclNetProperties_v12_t.planeId", 126),
            ("sizeof ncclNetVDeviceProps_v12_t", 36),
            ("sizeof ncclNet_v12_t", 176),
            ("offset ncclNet_v12_t.regMr", 56),
            ("offset ncclNet_v12_t.makeVDevice", 152),
            ("offset ncclNet_v12_t.finalize", 160),
            ("offset ncclNet_v12_t.setNetAttr", 168),
            ("sizeof ncclNetAttr_v12_t", 44),
            ("sizeof ncclNetCommConfig_v12_t", 4),
            ("const NCCL_NET_ID_UNDEF", -1),
            ("const NCCL_NET_MAX_DEVS_PER_NIC_V12", 8),
            ("sizeof ncclNetProperties_v11_t", 112),
            ("offset ncclNetProperties_v11_t.maxMultiRequestSize", 104),
            ("sizeof ncclNet_v11_t", 176),
            ("offset ncclNet_v11_t.setNetAttr", 168),
            ("sizeof ncclNetAttr_v11_t", 44),
            ("sizeof ncclNetProperties_v10_t", 104),
            ("sizeof ncclNet_v10_t", 160),
            ("sizeof ncclTuner_v6_t", 40),
            ("offset ncclTuner_v6_t.init", 8),
            ("offset ncclTuner_v6_t.getCollInfo", 16),
            ("offset ncclTuner_v6_t.finalize", 24),
            ("offset ncclTuner_v6_t.getChunkSize", 32),
            ("sizeof ncclTunerConstants_v6_t", 1152),
            ("sizeof ncclNvlDomainInfo_v6_t", 12),
            ("sizeof ncclTuner_v5_t", 32),
            ("offset ncclTuner_v5_t.finalize", 24),
            ("sizeof ncclTunerConstants_v5_t", 1152),
            ("sizeof ncclNvlDomainInfo_v5_t", 12),
            ("sizeof ncclTuner_v4_t", 32),
            ("sizeof ncclEnv_v1_t", 32),
            ("offset ncclEnv_v1_t.init", 8),
            ("offset ncclEnv_v1_t.finalize", 16),
            ("offset ncclEnv_v1_t.getEnv", 24),
            ("sizeof ncclEnv_v2_t", 32),
            ("offset ncclEnv_v2_t.init", 8),
            ("offset ncclEnv_v2_t.finalize", 16),
            ("offset ncclEnv_v2_t.getEnv", 24),
            ("sizeof ncclProfiler_v4_t", 48),
            ("sizeof ncclProfilerEventDescr_v4_t", 104),
            ("sizeof ncclProfiler_v5_t", 48),
            ("sizeof ncclProfilerEventDescr_v5_t", 112),
            ("sizeof ncclProfilerEventStateArgs_v5_t", 8),
            ("sizeof ncclProfiler_v6_t", 48),
            ("sizeof ncclProfilerEventDescr_v6_t", 112),
            ("sizeof ncclProfilerEventStateArgs_v6_t", 8),
        ],
    );
}

/// The MR flags (`NCCL_NET_MR_FLAG_FORCE_SO` = 1 from 2.28.9, `_SIGNAL_NEVER_RESET` = 2 from
/// 2.30.7, in `nccl_net.h`) are passed only by NCCL's GIN and RMA code to their own `regMr`;
/// the net API's `regMr` has no flags argument in any release up to 2.31.2. So our v12 slot
/// keeps v8's five arguments: this fails to compile if it ever takes another.
#[test]
fn net_v12_reg_mr_has_no_flags() {
    type Vp = *mut std::ffi::c_void;
    type Five = unsafe extern "C" fn(
        Vp,
        Vp,
        usize,
        std::ffi::c_int,
        *mut Vp,
    ) -> ncclnet_headers::NcclResult;
    let slot: RegMrFn = None::<Five>;
    assert!(slot.is_none());
    assert_eq!(offset_of!(NetV12, reg_mr), offset_of!(NetV11, reg_mr));
}

/// `NCCL_NET_ID_UNDEF` is `-1` in an `int16_t` field: all bits set, as NCCL's `(int16_t)-1`.
#[test]
fn net_id_undef_fills_the_field() {
    assert_eq!(NET_ID_UNDEF as u16, 0xffff);
}
