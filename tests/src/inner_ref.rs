//! The reference inner net plugin's check and injection API (tests/csrc/inner_ref.c,
//! docs/reference/reference-inner-plugin.md), for tests that load it directly or behind the wrapper.
//!
//! `dlopen` of a path that is already loaded returns the same instance, so [`RefChecks::open`]
//! reads the state of the very copy the wrapper loaded with `NCCL_BPF_NET_INNER` (same path).
//! That state is global to the library: tests that read it must not run concurrently on one
//! version (hold [`serial`]'s guard).

use crate::anynet::{dlopen_local, dlsym};
use std::ffi::{CStr, CString, c_char, c_int, c_long, c_void};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// The versions built (`libinner-ref-vN.so`).
pub const REF_VERSIONS: [u32; 7] = [6, 7, 8, 9, 10, 11, 12];

/// Where `libinner-ref-v<version>.so` is (built by tests/build.rs).
pub fn path(version: u32) -> PathBuf {
    PathBuf::from(env!("INNER_REF_DIR")).join(format!("libinner-ref-v{version}.so"))
}

/// A process-wide lock for tests that reset or read the plugins' global state.
pub fn serial() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|e| e.into_inner())
}

type TextFn = unsafe extern "C" fn(*mut c_char, usize) -> usize;
type CountFn = unsafe extern "C" fn() -> c_int;
type NameLongFn = unsafe extern "C" fn(*const c_char) -> c_long;
type NameIntFn = unsafe extern "C" fn(*const c_char) -> c_int;
type InjectFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type ConfigFn = unsafe extern "C" fn(*const c_char, c_long) -> c_int;
type PtrFn = unsafe extern "C" fn(*mut c_void);
type VoidFn = unsafe extern "C" fn();

/// The `inner_ref_*` functions of one loaded variant.
pub struct RefChecks {
    pub version: u32,
    log: TextFn,
    viol_text: TextFn,
    violations: CountFn,
    count: NameLongFn,
    live: NameIntFn,
    inject: InjectFn,
    config: ConfigFn,
    expect_ph: PtrFn,
    reset: VoidFn,
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

fn text(f: TextFn) -> String {
    // SAFETY: a NULL/0 call returns the length; the second copies at most `cap` bytes + NUL.
    unsafe {
        let n = f(std::ptr::null_mut(), 0);
        let mut buf = vec![0u8; n + 1];
        f(buf.as_mut_ptr().cast(), buf.len());
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

impl RefChecks {
    /// Opens (or finds, if already loaded) variant `version` and binds its check functions.
    pub fn open(version: u32) -> Result<RefChecks, String> {
        let lib = dlopen_local(&path(version))?;
        macro_rules! sym {
            ($name:literal, $t:ty) => {{
                // SAFETY: lib was just opened.
                let p = unsafe { dlsym(lib, $name) };
                if p.is_null() {
                    return Err(format!("{} missing in v{version}", $name));
                }
                // SAFETY: the exported function has the signature documented in inner_ref.c.
                unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
            }};
        }
        Ok(RefChecks {
            version,
            log: sym!("inner_ref_log", TextFn),
            viol_text: sym!("inner_ref_violation_text", TextFn),
            violations: sym!("inner_ref_violations", CountFn),
            count: sym!("inner_ref_count", NameLongFn),
            live: sym!("inner_ref_live", NameIntFn),
            inject: sym!("inner_ref_inject", InjectFn),
            config: sym!("inner_ref_config", ConfigFn),
            expect_ph: sym!("inner_ref_expect_phandle", PtrFn),
            reset: sym!("inner_ref_reset", VoidFn),
        })
    }

    /// The call log, one line per call.
    pub fn log(&self) -> String {
        text(self.log)
    }
    /// The lines of the call log that start with `op ` (e.g. "isend").
    pub fn log_ops(&self, op: &str) -> Vec<String> {
        let p = format!("{op} ");
        self.log()
            .lines()
            .filter(|l| l.starts_with(&p))
            .map(str::to_owned)
            .collect()
    }
    pub fn violations(&self) -> i32 {
        // SAFETY: no arguments.
        unsafe { (self.violations)() }
    }
    pub fn violation_text(&self) -> String {
        text(self.viol_text)
    }
    /// Calls of `name` ("isend", "test_pending", "inject:hang", "prof_start", ...).
    pub fn count(&self, name: &str) -> c_long {
        let c = cstr(name);
        // SAFETY: a valid C string.
        unsafe { (self.count)(c.as_ptr()) }
    }
    /// Live objects of `kind`: "ctx", "listen", "send", "recv", "mr", "req".
    pub fn live(&self, kind: &str) -> i32 {
        let c = cstr(kind);
        // SAFETY: a valid C string.
        unsafe { (self.live)(c.as_ptr()) }
    }
    /// Arms a one-shot failure on the (after_n+1)-th later call of its op (after_n < 0
    /// disarms); panics on an unknown name.
    pub fn inject(&self, what: &str, after_n: i32) {
        assert!(self.try_inject(what, after_n), "unknown injection {what}");
    }
    /// [`inject`](Self::inject); false for an unknown name.
    pub fn try_inject(&self, what: &str, after_n: i32) -> bool {
        let c = cstr(what);
        // SAFETY: a valid C string.
        unsafe { (self.inject)(c.as_ptr(), after_n) == 0 }
    }
    /// Sets a knob; panics on an unknown key.
    pub fn config(&self, key: &str, v: i64) {
        let c = cstr(key);
        // SAFETY: a valid C string.
        let r = unsafe { (self.config)(c.as_ptr(), v as c_long) };
        assert_eq!(r, 0, "unknown key {key}");
    }
    /// Non-NULL: every v10+ phandle must be `p`.
    pub fn expect_phandle(&self, p: crate::anynet::Obj) {
        // SAFETY: the plugin only compares the value.
        unsafe { (self.expect_ph)(p.0) }
    }
    /// Clears log, violations, counters, injections, expectations and config.
    pub fn reset(&self) {
        // SAFETY: no arguments.
        unsafe { (self.reset)() }
    }
}
