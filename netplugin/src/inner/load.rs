//! Finding and opening the inner plugin named by `NCCL_BPF_NET_INNER`.
//!
//! The name is resolved the way NCCL resolves `NCCL_NET_PLUGIN`: a value with a `/` is a path;
//! otherwise `libnccl-net-<name>.so` is tried first, then the value as given (both through the
//! dynamic loader's search path). The library is opened `RTLD_NOW | RTLD_LOCAL` and never
//! closed (its code may still run on NCCL's threads until the process ends), and its newest
//! `ncclNetPlugin_vN`, N from 12 down to 6, is taken.
//!
//! Two libraries are refused: this very library (the wrapper would call itself forever), and
//! one that exports only versions we do not speak (v2 to v5: say so). Another copy of
//! ncclbpf is welcome as a backend: it exports `ncclbpf_net_backend_only`, which is called
//! before its `init` so that it carries traffic over its sockets and nothing else (no hooks,
//! no control socket, no metrics: the wrapper does those, once).

use super::table::Table;
use std::ffi::{CStr, CString, c_void};

/// Why an inner plugin could not be used; each says what to change.
#[derive(Debug)]
pub enum LoadError {
    /// No candidate opened: each name tried, with the loader's reason.
    NotFound(Vec<(String, String)>),
    /// It opened but is this library itself.
    Itself(String),
    /// It opened but exports no `ncclNetPlugin_vN` we speak; `older` lists those it does.
    NoVersion { path: String, older: Vec<u32> },
    /// Its table lacks slots NCCL cannot do without.
    Incomplete {
        path: String,
        version: u32,
        missing: Vec<&'static str>,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotFound(tried) => {
                write!(f, "NCCL_BPF_NET_INNER: no library could be opened (")?;
                for (i, (name, why)) in tried.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{name}: {why}")?;
                }
                write!(f, ")")
            }
            LoadError::Itself(p) => write!(
                f,
                "NCCL_BPF_NET_INNER names this library itself ({p}): a wrapper cannot wrap \
                 itself; name the network plugin the cluster runs, or unset it for ncclbpf's \
                 own sockets"
            ),
            LoadError::NoVersion { path, older } if older.is_empty() => write!(
                f,
                "NCCL_BPF_NET_INNER: {path} is not an NCCL net plugin (no ncclNetPlugin_v6 to \
                 _v12 symbol)"
            ),
            LoadError::NoVersion { path, older } => write!(
                f,
                "NCCL_BPF_NET_INNER: {path} exports only ncclNetPlugin_v{}; the wrapper speaks \
                 v6 to v12",
                older
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", _v")
            ),
            LoadError::Incomplete {
                path,
                version,
                missing,
            } => write!(
                f,
                "NCCL_BPF_NET_INNER: {path}'s ncclNetPlugin_v{version} has no {}",
                missing.join(", ")
            ),
        }
    }
}

/// The names to try for a setting's value, in order.
pub fn candidates(value: &str) -> Vec<String> {
    if value.contains('/') {
        return vec![value.to_string()];
    }
    let mut v = Vec::new();
    if !value.starts_with("libnccl-net-") {
        v.push(format!("libnccl-net-{value}.so"));
    }
    v.push(value.to_string());
    v
}

/// An opened inner plugin.
pub struct Opened {
    pub table: Table,
    /// What was opened (the name that worked).
    pub path: String,
    /// Whether it is another copy of ncclbpf (now told to be a plain backend).
    pub ncclbpf: bool,
    /// The GIN and RMA tables it exports (`ncclGinPlugin_vN`, `ncclRmaPlugin_vN`), which the
    /// wrapper does not re-export (see [`gin_rma_hint`]).
    pub extras: Vec<String>,
}

/// GIN and RMA symbols looked for in an inner plugin (NCCL 2.28 to 2.31 know these).
const EXTRA_SYMBOLS: [&str; 10] = [
    "ncclGinPlugin_v11",
    "ncclGinPlugin_v12",
    "ncclGinPlugin_v13",
    "ncclGinPlugin_v14",
    "ncclGinPlugin_v15",
    "ncclRmaPlugin_v13",
    "ncclRmaPlugin_v14",
    "ncclRmaPlugin_v15",
    "ncclRmaPlugin_v16",
    "ncclRmaPlugin_v17",
];

/// What to tell the user when the inner plugin `path` exports GIN or RMA tables: NCCL 2.29+
/// looks for them first in the library `NCCL_GIN_PLUGIN` names (RMA: `NCCL_RMA_PLUGIN`, then
/// the GIN library), and only then in the net plugin's, so naming the inner plugin there keeps
/// them; NCCL 2.28 looks for GIN v11 in the net plugin's library only, where the wrapper has
/// none (they carry no traffic the wrapper could observe, so it does not re-export them).
pub fn gin_rma_hint(path: &str, extras: &[String]) -> Option<String> {
    if extras.is_empty() {
        return None;
    }
    Some(format!(
        "inner net plugin {path} also exports {}: NCCL finds them with \
         NCCL_GIN_PLUGIN={path} (NCCL 2.29 and later; RMA follows GIN); NCCL 2.28 looks for GIN \
         in the net plugin's library only, where ncclbpf has none",
        extras.join(", ")
    ))
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call on
    // this thread; copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// The base address of the object that holds `addr`, if the loader knows it.
fn object_base(addr: *const c_void) -> Option<usize> {
    // SAFETY: dladdr fills `info` for any address; a zeroed Dl_info is a valid out value.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        (libc::dladdr(addr, &mut info) != 0).then_some(info.dli_fbase as usize)
    }
}

