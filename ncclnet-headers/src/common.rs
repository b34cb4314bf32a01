//! Types shared by every plugin kind.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`: the status every plugin entry point returns.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct NcclResult(pub i32);

impl NcclResult {
    pub const SUCCESS: Self = Self(0);
    pub const UNHANDLED_CUDA_ERROR: Self = Self(1);
    /// Syscall or network failure: the usual net-plugin error.
    pub const SYSTEM_ERROR: Self = Self(2);
    /// NCCL misused the plugin (bad arguments, too many requests) or an internal fault.
    pub const INTERNAL_ERROR: Self = Self(3);
    pub const INVALID_ARGUMENT: Self = Self(4);
    /// User or configuration error; also a receive smaller than the matching send.
    pub const INVALID_USAGE: Self = Self(5);
    /// The remote peer failed.
    pub const REMOTE_ERROR: Self = Self(6);
    pub const IN_PROGRESS: Self = Self(7);
    /// Added in NCCL 2.30.
    pub const TIMEOUT: Self = Self(8);

    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// NCCL's own name for the code, for log lines and error messages.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "ncclSuccess",
            1 => "ncclUnhandledCudaError",
            2 => "ncclSystemError",
            3 => "ncclInternalError",
            4 => "ncclInvalidArgument",
            5 => "ncclInvalidUsage",
            6 => "ncclRemoteError",
            7 => "ncclInProgress",
            8 => "ncclTimeout",
            _ => "ncclResult(unknown)",
        }
    }
}

/// `ncclDebugLogLevel`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct LogLevel(pub i32);

impl LogLevel {
    pub const NONE: Self = Self(0);
    pub const VERSION: Self = Self(1);
    pub const WARN: Self = Self(2);
    pub const INFO: Self = Self(3);
    pub const ABORT: Self = Self(4);
    pub const TRACE: Self = Self(5);
}

/// `ncclDebugLogSubSys` bit flags (the logger's `flags` argument).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct LogSubsys(pub u64);

impl LogSubsys {
    pub const INIT: Self = Self(0x1);
    pub const COLL: Self = Self(0x2);
    pub const P2P: Self = Self(0x4);
    pub const SHM: Self = Self(0x8);
    pub const NET: Self = Self(0x10);
    pub const GRAPH: Self = Self(0x20);
    pub const TUNING: Self = Self(0x40);
    pub const ENV: Self = Self(0x80);
    pub const ALLOC: Self = Self(0x100);
    pub const CALL: Self = Self(0x200);
    pub const PROXY: Self = Self(0x400);
    pub const NVLS: Self = Self(0x800);
    pub const BOOTSTRAP: Self = Self(0x1000);
    pub const REG: Self = Self(0x2000);
    pub const PROFILE: Self = Self(0x4000);
    pub const RAS: Self = Self(0x8000);
    pub const ALL: Self = Self(!0);
}

/// `ncclDebugLogger_t`: a C variadic function returning nothing. Always call it with
/// `fmt = "%s"` and the message as the one argument.
pub type DebugLogger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t` handed to net plugins from v10.
pub type ProfilerCallback = Option<
    unsafe extern "C" fn(
        e_handle: *mut *mut c_void,
        type_: c_int,
        p_handle: *mut c_void,
        plugin_id: i64,
        ext_data: *mut c_void,
    ) -> NcclResult,
>;

/// `ncclFunc_t`: the collective kind.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct NcclFunc(pub i32);

impl NcclFunc {
    pub const BROADCAST: Self = Self(0);
    pub const REDUCE: Self = Self(1);
    pub const ALL_GATHER: Self = Self(2);
    pub const REDUCE_SCATTER: Self = Self(3);
    pub const ALL_REDUCE: Self = Self(4);
    pub const SEND_RECV: Self = Self(5);
    pub const SEND: Self = Self(6);
    pub const RECV: Self = Self(7);
    pub const ALL_TO_ALL: Self = Self(8);
    pub const SCATTER: Self = Self(9);
    pub const GATHER: Self = Self(10);
    pub const ALL_GATHER_V: Self = Self(11);
    pub const PUT_SIGNAL: Self = Self(12);
    pub const SIGNAL: Self = Self(13);
    pub const WAIT_SIGNAL: Self = Self(14);
}

/// A function table NCCL reads through `dlsym`. Tables hold raw pointers (the name, the
/// functions), so they are not `Sync` by themselves; this wrapper, layout-transparent, lets a
/// `static` hold one.
#[repr(transparent)]
pub struct Export<T>(pub T);

// SAFETY: exported tables are immutable statics whose pointers refer to 'static code and strings.
unsafe impl<T> Sync for Export<T> {}

/// A function table NCCL reads through `dlsym` whose optional slots are filled in once, by the
/// first successful `init`, before NCCL reads them (the wrapper net plugin offers
/// `regMrDmaBuf`, `getDeviceMr`, `irecvConsumed` and `makeVDevice` exactly when its backend
/// has them: NCCL changes behaviour on a slot being non-NULL). Layout-transparent.
#[repr(transparent)]
pub struct ExportCell<T>(std::cell::UnsafeCell<T>);

impl<T> ExportCell<T> {
    pub const fn new(t: T) -> Self {
        ExportCell(std::cell::UnsafeCell::new(t))
    }

    /// The table, for its one writer.
    pub fn get(&self) -> *mut T {
        self.0.get()
    }
}

// SAFETY: written only once per process, inside the first successful `init` and under a
// `Once`, before NCCL reads the slots written (every NCCL release reads them after `init`
// returns); every other access is a read.
unsafe impl<T> Sync for ExportCell<T> {}
