//! The env plugin ABI, versions 1 and 2 (`ncclEnvPlugin_vN`, NCCL's
//! `src/include/plugin/env/env_v1.h` and `env_v2.h`).
//!
//! NCCL 2.28 and 2.29 look up `ncclEnvPlugin_v1`; NCCL with `env_v2.h` (2.30.7 among the
//! releases checked) looks up `ncclEnvPlugin_v2` first, then `v1`. The two tables differ only in `init`, which in v2 also
//! receives NCCL's logger.
//!
//! `getEnv` returns a NUL-terminated value or NULL. NCCL's contract: the address stays valid
//! until `finalize`, or until the next `getEnv` of the same name.

use crate::common::{DebugLogger, NcclResult};
use std::ffi::c_char;

pub type EnvInitV1Fn = Option<
    unsafe extern "C" fn(
        nccl_major: u8,
        nccl_minor: u8,
        nccl_patch: u8,
        suffix: *const c_char,
    ) -> NcclResult,
>;
pub type EnvInitV2Fn = Option<
    unsafe extern "C" fn(
        nccl_major: u8,
        nccl_minor: u8,
        nccl_patch: u8,
        suffix: *const c_char,
        log_function: DebugLogger,
    ) -> NcclResult,
>;
pub type EnvFinalizeFn = Option<unsafe extern "C" fn() -> NcclResult>;
pub type GetEnvFn = Option<unsafe extern "C" fn(name: *const c_char) -> *const c_char>;

/// `ncclEnv_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvV1 {
    pub name: *const c_char,
    pub init: EnvInitV1Fn,
    pub finalize: EnvFinalizeFn,
    pub get_env: GetEnvFn,
}

/// `ncclEnv_v2_t`: `init` also receives NCCL's logger.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvV2 {
    pub name: *const c_char,
    pub init: EnvInitV2Fn,
    pub finalize: EnvFinalizeFn,
    pub get_env: GetEnvFn,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn env_v1_table() {
        assert_eq!(size_of::<EnvV1>(), 32);
        assert_eq!(align_of::<EnvV1>(), 8);
        assert_eq!(offset_of!(EnvV1, name), 0);
        assert_eq!(offset_of!(EnvV1, init), 8);
        assert_eq!(offset_of!(EnvV1, finalize), 16);
        assert_eq!(offset_of!(EnvV1, get_env), 24);
    }

    #[test]
    fn env_v2_table() {
        assert_eq!(size_of::<EnvV2>(), 32);
        assert_eq!(align_of::<EnvV2>(), 8);
        assert_eq!(offset_of!(EnvV2, name), 0);
        assert_eq!(offset_of!(EnvV2, init), 8);
        assert_eq!(offset_of!(EnvV2, finalize), 16);
        assert_eq!(offset_of!(EnvV2, get_env), 24);
    }

    #[test]
    fn function_slots_are_nullable_pointers() {
        // `Option<fn>` is one pointer, NULL for `None`: what C sees in an unset slot.
        assert_eq!(size_of::<EnvInitV1Fn>(), size_of::<*const u8>());
        assert_eq!(size_of::<EnvInitV2Fn>(), size_of::<*const u8>());
        assert_eq!(size_of::<EnvFinalizeFn>(), size_of::<*const u8>());
        assert_eq!(size_of::<GetEnvFn>(), size_of::<*const u8>());
    }
}
