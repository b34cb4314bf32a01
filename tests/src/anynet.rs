//! A driver for any `ncclNetPlugin_vN` table, v6 to v12, with every argument in the caller's
//! hands: memory handles, tags, profiler handles, multi-receives, `sizes == NULL`, the `0x1`
//! receive hint. [`crate::Net`] plays NCCL (v7 to v12, NULL mhandles and phandles, tag 0); this
//! one is for checking plugins, such as the reference inner plugin (`crate::inner_ref`) loaded
//! directly or the wrapper in front of it.
//!
//! Calls go through the table's slots by index (slot i is at byte 8·i) with the signature the
//! version gives that slot (../shared/docs/nccl-plugin-abi.md §2.3). Results are NCCL's raw
//! `ncclResult_t` codes, so a test can assert on a specific one.

use ncclnet_headers::net::{NET_HANDLE_MAXSIZE, NetAttr};
use std::ffi::{CStr, CString, c_int, c_void};
use std::path::Path;

type Vp = *mut c_void;
/// `Err(code)` carries the plugin's non-zero `ncclResult_t`.
pub type Res<T> = Result<T, i32>;

/// Slot indexes of the net table.
pub mod slot {
    pub const NAME: usize = 0;
    pub const INIT: usize = 1;
    pub const DEVICES: usize = 2;
    pub const GET_PROPERTIES: usize = 3;
    pub const LISTEN: usize = 4;
    pub const CONNECT: usize = 5;
    pub const ACCEPT: usize = 6;
    pub const REG_MR: usize = 7;
    pub const REG_MR_DMABUF: usize = 8;
    pub const DEREG_MR: usize = 9;
    pub const ISEND: usize = 10;
    pub const IRECV: usize = 11;
    pub const IFLUSH: usize = 12;
    pub const TEST: usize = 13;
    pub const CLOSE_SEND: usize = 14;
    pub const CLOSE_RECV: usize = 15;
    pub const CLOSE_LISTEN: usize = 16;
    pub const GET_DEVICE_MR: usize = 17;
    pub const IRECV_CONSUMED: usize = 18;
    pub const MAKE_VDEVICE: usize = 19;
    pub const FINALIZE: usize = 20;
    pub const SET_NET_ATTR: usize = 21;
}

/// Slots in the table of `version` (name included).
pub fn slots_of(version: u32) -> usize {
    match version {
        6 => 17,
        7 | 8 => 19,
        9 | 10 => 20,
        _ => 22,
    }
}

/// NCCL's profiler callback type, as v10+ `init` receives it.
pub type ProfCb = unsafe extern "C" fn(*mut Vp, c_int, Vp, i64, Vp) -> c_int;

/// A plugin object as NCCL holds it (comm, mhandle, request, phandle): an opaque pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Obj(pub Vp);

