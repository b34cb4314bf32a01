//! A harness that plays NCCL's role against the built plugin library.
//!
//! It opens the `.so` with `dlopen(RTLD_NOW | RTLD_LOCAL)` as NCCL does, looks up the newest
//! `ncclNetPlugin_vN` it knows (v12 down to v7) or the one it is told, and drives it the way
//! NCCL's proxy does: non-blocking connect/accept polled until done, requests posted and
//! tested, the `0x1` hint stored in `*request` before `irecv`, `sizes == NULL` in `test`.
//! Every call goes through the version's own table, so each ABI adapter is exercised.

pub mod anynet;
pub mod child;
pub mod inner_ref;
pub mod peer;

use ncclnet_headers::net::*;
use ncclnet_headers::{DebugLogger, NcclResult};
use std::ffi::{CStr, CString, c_char, c_int, c_ulong, c_void};
use std::path::PathBuf;
use std::sync::Once;
use std::time::{Duration, Instant};

type Vp = *mut c_void;

unsafe extern "C" {
    fn harness_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
    fn harness_log_copy(out: *mut c_char, cap: usize) -> usize;
}

/// Everything the plugin logged through the harness's logger so far.
pub fn log_text() -> String {
    // SAFETY: a NULL/0 call returns the length; the second copies at most `cap` bytes.
    unsafe {
        let n = harness_log_copy(std::ptr::null_mut(), 0);
        let mut buf = vec![0u8; n + 1];
        harness_log_copy(buf.as_mut_ptr().cast(), buf.len());
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

pub fn logger() -> DebugLogger {
    Some(harness_logger)
}

/// Every version the library exports, newest first.
pub const VERSIONS: [u32; 6] = [12, 11, 10, 9, 8, 7];

/// Where the library under test is: `$NCCLBPF_PLUGIN`, else the release build, else debug.
/// The `ncclbpf` command next to the running test binary (`<target>/<profile>/deps/<test>`:
/// the command is `<target>/<profile>/ncclbpf`), or `NCCLBPF_CLI`.
pub fn cli_path() -> PathBuf {
    if let Some(p) = std::env::var_os("NCCLBPF_CLI") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("ncclbpf");
    assert!(
        p.exists(),
        "{} missing: build it (cargo build --release -p ncclbpf-cli) or set NCCLBPF_CLI",
        p.display()
    );
    p
}

pub fn plugin_path() -> PathBuf {
    if let Some(p) = std::env::var_os("NCCLBPF_PLUGIN") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for p in [
        "target/release/libnccl-net-bpf.so",
        "target/debug/libnccl-net-bpf.so",
        "target/release/libnccl_net_bpf.so",
        "target/debug/libnccl_net_bpf.so",
    ] {
        let path = root.join(p);
        if path.exists() {
            return path;
        }
    }
    panic!("plugin library not built: run scripts/build.sh (or set NCCLBPF_PLUGIN)");
}

#[derive(Clone, Copy)]
enum Table {
    V7(&'static NetV7),
    V8(&'static NetV8),
    V9(&'static NetV9),
    V10(&'static NetV10),
    V11(&'static NetV11),
    V12(&'static NetV12),
}

/// The properties the harness checks, read through any version.
#[derive(Clone, Debug)]
pub struct Props {
    pub name: String,
    pub speed: i32,
    pub ptr_support: i32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub net_device_type: i32,
    pub max_p2p_bytes: Option<usize>,
}

macro_rules! id {
    ($($t:ident),*) => {$(
        /// An opaque plugin object, as NCCL holds it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $t(pub Vp);
        // SAFETY: plugin objects are used from one thread at a time, as NCCL does.
        unsafe impl Send for $t {}
    )*};
}
id!(ListenComm, SendComm, RecvComm, Request);

/// One loaded plugin table (and, for v11+, one communicator context).
pub struct Net {
    pub version: u32,
    table: Table,
    ctx: Vp,
}

// SAFETY: the table is immutable; the plugin is thread-safe across comms (NCCL relies on it).
unsafe impl Send for Net {}
// SAFETY: as above.
unsafe impl Sync for Net {}

pub type R<T> = Result<T, NcclResult>;

fn ok(r: NcclResult) -> R<()> {
    if r.is_success() { Ok(()) } else { Err(r) }
}

static ENV: Once = Once::new();

/// Opens the library (`dlopen(RTLD_NOW | RTLD_LOCAL)`, as NCCL does; the handle stays open)
/// and finds the first of `versions` exported as `<prefix><version>`, as NCCL's loader does.
pub fn newest_symbol(prefix: &str, versions: &[u32]) -> Result<(u32, *mut c_void), String> {
    newest_symbol_in(&plugin_path(), prefix, versions)
}

/// [`newest_symbol`] in the library at `path`.
pub fn newest_symbol_in(
    path: &std::path::Path,
    prefix: &str,
    versions: &[u32],
) -> Result<(u32, *mut c_void), String> {
    let cpath = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a valid C string; the handle is kept for the process's life.
    let lib = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        // SAFETY: dlerror returns a C string describing the last failure.
        let err = unsafe { CStr::from_ptr(libc::dlerror()) }
            .to_string_lossy()
            .into_owned();
        return Err(format!("dlopen {}: {err}", path.display()));
    }
    for &v in versions {
        let sym = CString::new(format!("{prefix}{v}")).expect("no NUL");
        // SAFETY: dlsym on a live handle.
        let p = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        if !p.is_null() {
            return Ok((v, p));
        }
    }
    Err(format!("no {prefix}{versions:?} in {}", path.display()))
}

impl Net {
    /// Loads the library; picks `version` or the newest exported one, as NCCL does.
    pub fn open(version: Option<u32>) -> Result<Net, String> {
        Net::open_path(&plugin_path(), version)
    }

    /// [`open`](Self::open) for the library at `path` (e.g. the reference inner plugin,
    /// [`inner_ref::path`]).
    pub fn open_path(path: &std::path::Path, version: Option<u32>) -> Result<Net, String> {
        ENV.call_once(|| {
            if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
                // SAFETY: runs once, before the plugin (which reads the environment) is loaded.
                unsafe { std::env::set_var("NCCL_SOCKET_IFNAME", "lo") };
            }
        });
        let versions: Vec<u32> = version.map_or(VERSIONS.to_vec(), |v| vec![v]);
        let (v, p) = newest_symbol_in(path, "ncclNetPlugin_v", &versions)?;
        // SAFETY: the symbol is the data table of that version, alive while the library is.
        let table = unsafe {
            match v {
                7 => Table::V7(&*(p as *const NetV7)),
                8 => Table::V8(&*(p as *const NetV8)),
                9 => Table::V9(&*(p as *const NetV9)),
                10 => Table::V10(&*(p as *const NetV10)),
                11 => Table::V11(&*(p as *const NetV11)),
                12 => Table::V12(&*(p as *const NetV12)),
                _ => return Err(format!("unknown net version {v}")),
            }
        };
        Ok(Net {
            version: v,
            table,
            ctx: std::ptr::null_mut(),
        })
    }

    /// Opens and initialises, failing the test on any error.
    pub fn ready(version: Option<u32>) -> Net {
        let mut n = Net::open(version).expect("open plugin");
        n.init(0x1234).expect("init");
        assert!(n.devices().expect("devices") >= 1);
        n
    }

    pub fn name(&self) -> String {
        let p = match self.table {
            Table::V7(t) => t.name,
            Table::V8(t) => t.name,
            Table::V9(t) => t.name,
            Table::V10(t) => t.name,
            Table::V11(t) => t.name,
            Table::V12(t) => t.name,
        };
        // SAFETY: the name is a static C string of the library.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    pub fn init(&mut self, comm_id: u64) -> R<()> {
        let mut cfg = NetCommConfig {
            traffic_class: NET_TRAFFIC_CLASS_UNDEF,
        };
        // SAFETY: calling the plugin's init with the arguments its version expects.
        ok(unsafe {
            match self.table {
                Table::V7(t) => t.init.unwrap()(logger()),
                Table::V8(t) => t.init.unwrap()(logger()),
                Table::V9(t) => t.init.unwrap()(logger()),
                Table::V10(t) => t.init.unwrap()(logger(), None),
                Table::V11(t) => t.init.unwrap()(&mut self.ctx, comm_id, &mut cfg, logger(), None),
                Table::V12(t) => t.init.unwrap()(&mut self.ctx, comm_id, &mut cfg, logger(), None),
            }
        })
    }

    /// v11+: `finalize(ctx)`; a no-op for older versions.
    pub fn finalize(&mut self) -> R<()> {
        let ctx = std::mem::replace(&mut self.ctx, std::ptr::null_mut());
        // SAFETY: ctx came from this table's init.
        ok(unsafe {
            match self.table {
                Table::V11(t) => t.finalize.unwrap()(ctx),
                Table::V12(t) => t.finalize.unwrap()(ctx),
                _ => NcclResult::SUCCESS,
            }
        })
    }

    pub fn set_net_attr(&self, attr: &mut NetAttr) -> Option<R<()>> {
        // SAFETY: as the ABI specifies.
        unsafe {
            match self.table {
                Table::V11(t) => Some(ok(t.set_net_attr.unwrap()(self.ctx, attr))),
                Table::V12(t) => Some(ok(t.set_net_attr.unwrap()(self.ctx, attr))),
                _ => None,
            }
        }
    }

    pub fn devices(&self) -> R<i32> {
        let mut n = 0;
        let f = match self.table {
            Table::V7(t) => t.devices,
            Table::V8(t) => t.devices,
            Table::V9(t) => t.devices,
            Table::V10(t) => t.devices,
            Table::V11(t) => t.devices,
            Table::V12(t) => t.devices,
        };
        // SAFETY: devices(int*).
        ok(unsafe { f.unwrap()(&mut n) })?;
        Ok(n)
    }

    pub fn props(&self, dev: i32) -> R<Props> {
        macro_rules! get {
            ($t:expr, $ty:ty, $p2p:expr) => {{
                // SAFETY: zeroed POD filled by getProperties of the same version.
                let mut p: $ty = unsafe { std::mem::zeroed() };
                // SAFETY: getProperties of the same version, into its own struct.
                ok(unsafe { $t.get_properties.unwrap()(dev, &mut p) })?;
                Props {
                    // SAFETY: the plugin keeps its name strings alive.
                    name: unsafe { CStr::from_ptr(p.name) }
                        .to_string_lossy()
                        .into_owned(),
                    speed: p.speed,
                    ptr_support: p.ptr_support,
                    max_comms: p.max_comms,
                    max_recvs: p.max_recvs,
                    net_device_type: p.net_device_type.0,
                    max_p2p_bytes: $p2p(&p),
                }
            }};
        }
        Ok(match self.table {
            Table::V7(t) => get!(t, NetPropertiesV7, |_: &NetPropertiesV7| None),
            Table::V8(t) => get!(t, NetPropertiesV8, |_: &NetPropertiesV8| None),
            Table::V9(t) => get!(t, NetPropertiesV9, |p: &NetPropertiesV9| Some(
                p.max_p2p_bytes
            )),
            Table::V10(t) => get!(t, NetPropertiesV10, |p: &NetPropertiesV10| Some(
                p.max_p2p_bytes
            )),
            Table::V11(t) => get!(t, NetPropertiesV11, |p: &NetPropertiesV11| Some(
                p.max_p2p_bytes
            )),
            Table::V12(t) => get!(t, NetPropertiesV12, |p: &NetPropertiesV12| Some(
                p.max_p2p_bytes
            )),
        })
    }

    pub fn listen(&self, dev: i32) -> R<([u8; NET_HANDLE_MAXSIZE], ListenComm)> {
        let mut h = [0u8; NET_HANDLE_MAXSIZE];
        let mut l: Vp = std::ptr::null_mut();
        let hp = h.as_mut_ptr() as Vp;
        // SAFETY: listen(dev, handle[128], &listenComm).
        ok(unsafe {
            match self.table {
                Table::V7(t) => t.listen.unwrap()(dev, hp, &mut l),
                Table::V8(t) => t.listen.unwrap()(dev, hp, &mut l),
                Table::V9(t) => t.listen.unwrap()(dev, hp, &mut l),
                Table::V10(t) => t.listen.unwrap()(dev, hp, &mut l),
                Table::V11(t) => t.listen.unwrap()(self.ctx, dev, hp, &mut l),
                Table::V12(t) => t.listen.unwrap()(self.ctx, dev, hp, &mut l),
            }
        })?;
        assert!(!l.is_null(), "listen succeeded with a NULL listenComm");
        Ok((h, ListenComm(l)))
    }

    /// One `connect` call; `None` while in progress. `handle` is reused across calls.
    pub fn connect_step(
        &self,
        dev: i32,
        handle: &mut [u8; NET_HANDLE_MAXSIZE],
    ) -> R<Option<SendComm>> {
        let mut s: Vp = std::ptr::null_mut();
        let hp = handle.as_mut_ptr() as Vp;
        let mut cfg = NetCommConfig {
            traffic_class: NET_TRAFFIC_CLASS_UNDEF,
        };
        let mut devh: *mut NetDeviceHandle = std::ptr::null_mut();
        // SAFETY: connect with the version's argument list; the dev-handle out-pointer points to NULL.
        ok(unsafe {
            match self.table {
                Table::V7(t) => t.connect.unwrap()(dev, hp, &mut s, &mut devh),
                Table::V8(t) => t.connect.unwrap()(dev, hp, &mut s, &mut devh),
                Table::V9(t) => t.connect.unwrap()(dev, hp, &mut s, std::ptr::null_mut()),
                Table::V10(t) => t.connect.unwrap()(dev, &mut cfg, hp, &mut s, &mut devh),
                Table::V11(t) => t.connect.unwrap()(self.ctx, dev, hp, &mut s, &mut devh),
                Table::V12(t) => {
                    t.connect.unwrap()(self.ctx, dev, hp, &mut s, std::ptr::null_mut())
                }
            }
        })?;
        Ok((!s.is_null()).then_some(SendComm(s)))
    }

    /// One `accept` call; `None` while in progress.
    pub fn accept_step(&self, l: ListenComm) -> R<Option<RecvComm>> {
        let mut r: Vp = std::ptr::null_mut();
        let mut devh: *mut NetDeviceHandle = std::ptr::null_mut();
        let f = match self.table {
            Table::V7(t) => t.accept,
            Table::V8(t) => t.accept,
            Table::V9(t) => t.accept,
            Table::V10(t) => t.accept,
            Table::V11(t) => t.accept,
            Table::V12(t) => t.accept,
        };
        // SAFETY: accept(listenComm, &recvComm, &devHandle).
        ok(unsafe { f.unwrap()(l.0, &mut r, &mut devh) })?;
        Ok((!r.is_null()).then_some(RecvComm(r)))
    }

    /// Connects and accepts in one thread, polling both as NCCL's proxies would.
    pub fn connect_pair(&self, dev: i32) -> R<(SendComm, RecvComm)> {
        let (mut h, l) = self.listen(dev)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut s, mut r) = (None, None);
        while s.is_none() || r.is_none() {
            if s.is_none() {
                s = self.connect_step(dev, &mut h)?;
            }
            if r.is_none() {
                r = self.accept_step(l)?;
            }
            assert!(Instant::now() < deadline, "connect/accept did not finish");
        }
        self.close_listen(l)?;
        Ok((s.unwrap(), r.unwrap()))
    }

    /// `regMr` on a send or recv comm.
    ///
    /// # Safety
    /// `comm` must be a live comm of this plugin.
    pub unsafe fn reg_mr(&self, comm: Vp, data: Vp, size: usize, type_: i32) -> R<Vp> {
        let mut mh: Vp = std::ptr::null_mut();
        // SAFETY: regMr with the version's size type.
        ok(unsafe {
            match self.table {
                Table::V7(t) => t.reg_mr.unwrap()(comm, data, size as c_int, type_, &mut mh),
                Table::V8(t) => t.reg_mr.unwrap()(comm, data, size, type_, &mut mh),
                Table::V9(t) => t.reg_mr.unwrap()(comm, data, size, type_, &mut mh),
                Table::V10(t) => t.reg_mr.unwrap()(comm, data, size, type_, &mut mh),
                Table::V11(t) => t.reg_mr.unwrap()(comm, data, size, type_, &mut mh),
                Table::V12(t) => t.reg_mr.unwrap()(comm, data, size, type_, &mut mh),
            }
        })?;
        Ok(mh)
    }

    /// `isend`; `None` means "no request now, retry".
    ///
    /// # Safety
    /// `data` must stay valid for `size` bytes until the request is done.
    pub unsafe fn isend(&self, c: SendComm, data: *const u8, size: usize) -> R<Option<Request>> {
        let mut req: Vp = std::ptr::null_mut();
        let d = data as Vp;
        let mh: Vp = std::ptr::null_mut();
        let tag = 0;
        // SAFETY: isend with the version's size type; NULL phandle as bootstrap passes.
        ok(unsafe {
            match self.table {
                Table::V7(t) => t.isend.unwrap()(c.0, d, size as c_int, tag, mh, &mut req),
                Table::V8(t) => t.isend.unwrap()(c.0, d, size as c_int, tag, mh, &mut req),
                Table::V9(t) => t.isend.unwrap()(c.0, d, size, tag, mh, &mut req),
                Table::V10(t) => {
                    t.isend.unwrap()(c.0, d, size, tag, mh, std::ptr::null_mut(), &mut req)
                }
                Table::V11(t) => {
                    t.isend.unwrap()(c.0, d, size, tag, mh, std::ptr::null_mut(), &mut req)
                }
                Table::V12(t) => {
                    t.isend.unwrap()(c.0, d, size, tag, mh, std::ptr::null_mut(), &mut req)
                }
            }
        })?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `irecv` of one buffer; with `hint`, `*request` holds NCCL's 0x1 before the call.
    ///
    /// # Safety
    /// `data` must stay valid for `size` bytes until the request is done.
    pub unsafe fn irecv(
        &self,
        c: RecvComm,
        data: *mut u8,
        size: usize,
        hint: bool,
    ) -> R<Option<Request>> {
        let mut req: Vp = if hint {
            NET_OPTIONAL_RECV_COMPLETION as Vp
        } else {
            std::ptr::null_mut()
        };
        let mut d = data as Vp;
        let mut isize_ = size as c_int;
        let mut usize_ = size;
        let mut tag: c_int = 0;
        let mut mh: Vp = std::ptr::null_mut();
        let mut ph: Vp = std::ptr::null_mut();
        // SAFETY: irecv(n = 1, ...) with the version's size array type.
        ok(unsafe {
            match self.table {
                Table::V7(t) => {
                    t.irecv.unwrap()(c.0, 1, &mut d, &mut isize_, &mut tag, &mut mh, &mut req)
                }
                Table::V8(t) => {
                    t.irecv.unwrap()(c.0, 1, &mut d, &mut isize_, &mut tag, &mut mh, &mut req)
                }
                Table::V9(t) => {
                    t.irecv.unwrap()(c.0, 1, &mut d, &mut usize_, &mut tag, &mut mh, &mut req)
                }
                Table::V10(t) => t.irecv.unwrap()(
                    c.0,
                    1,
                    &mut d,
                    &mut usize_,
                    &mut tag,
                    &mut mh,
                    std::ptr::null_mut(),
                    &mut req,
                ),
                Table::V11(t) => t.irecv.unwrap()(
                    c.0,
                    1,
                    &mut d,
                    &mut usize_,
                    &mut tag,
                    &mut mh,
                    &mut ph,
                    &mut req,
                ),
                Table::V12(t) => t.irecv.unwrap()(
                    c.0,
                    1,
                    &mut d,
                    &mut usize_,
                    &mut tag,
                    &mut mh,
                    &mut ph,
                    &mut req,
                ),
            }
        })?;
        assert_ne!(
            req as usize, NET_OPTIONAL_RECV_COMPLETION,
            "irecv left NCCL's 0x1 hint in *request"
        );
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// `test`; `Some(size)` when done. With `want_size = false`, passes `sizes = NULL`.
    pub fn test(&self, r: Request, want_size: bool) -> R<Option<i32>> {
        let mut done: c_int = 0;
        let mut size: c_int = -1;
        let sp = if want_size {
            &mut size as *mut c_int
        } else {
            std::ptr::null_mut()
        };
        let f = match self.table {
            Table::V7(t) => t.test,
            Table::V8(t) => t.test,
            Table::V9(t) => t.test,
            Table::V10(t) => t.test,
            Table::V11(t) => t.test,
            Table::V12(t) => t.test,
        };
        // SAFETY: test(request, &done, sizes-or-NULL).
        ok(unsafe { f.unwrap()(r.0, &mut done, sp) })?;
        Ok((done == 1).then_some(size))
    }

    /// Tests until done or `timeout`; returns the reported size.
    pub fn wait(&self, r: Request, timeout: Duration) -> R<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.test(r, true)? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                panic!("request not done within {timeout:?}");
            }
            std::thread::yield_now();
        }
    }

    fn close_fn(&self, which: u8) -> CloseFn {
        macro_rules! pick {
            ($t:expr) => {
                match which {
                    0 => $t.close_send,
                    1 => $t.close_recv,
                    _ => $t.close_listen,
                }
            };
        }
        match self.table {
            Table::V7(t) => pick!(t),
            Table::V8(t) => pick!(t),
            Table::V9(t) => pick!(t),
            Table::V10(t) => pick!(t),
            Table::V11(t) => pick!(t),
            Table::V12(t) => pick!(t),
        }
    }

    pub fn close_send(&self, c: SendComm) -> R<()> {
        // SAFETY: closing a comm we own, once.
        ok(unsafe { self.close_fn(0).unwrap()(c.0) })
    }
    pub fn close_recv(&self, c: RecvComm) -> R<()> {
        // SAFETY: closing a comm we own, once.
        ok(unsafe { self.close_fn(1).unwrap()(c.0) })
    }
    pub fn close_listen(&self, c: ListenComm) -> R<()> {
        // SAFETY: closing a listen comm we own, once.
        ok(unsafe { self.close_fn(2).unwrap()(c.0) })
    }

    /// Sends `data` and receives it into a buffer of `recv_cap` bytes, polling both sides.
    pub fn transfer(&self, s: SendComm, r: RecvComm, data: &[u8], recv_cap: usize) -> R<Vec<u8>> {
        let mut out = vec![0u8; recv_cap];
        // SAFETY: both buffers outlive the requests, which are waited for below.
        let rr = unsafe { self.irecv(r, out.as_mut_ptr(), recv_cap, false)? }.expect("recv slot");
        // SAFETY: as above.
        let sr = unsafe { self.isend(s, data.as_ptr(), data.len())? }.expect("send slot");
        let (mut sd, mut rd) = (false, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !sd || rd.is_none() {
            if !sd {
                sd = self.test(sr, true)?.is_some();
            }
            if rd.is_none() {
                rd = self.test(rr, true)?;
            }
            assert!(
                Instant::now() < deadline,
                "transfer of {} bytes did not finish",
                data.len()
            );
        }
        let n = rd.unwrap() as usize;
        assert_eq!(n, data.len(), "receive reported a wrong size");
        out.truncate(n);
        Ok(out)
    }
}

/// A deterministic pattern of `len` bytes that differs per `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Counts of this process's open file descriptors and threads.
pub fn fds_and_threads() -> (usize, usize) {
    let count = |p: &str| std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0);
    (count("/proc/self/fd"), count("/proc/self/task"))
}

/// One connection's record in the `net_conn_stats` map of `policies/src/net_stats.c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnStats {
    pub conn_id: u64,
    pub send_bytes: u64,
    pub recv_bytes: u64,
    pub sends: u64,
    pub recvs: u64,
    pub errors: u64,
    pub lat_hist: [u64; 16],
}

/// Reads `net_conn_stats` of process `pid` from outside, as a tool would.
pub fn read_conn_stats(pid: u32) -> Result<Vec<ConnStats>, String> {
    let views = shared_maps::MapView::open_all(pid).map_err(|e| e.to_string())?;
    let v = views
        .iter()
        .find(|v| v.name == "net_conn_stats")
        .ok_or("no net_conn_stats map")?;
    Ok(v.entries()
        .into_iter()
        .map(|(k, vals)| {
            let w: Vec<u64> = vals[0]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let mut lat_hist = [0u64; 16];
            lat_hist.copy_from_slice(&w[5..21]);
            ConnStats {
                conn_id: u64::from_le_bytes(k[..8].try_into().unwrap()),
                send_bytes: w[0],
                recv_bytes: w[1],
                sends: w[2],
                recvs: w[3],
                errors: w[4],
                lat_hist,
            }
        })
        .collect())
}

/// The compiled shipped policy `name` (built by policies/build.sh), if present.
pub fn shipped_policy(name: &str) -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies/src")
        .join(format!("{name}.o"));
    p.exists().then_some(p)
}

/// The tuner half of the library, driven as NCCL's enqueue path drives it.
pub struct Tuner {
    pub version: u32,
    table: TunerTable,
    ctx: Vp,
}

#[derive(Clone, Copy)]
enum TunerTable {
    V2(&'static ncclnet_headers::tuner::TunerV2),
    V3(&'static ncclnet_headers::tuner::TunerV3),
    V4(&'static ncclnet_headers::tuner::TunerV4),
    V5(&'static ncclnet_headers::tuner::TunerV5),
    V6(&'static ncclnet_headers::tuner::TunerV6),
}

/// What one getCollInfo call did.
#[derive(Clone, Debug, PartialEq)]
pub struct TunerCall {
    /// The cost table after the call (v3+), row-major `[algo][proto]`.
    pub table: Vec<f32>,
    /// v2: the (algorithm, protocol) it returned (-1 when left alone).
    pub pair: (i32, i32),
    pub nchannels: i32,
}

impl TunerCall {
    /// The (algo, proto) NCCL would pick: the smallest non-negative cost.
    pub fn picked(&self, num_proto: usize) -> Option<(usize, usize)> {
        if self.pair.0 >= 0 {
            return Some((self.pair.0 as usize, self.pair.1 as usize));
        }
        let i = (0..self.table.len())
            .filter(|&i| self.table[i] >= 0.0)
            .min_by(|&a, &b| self.table[a].total_cmp(&self.table[b]))?;
        Some((i / num_proto, i % num_proto))
    }
}

impl Tuner {
    /// Loads the library's `ncclTunerPlugin_vN` (newest, or `version`) and runs its `init`.
    pub fn open(version: Option<u32>, nranks: usize, nnodes: usize) -> Result<Tuner, String> {
        // SAFETY: zeroed constants are a valid (if meaningless) table of doubles.
        let mut consts: ncclnet_headers::tuner::TunerConstantsV5 = unsafe { std::mem::zeroed() };
        Tuner::open_with_constants(version, nranks, nnodes, &mut consts)
    }

    /// [`open`](Self::open) for communicator `comm_id` (what v5+ `init` passes as NCCL's comm
    /// hash; v2-v4 have none).
    pub fn open_comm(
        version: Option<u32>,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
    ) -> Result<Tuner, String> {
        // SAFETY: zeroed constants are a valid (if meaningless) table of doubles.
        let mut consts: ncclnet_headers::tuner::TunerConstantsV5 = unsafe { std::mem::zeroed() };
        Tuner::open_full(version, comm_id, nranks, nnodes, &mut consts)
    }

    /// [`open`](Self::open), handing v5+ `init` these cost-model constants (as NCCL does, for
    /// the plugin to change in place).
    pub fn open_with_constants(
        version: Option<u32>,
        nranks: usize,
        nnodes: usize,
        consts: &mut ncclnet_headers::tuner::TunerConstantsV5,
    ) -> Result<Tuner, String> {
        Tuner::open_full(version, 0xc0ffee, nranks, nnodes, consts)
    }

    fn open_full(
        version: Option<u32>,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        consts: &mut ncclnet_headers::tuner::TunerConstantsV5,
    ) -> Result<Tuner, String> {
        let versions: Vec<u32> = version.map_or(vec![6, 5, 4, 3, 2], |v| vec![v]);
        let (v, p) = newest_symbol("ncclTunerPlugin_v", &versions)?;
        use ncclnet_headers::tuner::*;
        // SAFETY: the symbol is that version's table, alive while the library is.
        let table = unsafe {
            match v {
                2 => TunerTable::V2(&*(p as *const TunerV2)),
                3 => TunerTable::V3(&*(p as *const TunerV3)),
                4 => TunerTable::V4(&*(p as *const TunerV4)),
                5 => TunerTable::V5(&*(p as *const TunerV5)),
                _ => TunerTable::V6(&*(p as *const TunerV6)),
            }
        };
        let mut t = Tuner {
            version: v,
            table,
            ctx: std::ptr::null_mut(),
        };
        let mut nvl = NvlDomainInfoV5 {
            n_nvl_domains: nnodes as i32,
            min_ranks_per_nvl_domain: 1,
            max_ranks_per_nvl_domain: 1,
        };
        // SAFETY: init with the arguments of its version.
        let r = unsafe {
            match table {
                TunerTable::V2(x) => x.init.unwrap()(nranks, nnodes, logger(), &mut t.ctx),
                TunerTable::V3(x) => x.init.unwrap()(nranks, nnodes, logger(), &mut t.ctx),
                TunerTable::V4(x) => x.init.unwrap()(nranks, nnodes, logger(), &mut t.ctx),
                TunerTable::V5(x) => x.init.unwrap()(
                    &mut t.ctx,
                    comm_id,
                    nranks,
                    nnodes,
                    logger(),
                    &mut nvl,
                    consts,
                ),
                TunerTable::V6(x) => x.init.unwrap()(
                    &mut t.ctx,
                    comm_id,
                    nranks,
                    nnodes,
                    logger(),
                    &mut nvl,
                    consts,
                ),
            }
        };
        if r.is_success() {
            Ok(t)
        } else {
            Err(format!("tuner init: {}", r.name()))
        }
    }

    /// `getChunkSize` (v6 only; `None` for older tables or a NULL entry): the chunk after the
    /// call, given NCCL's `chunk`.
    pub fn chunk_size(
        &self,
        coll: i32,
        bytes: usize,
        algo: i32,
        proto: i32,
        nchannels: i32,
        chunk: usize,
    ) -> Option<R<usize>> {
        let TunerTable::V6(x) = self.table else {
            return None;
        };
        let f = x.get_chunk_size?;
        let mut c = chunk;
        // SAFETY: getChunkSize(ctx, collType, nBytes, algo, proto, nChannels, &chunkSize).
        let r = unsafe {
            f(
                self.ctx,
                ncclnet_headers::NcclFunc(coll),
                bytes,
                algo,
                proto,
                nchannels,
                &mut c,
            )
        };
        Some(ok(r).map(|()| c))
    }

    /// One getCollInfo for an all-reduce of `bytes` over a cost table NCCL filled with `costs`.
    pub fn coll_info(
        &self,
        bytes: usize,
        costs: &[f32],
        num_algo: usize,
        num_proto: usize,
    ) -> R<TunerCall> {
        let f = ncclnet_headers::NcclFunc::ALL_REDUCE;
        self.coll_info_for(f, bytes, 1, 0, costs, num_algo, num_proto)
    }

    /// One getCollInfo for collective `f` of `bytes` with NCCL's `numPipeOps` and `regBuff`
    /// (v2 and v3 take no regBuff).
    #[allow(clippy::too_many_arguments)]
    pub fn coll_info_for(
        &self,
        f: ncclnet_headers::NcclFunc,
        bytes: usize,
        pipe: c_int,
        reg: c_int,
        costs: &[f32],
        num_algo: usize,
        num_proto: usize,
    ) -> R<TunerCall> {
        let mut table = costs.to_vec();
        let tp = table.as_mut_ptr() as *mut *mut f32;
        let mut nch: c_int = 0;
        let (mut algo, mut proto) = (-1, -1);
        let (na, np) = (num_algo as c_int, num_proto as c_int);
        // SAFETY: the table outlives the call and has num_algo x num_proto floats.
        ok(unsafe {
            match self.table {
                TunerTable::V2(x) => x.get_coll_info.unwrap()(
                    self.ctx, f, bytes, 0, 0, pipe, &mut algo, &mut proto, &mut nch,
                ),
                TunerTable::V3(x) => {
                    x.get_coll_info.unwrap()(self.ctx, f, bytes, pipe, tp, na, np, &mut nch)
                }
                TunerTable::V4(x) => {
                    x.get_coll_info.unwrap()(self.ctx, f, bytes, pipe, tp, na, np, reg, &mut nch)
                }
                TunerTable::V5(x) => {
                    x.get_coll_info.unwrap()(self.ctx, f, bytes, pipe, tp, na, np, reg, &mut nch)
                }
                TunerTable::V6(x) => {
                    x.get_coll_info.unwrap()(self.ctx, f, bytes, pipe, tp, na, np, reg, &mut nch)
                }
            }
        })?;
        Ok(TunerCall {
            table,
            pair: (algo, proto),
            nchannels: nch,
        })
    }

    pub fn finalize(&mut self) -> R<()> {
        let ctx = std::mem::replace(&mut self.ctx, std::ptr::null_mut());
        // SAFETY: ctx came from this table's init.
        ok(unsafe {
            match self.table {
                TunerTable::V2(x) => x.destroy.unwrap()(ctx),
                TunerTable::V3(x) => x.destroy.unwrap()(ctx),
                TunerTable::V4(x) => x.destroy.unwrap()(ctx),
                TunerTable::V5(x) => x.finalize.unwrap()(ctx),
                TunerTable::V6(x) => x.finalize.unwrap()(ctx),
            }
        })
    }
}

/// A child process whose standard output arrives line by line on a channel (read by a thread of
/// its own); killed and reaped when dropped, unless it has already exited.
pub struct LineChild {
    pub child: std::process::Child,
    pub lines: std::sync::mpsc::Receiver<String>,
    pub pid: u32,
}

impl LineChild {
    /// Spawns `cmd` with its standard output piped (standard input as the caller set it).
    pub fn spawn(cmd: &mut std::process::Command) -> LineChild {
        use std::io::BufRead;
        let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let pid = child.id();
        LineChild { child, lines, pid }
    }

    /// The next line, waiting at most 60 s for it.
    pub fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("waiting for a line from pid {}: {e}", self.pid))
    }

    /// The next line, which must be `want`.
    pub fn expect(&self, want: &str) {
        assert_eq!(self.line(), want, "pid {}", self.pid);
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child, which we have not reaped (we hold its `Child`).
        assert_eq!(unsafe { libc::kill(self.pid as i32, sig) }, 0);
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
