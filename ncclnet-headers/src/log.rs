//! Logging through the logger NCCL hands to `init`.
//!
//! NCCL's logger is a C variadic function. We always call it with `fmt = "%s"` and the
//! message as the single argument, so a `%` in a message is never interpreted. Until NCCL
//! gives us a logger (or when a caller passes NULL), messages go to stderr only when
//! `NCCL_BPF_LOG_STDERR=1`.

use crate::{DebugLogger, LogLevel, LogSubsys};
use std::ffi::{CString, c_char, c_int, c_ulong};
use std::sync::atomic::{AtomicUsize, Ordering};

static LOGGER: AtomicUsize = AtomicUsize::new(0);

type LoggerFn = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// Records NCCL's logger; a NULL logger keeps the previous one.
pub fn set_logger(logger: DebugLogger) {
    if let Some(f) = logger {
        LOGGER.store(f as usize, Ordering::Release);
    }
}

/// Logs `msg` through NCCL's logger, prefixed with `prefix` (e.g. `NET/BPF`).
/// Whether NCCL's logger is known yet (or `NCCL_BPF_LOG_STDERR=1` stands in for it): a
/// plugin type that NCCL gives no logger (the env plugin's v1) can hold its lines until then.
pub fn has_logger() -> bool {
    LOGGER.load(Ordering::Acquire) != 0
        || std::env::var_os("NCCL_BPF_LOG_STDERR").is_some_and(|v| v == "1")
}

pub fn log(prefix: &str, level: LogLevel, subsys: LogSubsys, file: &str, line: u32, msg: &str) {
    let raw = LOGGER.load(Ordering::Acquire);
    if raw == 0 {
        if std::env::var_os("NCCL_BPF_LOG_STDERR").is_some_and(|v| v == "1") {
            eprintln!("NCCL_BPF {prefix} {msg}");
        }
        return;
    }
    // SAFETY: `raw` was stored from a non-null `ncclDebugLogger_t` by `set_logger`; a function
    // pointer round-trips through usize on every platform we build for.
    let f: LoggerFn = unsafe { std::mem::transmute::<usize, LoggerFn>(raw) };
    let text = CString::new(format!("{prefix} {msg}").replace('\0', " ")).unwrap_or_default();
    let file = CString::new(file).unwrap_or_default();
    // SAFETY: all strings are NUL-terminated and live across the call; the format is "%s"
    // with exactly one string argument, as the variadic contract requires.
    unsafe {
        f(
            level.0,
            subsys.0 as c_ulong,
            file.as_ptr(),
            line as c_int,
            c"%s".as_ptr(),
            text.as_ptr(),
        )
    };
}