impl Obj {
    pub const NULL: Obj = Obj(std::ptr::null_mut());
    /// An arbitrary value, e.g. a phandle a test invents or a forged handle.
    pub fn addr(a: usize) -> Obj {
        Obj(a as Vp)
    }
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

// SAFETY: an opaque value; the plugins it belongs to are thread-safe.
unsafe impl Send for Obj {}
// SAFETY: as above.
unsafe impl Sync for Obj {}

/// The properties every version reports, read at the version's offsets.
#[derive(Clone, Debug)]
pub struct AnyProps {
    pub name: String,
    pub guid: u64,
    pub ptr_support: i32,
    pub max_recvs: i32,
    /// v9+: the fused physical devices (`vProps`).
    pub vdevs: Option<Vec<i32>>,
    /// v9+.
    pub max_p2p_bytes: Option<usize>,
}

/// One buffer of an `irecv`.
#[derive(Clone, Copy, Debug)]
pub struct RecvBuf {
    pub data: *mut u8,
    pub size: usize,
    pub tag: i32,
    pub mh: Obj,
    pub ph: Obj,
}

/// One table of one loaded library; for v11+ also one communicator context.
pub struct AnyNet {
    pub version: u32,
    base: *const usize,
    /// v11+: what `init` returned; passed to listen/connect/finalize/setNetAttr (tests may
    /// overwrite it to pass a foreign one).
    pub ctx: Vp,
    /// The dlopen handle (kept open).
    pub lib: Vp,
}

// SAFETY: the table is immutable data of a library that stays loaded; the plugins driven here
// are thread-safe (NCCL requires it).
unsafe impl Send for AnyNet {}
// SAFETY: as above.
unsafe impl Sync for AnyNet {}

fn rc(r: c_int) -> Res<()> {
    if r == 0 { Ok(()) } else { Err(r) }
}

/// `dlopen(path, RTLD_NOW | RTLD_LOCAL)` as NCCL does; the handle is never closed.
pub fn dlopen_local(path: &Path) -> Result<Vp, String> {
    let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a valid C string.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror describes the failure just seen.
        let e = unsafe { CStr::from_ptr(libc::dlerror()) };
        return Err(format!(
            "dlopen {}: {}",
            path.display(),
            e.to_string_lossy()
        ));
    }
    Ok(h)
}

/// `dlsym(lib, name)`, NULL when absent.
///
/// # Safety
/// `lib` must be a live handle from `dlopen`.
pub unsafe fn dlsym(lib: Vp, name: &str) -> Vp {
    let c = CString::new(name).expect("no NUL");
    // SAFETY: dlsym on a live handle with a valid C string.
    unsafe { libc::dlsym(lib, c.as_ptr()) }
}

macro_rules! call {
    ($self:ident, $slot:expr, fn($($t:ty),*), $($a:expr),*) => {{
        let f = $self.raw($slot);
        assert!(f != 0, "slot {} of the v{} table is NULL", $slot, $self.version);
        // SAFETY: the slot holds a function of exactly this signature for this version
        // (nccl-plugin-abi.md §2.3); the arguments are what that signature takes.
        unsafe {
            let f: unsafe extern "C" fn($($t),*) -> c_int = std::mem::transmute::<usize, _>(f);
            f($($a),*)
        }
    }};
}

impl AnyNet {
    /// Opens `path` and takes its `ncclNetPlugin_v<version>`.
    pub fn open(path: &Path, version: u32) -> Result<AnyNet, String> {
        let lib = dlopen_local(path)?;
        // SAFETY: lib was just opened.
        let p = unsafe { dlsym(lib, &format!("ncclNetPlugin_v{version}")) };
        if p.is_null() {
            return Err(format!("no ncclNetPlugin_v{version} in {}", path.display()));
        }
        Ok(AnyNet {
            version,
            base: p as *const usize,
            ctx: std::ptr::null_mut(),
            lib,
        })
    }

    /// The raw address in slot `i` (0 for NULL or past the table's end).
    pub fn raw(&self, i: usize) -> usize {
        if i >= slots_of(self.version) {
            return 0;
        }
        // SAFETY: i is inside the table, which has slots_of(version) pointer-sized slots.
        unsafe { *self.base.add(i) }
    }

    pub fn name(&self) -> String {
        // SAFETY: slot 0 is the plugin's static name string.
        unsafe { CStr::from_ptr(self.raw(slot::NAME) as *const std::ffi::c_char) }
            .to_string_lossy()
            .into_owned()
    }

    /// `init` with the harness's logger and `prof` (v10+), communicator `comm_id` (v11+).
    pub fn init(&mut self, comm_id: u64, prof: Option<ProfCb>) -> Res<()> {
        let log = crate::logger();
        let pf = prof.map_or(0usize, |f| f as usize);
        let mut cfg: c_int = -1;
        rc(match self.version {
            6..=9 => call!(self, slot::INIT, fn(ncclnet_headers::DebugLogger), log),
            10 => call!(
                self,
                slot::INIT,
                fn(ncclnet_headers::DebugLogger, usize),
                log,
                pf
            ),
            _ => {
                let ctx = &mut self.ctx as *mut Vp;
                call!(
                    self,
                    slot::INIT,
                    fn(*mut Vp, u64, *mut c_int, ncclnet_headers::DebugLogger, usize),
                    ctx,
                    comm_id,
                    &mut cfg,
                    log,
                    pf
                )
            }
        })
    }

