//! The system calls the control socket needs that std does not offer: the peer's credentials,
//! pinning the library that holds this code, and removing the socket at exit.

use std::ffi::{CStr, CString, c_void};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

/// The peer of a connected Unix socket, as the kernel recorded it at `connect`.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
}

pub fn peer(fd: RawFd) -> io::Result<Peer> {
    let mut c = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `c`, which is that large.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast::<c_void>(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::other("SO_PEERCRED returned a short record"));
    }
    Ok(Peer {
        pid: c.pid,
        uid: c.uid,
    })
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Makes the shared object that holds this code permanent: `dlopen` of its own path with
/// `RTLD_NOW | RTLD_NODELETE`, a reference that is never closed. Returns the path.
///
/// Why: the control thread runs code of this library for the life of the process, while
/// NCCL (≥ 2.28) `dlclose`s its net plugin when its last communicator goes. Were the library
/// unmapped, the thread would run unmapped code and crash the process. The library is also
/// linked `-z nodelete`; this does not depend on how it was linked.
pub fn pin_self() -> Result<String, String> {
    // SAFETY: a zeroed Dl_info is a valid out-parameter (NULL pointers, zero addresses).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let anchor = pin_self as fn() -> Result<String, String> as *const c_void;
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    let found = unsafe { libc::dladdr(anchor, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return Err("dladdr found no shared object holding the plugin's code".into());
    }
    // SAFETY: dladdr set dli_fname to a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_owned();
    if name.is_empty() {
        return Err("dladdr gave no file name for the plugin's own object".into());
    }
    // SAFETY: the object is loaded (this code runs from it), so this only takes one more
    // reference and marks it not to be unloaded; the handle is deliberately never closed.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NODELETE) };
    let shown = name.to_string_lossy().into_owned();
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated message of the last failure.
        let e = unsafe { libc::dlerror() };
        let why = if e.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: as above, non-NULL.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        // Linked into the executable itself (tests): nothing can unload it.
        if same_file(
            Path::new(&*name.to_string_lossy()),
            Path::new("/proc/self/exe"),
        ) {
            return Ok(format!("{shown} (the executable)"));
        }
        return Err(format!("dlopen({shown}, RTLD_NODELETE): {why}"));
    }
    Ok(shown)
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Sockets to remove at exit, with the pid that made each (a forked child must not remove
/// its parent's).
static AT_EXIT: Mutex<Vec<(u32, CString)>> = Mutex::new(Vec::new());

extern "C" fn remove_at_exit() {
    // Never block or panic here: skip if the list is held or poisoned.
    let Ok(list) = AT_EXIT.try_lock() else {
        return;
    };
    let me = std::process::id();
    for (pid, path) in list.iter() {
        if *pid == me {
            // SAFETY: unlink of a NUL-terminated path we own.
            unsafe { libc::unlink(path.as_ptr()) };
        }
    }
}

/// Removes `path` when this process exits normally (`exit`, return from `main`). A process
/// killed by a signal leaves it; the next server in the directory removes it (stale).
pub fn remove_at_exit_of(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    AT_EXIT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((std::process::id(), c));
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    // SAFETY: registers a function of this library, which pin_self made permanent, so it is
    // still mapped when exit runs it.
    *REGISTERED.get_or_init(|| unsafe { libc::atexit(remove_at_exit) } == 0)
}
