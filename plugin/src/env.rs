//! `ncclEnvPlugin_v1` and `ncclEnvPlugin_v2`: NCCL's env ABI over [`ncclbpf_env`].
//!
//! NCCL 2.28 and 2.29 load v1; 2.30 (2.30.7 among the releases checked) looks for v2 first.
//! NCCL finds them through `NCCL_ENV_PLUGIN` (this library's path, or `bpf` with a
//! `libnccl-env-bpf.so` link to it), calls `init` once, registers `finalize` with `atexit`, and
//! calls `getEnv` for every setting it reads, from any thread.
//!
//! Every entry catches panics. `init` always returns `ncclSuccess` (NCCL 2.28 fails its own
//! init otherwise, and a settings plugin is no reason to stop a job); a panicking `getEnv`
//! answers as NCCL's default env plugin does (`getenv`).

use ncclbpf_env::report::Level;
use ncclnet_headers::env::{EnvV1, EnvV2};
use ncclnet_headers::{DebugLogger, Export, LogLevel, LogSubsys, NcclResult};
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

const NAME: *const c_char = c"BPF".as_ptr();

#[unsafe(no_mangle)]
pub static ncclEnvPlugin_v2: Export<EnvV2> = Export(EnvV2 {
    name: NAME,
    init: Some(init_v2),
    finalize: Some(finalize),
    get_env: Some(get_env),
});

#[unsafe(no_mangle)]
pub static ncclEnvPlugin_v1: Export<EnvV1> = Export(EnvV1 {
    name: NAME,
    init: Some(init_v1),
    finalize: Some(finalize),
    get_env: Some(get_env),
});

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// Logs on the calling thread: only from `init` and `finalize`.
fn warn_now(msg: &str) {
    ncclnet_headers::log::log(
        ncclbpf_env::PREFIX,
        LogLevel::WARN,
        LogSubsys::ENV,
        file!(),
        line!(),
        msg,
    );
}

fn init(major: u8, minor: u8, patch: u8, suffix: *const c_char, abi: u8) -> NcclResult {
    let r = catch_unwind(|| {
        // SAFETY: NCCL passes its version suffix, a NUL-terminated string (NCCL_SUFFIX), or we
        // treat NULL as empty; it is only read during this call.
        let suffix = (!suffix.is_null()).then(|| unsafe { CStr::from_ptr(suffix) });
        let suffix = suffix.map(CStr::to_string_lossy).unwrap_or_default();
        ncclbpf_env::init(&ncclbpf_env::Caller {
            major,
            minor,
            patch,
            suffix: &suffix,
            abi,
        });
    });
    if let Err(p) = r {
        warn_now(&format!(
            "init: internal panic caught, answering from the process environment only: {}",
            panic_text(&*p)
        ));
    }
    NcclResult::SUCCESS
}

unsafe extern "C" fn init_v1(major: u8, minor: u8, patch: u8, suffix: *const c_char) -> NcclResult {
    init(major, minor, patch, suffix, 1)
}

unsafe extern "C" fn init_v2(
    major: u8,
    minor: u8,
    patch: u8,
    suffix: *const c_char,
    log: DebugLogger,
) -> NcclResult {
    ncclnet_headers::log::set_logger(log);
    init(major, minor, patch, suffix, 2)
}

unsafe extern "C" fn finalize() -> NcclResult {
    if let Err(p) = catch_unwind(ncclbpf_env::finalize) {
        warn_now(&format!(
            "finalize: internal panic caught: {}",
            panic_text(&*p)
        ));
    }
    NcclResult::SUCCESS
}

unsafe extern "C" fn get_env(name: *const c_char) -> *const c_char {
    // SAFETY: NCCL passes a NUL-terminated name that stays valid during the call (or NULL,
    // which ncclbpf_env answers with NULL).
    let name_ref = (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) });
    match catch_unwind(AssertUnwindSafe(|| ncclbpf_env::get_env(name_ref))) {
        Ok(p) => p,
        Err(p) => {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::AcqRel) {
                ncclbpf_env::later(
                    Level::Warn,
                    format!(
                        "getEnv: internal panic caught, answering with getenv (said once): {}",
                        panic_text(&*p)
                    ),
                );
            }
            name_ref.map_or(std::ptr::null(), ncclbpf_env::lookup::raw_getenv)
        }
    }
}