    pub fn finalize(&mut self) -> Res<()> {
        if self.version < 11 {
            return Ok(());
        }
        let ctx = std::mem::replace(&mut self.ctx, std::ptr::null_mut());
        rc(call!(self, slot::FINALIZE, fn(Vp), ctx))
    }

    pub fn set_net_attr(&self, attr: &mut NetAttr) -> Res<()> {
        rc(call!(
            self,
            slot::SET_NET_ATTR,
            fn(Vp, *mut NetAttr),
            self.ctx,
            attr
        ))
    }

    pub fn devices(&self) -> Res<i32> {
        let mut n: c_int = 0;
        rc(call!(self, slot::DEVICES, fn(*mut c_int), &mut n))?;
        Ok(n)
    }

    pub fn props(&self, dev: i32) -> Res<AnyProps> {
        let mut b = [0u64; 16]; // 128 bytes, 8-aligned: the largest properties struct
        rc(call!(
            self,
            slot::GET_PROPERTIES,
            fn(c_int, *mut u64),
            dev,
            b.as_mut_ptr()
        ))?;
        let bytes: Vec<u8> = b.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let i32_at = |o: usize| i32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().unwrap());
        let v = self.version;
        let max_recvs = i32_at(match v {
            6 | 7 => 44,
            8 => 48,
            _ => 52,
        });
        let vdevs = (v >= 9).then(|| {
            let n = i32_at(64).max(0) as usize;
            (0..n).map(|i| i32_at(68 + 4 * i)).collect()
        });
        let max_p2p_bytes = (v >= 9).then(|| u64_at(if v >= 12 { 104 } else { 88 }) as usize);
        // SAFETY: the plugin keeps its name strings alive.
        let name = unsafe { CStr::from_ptr(b[0] as *const std::ffi::c_char) };
        Ok(AnyProps {
            name: name.to_string_lossy().into_owned(),
            guid: u64_at(16),
            ptr_support: i32_at(24),
            max_recvs,
            vdevs,
            max_p2p_bytes,
        })
    }

    /// v9+: fuses `devs` into a virtual device; returns its index.
    pub fn make_vdevice(&self, devs: &[i32]) -> Res<i32> {
        let mut p = [0 as c_int; 9];
        p[0] = devs.len() as c_int;
        for (i, &d) in devs.iter().enumerate().take(8) {
            p[1 + i] = d;
        }
        let mut d: c_int = -1;
        rc(call!(
            self,
            slot::MAKE_VDEVICE,
            fn(*mut c_int, *mut c_int),
            &mut d,
            p.as_mut_ptr()
        ))?;
        Ok(d)
    }

    pub fn listen(&self, dev: i32) -> Res<([u8; NET_HANDLE_MAXSIZE], Obj)> {
        let mut h = [0u8; NET_HANDLE_MAXSIZE];
        let mut l: Vp = std::ptr::null_mut();
        let hp = h.as_mut_ptr() as Vp;
        rc(if self.version >= 11 {
            call!(
                self,
                slot::LISTEN,
                fn(Vp, c_int, Vp, *mut Vp),
                self.ctx,
                dev,
                hp,
                &mut l
            )
        } else {
            call!(self, slot::LISTEN, fn(c_int, Vp, *mut Vp), dev, hp, &mut l)
        })?;
        Ok((h, Obj(l)))
    }

    /// One `connect`; `None` while in progress. The handle is reused across calls, as NCCL does.
    pub fn connect_step(
        &self,
        dev: i32,
        handle: &mut [u8; NET_HANDLE_MAXSIZE],
    ) -> Res<Option<Obj>> {
        let mut s: Vp = std::ptr::null_mut();
        let mut devh: Vp = std::ptr::null_mut();
        let mut cfg: c_int = -1;
        let hp = handle.as_mut_ptr() as Vp;
        let (sp, dp) = (&mut s as *mut Vp, &mut devh as *mut Vp);
        rc(match self.version {
            6 => call!(self, slot::CONNECT, fn(c_int, Vp, *mut Vp), dev, hp, sp),
            7..=9 => call!(
                self,
                slot::CONNECT,
                fn(c_int, Vp, *mut Vp, *mut Vp),
                dev,
                hp,
                sp,
                dp
            ),
            10 => call!(
                self,
                slot::CONNECT,
                fn(c_int, *mut c_int, Vp, *mut Vp, *mut Vp),
                dev,
                &mut cfg,
                hp,
                sp,
                dp
            ),
            _ => call!(
                self,
                slot::CONNECT,
                fn(Vp, c_int, Vp, *mut Vp, *mut Vp),
                self.ctx,
                dev,
                hp,
                sp,
                dp
            ),
        })?;
        Ok((!s.is_null()).then_some(Obj(s)))
    }

    /// One `accept`; `None` while in progress.
    pub fn accept_step(&self, l: Obj) -> Res<Option<Obj>> {
        let l = l.0;
        let mut r: Vp = std::ptr::null_mut();
        let mut devh: Vp = std::ptr::null_mut();
        rc(if self.version == 6 {
            call!(self, slot::ACCEPT, fn(Vp, *mut Vp), l, &mut r)
        } else {
            call!(
                self,
                slot::ACCEPT,
                fn(Vp, *mut Vp, *mut Vp),
                l,
                &mut r,
                &mut devh
            )
        })?;
        Ok((!r.is_null()).then_some(Obj(r)))
    }

    /// listen, then connect and accept polled in turn (at most 1,000 rounds), then closeListen.
    pub fn connect_pair(&self, dev: i32) -> Res<(Obj, Obj)> {
        let (mut h, l) = self.listen(dev)?;
        let (mut s, mut r) = (None, None);
        for _ in 0..1000 {
            if s.is_none() {
                s = self.connect_step(dev, &mut h)?;
            }
            if r.is_none() {
                r = self.accept_step(l)?;
            }
            if s.is_some() && r.is_some() {
                break;
            }
        }
        self.close_listen(l)?;
        Ok((s.expect("connect finished"), r.expect("accept finished")))
    }

    /// `regMr`.
    ///
    /// # Safety
    /// A plugin may pin or map `data..data + size`: it must be valid memory.
    pub unsafe fn reg_mr(&self, comm: Obj, data: *const u8, size: usize, type_: i32) -> Res<Obj> {
        let comm = comm.0;
        let mut mh: Vp = std::ptr::null_mut();
        let d = data as Vp;
        rc(if self.version <= 7 {
            let n = size as c_int;
            call!(
                self,
                slot::REG_MR,
                fn(Vp, Vp, c_int, c_int, *mut Vp),
                comm,
                d,
                n,
                type_,
                &mut mh
            )
        } else {
            call!(
                self,
                slot::REG_MR,
                fn(Vp, Vp, usize, c_int, *mut Vp),
                comm,
                d,
                size,
                type_,
                &mut mh
            )
        })?;
        Ok(Obj(mh))
    }

    /// `regMrDmaBuf`.
    ///
    /// # Safety
    /// As [`reg_mr`](Self::reg_mr).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reg_mr_dmabuf(
        &self,
        comm: Obj,
        data: *const u8,
        size: usize,
        type_: i32,
        offset: u64,
        fd: i32,
    ) -> Res<Obj> {
        let comm = comm.0;
        let mut mh: Vp = std::ptr::null_mut();
        let d = data as Vp;
        rc(call!(
            self,
            slot::REG_MR_DMABUF,
            fn(Vp, Vp, usize, c_int, u64, c_int, *mut Vp),
            comm,
            d,
            size,
            type_,
            offset,
            fd,
            &mut mh
        ))?;
        Ok(Obj(mh))
    }

    pub fn dereg_mr(&self, comm: Obj, mh: Obj) -> Res<()> {
        let (comm, mh) = (comm.0, mh.0);
        rc(call!(self, slot::DEREG_MR, fn(Vp, Vp), comm, mh))
    }

    pub fn get_device_mr(&self, comm: Obj, mh: Obj) -> Res<Obj> {
        let (comm, mh) = (comm.0, mh.0);
        let mut d: Vp = 0x5 as Vp;
        rc(call!(
            self,
            slot::GET_DEVICE_MR,
            fn(Vp, Vp, *mut Vp),
            comm,
            mh,
            &mut d
        ))?;
        Ok(Obj(d))
    }

    /// `isend`; `Ok(NULL)` means "try again". `ph` reaches v10+ only.
    ///
    /// # Safety
    /// `data` must stay valid for `size` bytes until the request is reported done.
    pub unsafe fn isend(
        &self,
        comm: Obj,
        data: *const u8,
        size: usize,
        tag: i32,
        mh: Obj,
        ph: Obj,
    ) -> Res<Obj> {
        let (comm, mh, ph) = (comm.0, mh.0, ph.0);
        let mut req: Vp = std::ptr::null_mut();
        let d = data as Vp;
        let rq = &mut req as *mut Vp;
        rc(match self.version {
            6..=8 => {
                let n = size as c_int;
                call!(
                    self,
                    slot::ISEND,
                    fn(Vp, Vp, c_int, c_int, Vp, *mut Vp),
                    comm,
                    d,
                    n,
                    tag,
                    mh,
                    rq
                )
            }
            9 => call!(
                self,
                slot::ISEND,
                fn(Vp, Vp, usize, c_int, Vp, *mut Vp),
                comm,
                d,
                size,
                tag,
                mh,
                rq
            ),
            _ => call!(
                self,
                slot::ISEND,
                fn(Vp, Vp, usize, c_int, Vp, Vp, *mut Vp),
                comm,
                d,
                size,
                tag,
                mh,
                ph,
                rq
            ),
        })?;
        Ok(Obj(req))
    }

    /// `irecv` of `bufs.len()` buffers; `hint` pre-stores NCCL's 0x1 in `*request`;
    /// `phandles` false passes a NULL phandles array (v10+). `Ok(NULL)` means "try again".
    ///
    /// # Safety
    /// Every buffer must stay valid for its size until the request is reported done.
    pub unsafe fn irecv(
        &self,
        comm: Obj,
        bufs: &[RecvBuf],
        hint: bool,
        phandles: bool,
    ) -> Res<Obj> {
        let comm = comm.0;
        let n = bufs.len() as c_int;
        let mut req: Vp = if hint { 1 as Vp } else { std::ptr::null_mut() };
        let mut data: Vec<Vp> = bufs.iter().map(|b| b.data as Vp).collect();
        let mut isz: Vec<c_int> = bufs.iter().map(|b| b.size as c_int).collect();
        let mut usz: Vec<usize> = bufs.iter().map(|b| b.size).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag).collect();
        let mut mhs: Vec<Vp> = bufs.iter().map(|b| b.mh.0).collect();
        let mut phs: Vec<Vp> = bufs.iter().map(|b| b.ph.0).collect();
        let php = if phandles {
            phs.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        };
        let (dp, tp, mp, rq) = (
            data.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            &mut req as *mut Vp,
        );
        rc(match self.version {
            6..=8 => call!(
                self,
                slot::IRECV,
                fn(Vp, c_int, *mut Vp, *mut c_int, *mut c_int, *mut Vp, *mut Vp),
                comm,
                n,
                dp,
                isz.as_mut_ptr(),
                tp,
                mp,
                rq
            ),
            9 => call!(
                self,
                slot::IRECV,
                fn(Vp, c_int, *mut Vp, *mut usize, *mut c_int, *mut Vp, *mut Vp),
                comm,
                n,
                dp,
                usz.as_mut_ptr(),
                tp,
                mp,
                rq
            ),
            _ => call!(
                self,
                slot::IRECV,
                fn(Vp, c_int, *mut Vp, *mut usize, *mut c_int, *mut Vp, *mut Vp, *mut Vp),
                comm,
                n,
                dp,
                usz.as_mut_ptr(),
                tp,
                mp,
                php,
                rq
            ),
        })?;
        assert_ne!(req as usize, 1, "irecv left NCCL's 0x1 hint in *request");
        Ok(Obj(req))
    }

    /// `iflush` of buffers with their received sizes; `Ok(NULL)` means "nothing to wait for".
    ///
    /// # Safety
    /// A plugin may touch the buffers: they must be valid for their sizes.
    pub unsafe fn iflush(
        &self,
        comm: Obj,
        data: &[*mut u8],
        sizes: &[i32],
        mhs: &[Obj],
    ) -> Res<Obj> {
        let comm = comm.0;
        let mut req: Vp = std::ptr::null_mut();
        let mut d: Vec<Vp> = data.iter().map(|p| *p as Vp).collect();
        let mut s = sizes.to_vec();
        let mut m: Vec<Vp> = mhs.iter().map(|o| o.0).collect();
        let n = d.len() as c_int;
        rc(call!(
            self,
            slot::IFLUSH,
            fn(Vp, c_int, *mut Vp, *mut c_int, *mut Vp, *mut Vp),
            comm,
            n,
            d.as_mut_ptr(),
            s.as_mut_ptr(),
            m.as_mut_ptr(),
            &mut req
        ))?;
        Ok(Obj(req))
    }

    /// `test`; `Some(sizes)` when done. `nsizes == 0` passes `sizes = NULL`; otherwise NCCL's
    /// 64 zeroed ints are passed and the first `nsizes` come back.
    pub fn test(&self, req: Obj, nsizes: usize) -> Res<Option<Vec<i32>>> {
        let req = req.0;
        let mut done: c_int = 0;
        let mut sizes = [0 as c_int; 64];
        let sp = if nsizes == 0 {
            std::ptr::null_mut()
        } else {
            sizes.as_mut_ptr()
        };
        rc(call!(
            self,
            slot::TEST,
            fn(Vp, *mut c_int, *mut c_int),
            req,
            &mut done,
            sp
        ))?;
        Ok((done == 1).then(|| sizes[..nsizes].to_vec()))
    }

    /// Tests until done (at most `polls` calls); `None` if still not done.
    pub fn wait(&self, req: Obj, nsizes: usize, polls: usize) -> Res<Option<Vec<i32>>> {
        for _ in 0..polls {
            if let Some(s) = self.test(req, nsizes)? {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    pub fn irecv_consumed(&self, comm: Obj, n: i32, req: Obj) -> Res<()> {
        let (comm, req) = (comm.0, req.0);
        rc(call!(
            self,
            slot::IRECV_CONSUMED,
            fn(Vp, c_int, Vp),
            comm,
            n,
            req
        ))
    }

    pub fn close_send(&self, c: Obj) -> Res<()> {
        rc(call!(self, slot::CLOSE_SEND, fn(Vp), c.0))
    }
    pub fn close_recv(&self, c: Obj) -> Res<()> {
        rc(call!(self, slot::CLOSE_RECV, fn(Vp), c.0))
    }
    pub fn close_listen(&self, c: Obj) -> Res<()> {
        rc(call!(self, slot::CLOSE_LISTEN, fn(Vp), c.0))
    }
}
