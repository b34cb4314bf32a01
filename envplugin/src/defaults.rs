//! The defaults the plugin supplies when neither the environment nor the file sets a name.
//!
//! There are two. `NCCL_NET_PLUGIN` = `<this library>,libnccl-net.so`: with it, setting only
//! `NCCL_ENV_PLUGIN` to this library also loads it as NCCL's net plugin (and NCCL 2.28+ finds
//! the tuner and profiler in the net library by itself). The second entry is what NCCL loads
//! when `NCCL_NET_PLUGIN` is unset, so if this library's transport cannot run (its `init`
//! fails, or it finds no device) NCCL goes on exactly as without the default: the usual
//! `libnccl-net.so` if there is one, then its internal IB and Socket transports.
//!
//! And, for NCCL 2.28 and 2.29 only, `NCCL_NET_PLUGIN_REF_COUNT` = `1`: those releases unload an
//! external net plugin when the last communicator using it is destroyed and, doing so, forget
//! its name (`ncclNetPluginUnload` zeroes the whole entry), so the process's next communicator
//! fails with "Failed to initialize any NET plugin" (NVIDIA/nccl#1978; 2.30 keeps the name).
//! A starting count of 1 keeps the plugin loaded for the life of the process, which this
//! library is anyway (it is linked `-z nodelete`).
//!
//! Deliberately not defaulted: `NCCL_NET=BPF` (it would make NCCL fail, rather than fall
//! back, when the transport cannot run) and anything else that changes NCCL's behaviour.
//!
//! `NCCL_BPF_ENV_DEFAULTS=0` switches defaults off (`1` or unset: on).

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub const NET_PLUGIN: &str = "NCCL_NET_PLUGIN";
pub const REF_COUNT: &str = "NCCL_NET_PLUGIN_REF_COUNT";
pub const SWITCH: &str = "NCCL_BPF_ENV_DEFAULTS";
/// What NCCL loads when `NCCL_NET_PLUGIN` is unset, kept as the fallback.
pub const NCCL_DEFAULT_NET: &str = "libnccl-net.so";
/// NCCL keeps each plugin name in a 255-byte buffer with its NUL (`MAX_STR_LEN`, net.cc and
/// plugin_open.cc): a longer one is ignored or cut.
pub const MAX_PLUGIN_NAME: usize = 254;

/// `NCCL_BPF_ENV_DEFAULTS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Switch {
    On,
    Off,
    /// Not `0` or `1`: defaults stay on, with a warning.
    Invalid(String),
}

impl Switch {
    pub fn parse(value: Option<&str>) -> Switch {
        match value {
            None | Some("1") => Switch::On,
            Some("0") => Switch::Off,
            Some(v) => Switch::Invalid(v.to_string()),
        }
    }
}

/// The value of the `NCCL_NET_PLUGIN` default for the library at `own`, or why there is none.
pub fn net_plugin_value(own: &Path) -> Result<String, String> {
    let Some(path) = own.to_str() else {
        return Err(format!("this library's path {own:?} is not UTF-8"));
    };
    if !own.is_absolute() {
        return Err(format!("this library's path {path:?} is not absolute"));
    }
    if path.contains(',') {
        return Err(format!(
            "this library's path {path:?} contains ',' (NCCL_NET_PLUGIN is a comma-separated list)"
        ));
    }
    if path.len() > MAX_PLUGIN_NAME {
        return Err(format!(
            "this library's path is {} bytes, over NCCL's {MAX_PLUGIN_NAME} for a plugin name",
            path.len()
        ));
    }
    Ok(format!("{path},{NCCL_DEFAULT_NET}"))
}

/// Whether NCCL `major.minor` forgets an external net plugin's name when it unloads it after
/// its last communicator (NVIDIA/nccl#1978: 2.28.x and 2.29.x; 2.30 keeps the name).
pub fn unload_forgets_name(nccl: (u8, u8)) -> bool {
    matches!(nccl, (2, 28) | (2, 29))
}

/// The defaults for NCCL `nccl` (major, minor), each `(name, value)`, and a phrase for the init
/// line.
pub fn compute(
    switch: &Switch,
    own: impl FnOnce() -> Result<PathBuf, String>,
    nccl: (u8, u8),
) -> (Vec<(String, String)>, String) {
    if *switch == Switch::Off {
        return (Vec::new(), format!("defaults off ({SWITCH}=0)"));
    }
    let mut defaults = Vec::new();
    let mut missing = None;
    match own().and_then(|p| net_plugin_value(&p)) {
        Ok(v) => defaults.push((NET_PLUGIN.to_string(), v)),
        Err(why) => missing = Some(format!("no default {NET_PLUGIN}: {why}")),
    }
    if unload_forgets_name(nccl) {
        defaults.push((REF_COUNT.to_string(), "1".to_string()));
    }
    let names = defaults
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let phrase = match (missing, names.is_empty()) {
        (None, _) => format!("defaults: {names}"),
        (Some(m), true) => m,
        (Some(m), false) => format!("{m}; defaults: {names}"),
    };
    (defaults, phrase)
}

/// Net plugin symbols NCCL 2.28+ looks for; the library must export one for the default to
/// make sense.
const NET_SYMBOLS: [&CStr; 6] = [
    c"ncclNetPlugin_v12",
    c"ncclNetPlugin_v11",
    c"ncclNetPlugin_v10",
    c"ncclNetPlugin_v9",
    c"ncclNetPlugin_v8",
    c"ncclNetPlugin_v7",
];