fn sym(handle: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).expect("no NUL in a symbol name");
    // SAFETY: a live handle and a NUL-terminated name.
    unsafe { libc::dlsym(handle, c.as_ptr()) }
}

/// Opens the inner plugin `value` names and picks its newest table we speak.
pub fn open(value: &str) -> Result<Opened, LoadError> {
    let mut tried = Vec::new();
    let mut found = None;
    for name in candidates(value) {
        let c = CString::new(name.as_str())
            .map_err(|_| LoadError::NotFound(vec![(name.clone(), "contains a NUL byte".into())]))?;
        // SAFETY: a NUL-terminated name; the handle is kept for the life of the process.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            tried.push((name, dlerror_text()));
        } else {
            found = Some((h, name));
            break;
        }
    }
    let Some((handle, path)) = found else {
        return Err(LoadError::NotFound(tried));
    };
    let ours = object_base(open as *const c_void);
    let mut table = None;
    for v in (6..=12u32).rev() {
        let p = sym(handle, &format!("ncclNetPlugin_v{v}"));
        if p.is_null() {
            continue;
        }
        if ours.is_some() && object_base(p) == ours {
            return Err(LoadError::Itself(path));
        }
        table = Some(match v {
            12 => Table::V12(p.cast()),
            11 => Table::V11(p.cast()),
            10 => Table::V10(p.cast()),
            9 => Table::V9(p.cast()),
            8 => Table::V8(p.cast()),
            7 => Table::V7(p.cast()),
            _ => Table::V6(p.cast()),
        });
        break;
    }
    let Some(table) = table else {
        let older = (2..=5u32)
            .filter(|v| !sym(handle, &format!("ncclNetPlugin_v{v}")).is_null())
            .collect();
        return Err(LoadError::NoVersion { path, older });
    };
    let missing = table.missing_required();
    if !missing.is_empty() {
        return Err(LoadError::Incomplete {
            path,
            version: table.version(),
            missing,
        });
    }
    let backend_only = sym(handle, BACKEND_ONLY_SYMBOL);
    if !backend_only.is_null() {
        // SAFETY: ncclbpf exports this symbol as `extern "C" fn()` (plugin/src/net.rs).
        let f: extern "C" fn() = unsafe { std::mem::transmute(backend_only) };
        f();
    }
    let extras = EXTRA_SYMBOLS
        .iter()
        .filter(|s| !sym(handle, s).is_null())
        .map(|s| s.to_string())
        .collect();
    Ok(Opened {
        table,
        path,
        ncclbpf: !backend_only.is_null(),
        extras,
    })
}

/// What another copy of ncclbpf exports so that a wrapper can make it a plain backend.
pub const BACKEND_ONLY_SYMBOL: &str = "ncclbpf_net_backend_only";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_as_nccl_resolves_plugin_names() {
        assert_eq!(
            candidates("ofi"),
            ["libnccl-net-ofi.so".to_string(), "ofi".to_string()]
        );
        assert_eq!(
            candidates("/opt/x/libnccl-net.so"),
            ["/opt/x/libnccl-net.so"]
        );
        assert_eq!(candidates("libnccl-net-x.so"), ["libnccl-net-x.so"]);
    }

    #[test]
    fn gin_and_rma_tables_of_the_inner_plugin_get_a_hint() {
        assert_eq!(gin_rma_hint("/x/libnccl-net.so", &[]), None);
        let h = gin_rma_hint("/x/libnccl-net.so", &["ncclGinPlugin_v14".into()]).unwrap();
        assert!(h.contains("NCCL_GIN_PLUGIN=/x/libnccl-net.so"), "{h}");
        assert!(h.contains("ncclGinPlugin_v14"), "{h}");
    }

    #[test]
    fn a_missing_library_names_every_candidate_and_the_reason() {
        let e = open("surely-not-a-plugin-name").err().expect("fails");
        let text = e.to_string();
        assert!(
            text.contains("libnccl-net-surely-not-a-plugin-name.so"),
            "{text}"
        );
        assert!(text.contains("surely-not-a-plugin-name:"), "{text}");
    }

    #[test]
    fn a_library_that_is_not_a_plugin_says_so() {
        let e = open("libc.so.6").err().expect("fails");
        assert!(
            matches!(&e, LoadError::NoVersion { older, .. } if older.is_empty()),
            "{e}"
        );
        assert!(e.to_string().contains("not an NCCL net plugin"), "{e}");
    }
}
