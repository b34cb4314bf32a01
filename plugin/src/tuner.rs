//! `ncclTunerPlugin_v2` … `ncclTunerPlugin_v6`: NCCL's tuner ABI, one table per version over
//! the adapters of [`ncclbpf_tuner::ffi`] (the tuner is `ncclbpf_tuner`).
//!
//! NCCL 2.21 and later find the tuner in the net library when `NCCL_TUNER_PLUGIN` names none;
//! 2.28 loads v5, 2.30 v6.

use ncclbpf_tuner::ffi::*;
use ncclnet_headers::Export;
use ncclnet_headers::tuner::*;

const NAME: *const std::ffi::c_char = c"BPF".as_ptr();

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v6: Export<TunerV6> = Export(TunerV6 {
    name: NAME,
    init: Some(init_v5),
    get_coll_info: Some(get_coll_info_v4),
    finalize: Some(finalize),
    get_chunk_size: Some(get_chunk_size),
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v5: Export<TunerV5> = Export(TunerV5 {
    name: NAME,
    init: Some(init_v5),
    get_coll_info: Some(get_coll_info_v4),
    finalize: Some(finalize),
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v4: Export<TunerV4> = Export(TunerV4 {
    name: NAME,
    init: Some(init_v2),
    get_coll_info: Some(get_coll_info_v4),
    destroy: Some(finalize),
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v3: Export<TunerV3> = Export(TunerV3 {
    name: NAME,
    init: Some(init_v2),
    get_coll_info: Some(get_coll_info_v3),
    destroy: Some(finalize),
});

#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v2: Export<TunerV2> = Export(TunerV2 {
    name: NAME,
    init: Some(init_v2),
    get_coll_info: Some(get_coll_info_v2),
    destroy: Some(finalize),
});