/// The absolute path of the shared object this code is part of, if it is a library that
/// exports a net plugin (`dladdr` on one of its own statics, then `dlsym` in that object).
pub fn own_library() -> Result<PathBuf, String> {
    static ANCHOR: u8 = 0;
    // SAFETY: `Dl_info` is plain data (pointers and NULLs are valid all-zero values).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and writes `info`; ANCHOR is a static of this
    // object, so the address is inside it.
    let found = unsafe { libc::dladdr(std::ptr::addr_of!(ANCHOR).cast(), &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return Err("dladdr found no object for this library".into());
    }
    // SAFETY: dladdr succeeded: dli_fname is the NUL-terminated name of the object, which stays
    // loaded (we are running its code).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    if name.is_empty() {
        return Err("this code is in the main program, not a library".into());
    }
    let raw = Path::new(OsStr::from_bytes(name.to_bytes()));
    let path = raw
        .canonicalize()
        .map_err(|e| format!("cannot resolve this library's path {raw:?}: {e}"))?;
    if !exports_net_plugin(&path) {
        return Err(format!(
            "{} exports no ncclNetPlugin_v7..v12",
            path.display()
        ));
    }
    Ok(path)
}

fn exports_net_plugin(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD only returns an object already loaded (this one), with its reference
    // count raised; it is released below.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return false;
    }
    let found = NET_SYMBOLS.iter().any(|s| {
        // SAFETY: a valid handle and a NUL-terminated name; the result is only compared.
        !unsafe { libc::dlsym(handle, s.as_ptr()) }.is_null()
    });
    // SAFETY: balances the dlopen above; the object stays loaded (we are running its code,
    // and the plugin library is linked -z nodelete).
    unsafe { libc::dlclose(handle) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_values() {
        assert_eq!(Switch::parse(None), Switch::On);
        assert_eq!(Switch::parse(Some("1")), Switch::On);
        assert_eq!(Switch::parse(Some("0")), Switch::Off);
        assert_eq!(Switch::parse(Some("no")), Switch::Invalid("no".into()));
        assert_eq!(Switch::parse(Some("")), Switch::Invalid("".into()));
    }

    #[test]
    fn net_plugin_keeps_nccls_own_default_as_fallback() {
        assert_eq!(
            net_plugin_value(Path::new("/opt/x/libnccl-net-bpf.so")).unwrap(),
            "/opt/x/libnccl-net-bpf.so,libnccl-net.so"
        );
    }

    #[test]
    fn net_plugin_refuses_paths_nccl_would_misread() {
        assert!(
            net_plugin_value(Path::new("/a,b/lib.so"))
                .unwrap_err()
                .contains("contains ','")
        );
        assert!(
            net_plugin_value(Path::new("lib.so"))
                .unwrap_err()
                .contains("not absolute")
        );
        let long = format!("/{}", "d".repeat(MAX_PLUGIN_NAME));
        assert_eq!(long.len(), MAX_PLUGIN_NAME + 1);
        assert!(
            net_plugin_value(Path::new(&long))
                .unwrap_err()
                .contains("over NCCL's 254")
        );
        let fits = format!("/{}", "d".repeat(MAX_PLUGIN_NAME - 1));
        assert!(net_plugin_value(Path::new(&fits)).is_ok());
    }

    #[test]
    fn compute_on_off_and_unavailable() {
        let own = || Ok(PathBuf::from("/l/libnccl-net-bpf.so"));
        let net = (
            "NCCL_NET_PLUGIN".to_string(),
            "/l/libnccl-net-bpf.so,libnccl-net.so".to_string(),
        );
        let (d, note) = compute(&Switch::On, own, (2, 30));
        assert_eq!(d, vec![net.clone()]);
        assert_eq!(note, "defaults: NCCL_NET_PLUGIN");
        // An invalid switch keeps them on (the warning is the caller's).
        assert_eq!(
            compute(&Switch::Invalid("x".into()), own, (2, 30)).0.len(),
            1
        );
        let (d, note) = compute(
            &Switch::Off,
            || -> Result<PathBuf, String> { panic!("not asked when off") },
            (2, 28),
        );
        assert!(d.is_empty());
        assert_eq!(note, "defaults off (NCCL_BPF_ENV_DEFAULTS=0)");
        let (d, note) = compute(&Switch::On, || Err("no library".into()), (2, 30));
        assert!(d.is_empty());
        assert_eq!(note, "no default NCCL_NET_PLUGIN: no library");
    }

    #[test]
    fn nccl_2_28_and_2_29_keep_the_net_plugin_loaded() {
        let own = || Ok(PathBuf::from("/l/libnccl-net-bpf.so"));
        let count = ("NCCL_NET_PLUGIN_REF_COUNT".to_string(), "1".to_string());
        for v in [(2, 28), (2, 29)] {
            let (d, note) = compute(&Switch::On, own, v);
            assert_eq!(d.len(), 2, "{v:?}");
            assert_eq!(d[1], count);
            assert_eq!(note, "defaults: NCCL_NET_PLUGIN, NCCL_NET_PLUGIN_REF_COUNT");
            // Also when this library is not the net plugin's default: the bug hits any
            // external net plugin.
            let (d, note) = compute(&Switch::On, || Err("no library".into()), v);
            assert_eq!(d, vec![count.clone()]);
            assert_eq!(
                note,
                "no default NCCL_NET_PLUGIN: no library; defaults: NCCL_NET_PLUGIN_REF_COUNT"
            );
        }
        for v in [(2, 27), (2, 30), (2, 31), (3, 28)] {
            assert!(!unload_forgets_name(v), "{v:?}");
            assert_eq!(compute(&Switch::On, own, v).0.len(), 1, "{v:?}");
        }
    }

    #[test]
    fn a_test_binary_is_no_net_plugin_library() {
        // The unit tests run in an executable without ncclNetPlugin symbols: no default.
        assert!(own_library().is_err());
    }
}
