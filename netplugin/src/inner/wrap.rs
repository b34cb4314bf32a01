//! The data path over an inner plugin: each call forwarded with its arguments intact, each
//! operation observed by the connection's [`ConnHooks`] (the same per-connection record and
//! `net/*` programs as over our own sockets).
//!
//! NCCL's requests are the wrapper's: a request is a slot in a fixed array of its connection
//! (64 slots; NCCL keeps at most 32 requests in flight per connection), which holds the inner
//! plugin's request and what the completion needs (sizes posted, when). Nothing is allocated
//! per operation. A connection's state is guarded by one flag that NCCL's one-thread-per-
//! connection use never contends: taking it is one atomic exchange, never a wait in the
//! kernel.
//!
//! What the hooks' context holds over an inner plugin: `comm_id`, `dev`, `bytes`,
//! `latency_ns`, `status`, and, where the connection has a side channel ([`super::side`]),
//! the id both ends share and the side channel's ports; without one, each end's own id and
//! port 0. `nstreams` is 0: the inner plugin's streams are its own.

use super::table::MAX_RECVS;
use super::{Ctx, Inner, check, side};
use crate::comm::Comm;
use crate::error::{NetError, NetResult};
use crate::ffi::{handle_buf, put};
use crate::hooks::{ConnHooks, ConnInfo, Ends};
use crate::setup::{self, Endpoint, ListenComm};
use crate::wire::{HANDLE_SIZE, Handle};
use ncclnet_headers::net::{NET_OPTIONAL_RECV_COMPLETION, NetDeviceHandle, PtrType};
use shared_maps::ConnDirection;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

type Vp = *mut c_void;

/// Request slots per connection.
pub const SLOTS: usize = 64;
/// Posted sizes kept per request, for a plugin that reports none in `test`.
const KEPT_SIZES: usize = 8;
const COMM_MAGIC: u64 = 0x6e63_636c_6270_6677; // "ncclbpfw"
const LISTEN_MAGIC: u64 = 0x6e63_636c_6270_666c; // "ncclbpfl"
const REQ_MAGIC: u64 = 0x6e63_636c_6270_6672; // "ncclbpfr"

/// A listening end: the inner plugin's, and what connections accepted from it are labelled.
pub struct WrapListen {
    magic: u64,
    inner: Vp,
    dev: u32,
    comm_id: u64,
    /// The side channel's listener, when the handle had room for it.
    side: Option<Box<ListenComm>>,
    /// The inner plugin's accepted connection, waiting for its side channel.
    got_inner: Vp,
    got_side: Option<Box<Comm>>,
    inner_done_at: Option<Instant>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Free,
    Send,
    Recv,
    Flush,
    /// A receive `test` reported done, whose request NCCL will still name in `irecvConsumed`
    /// (an inner plugin with that slot): reused only when no slot is free.
    Consumable,
}

struct ReqState {
    kind: Kind,
    /// The inner plugin's request (kept after completion for `irecvConsumed`).
    inner: Vp,
    n: c_int,
    sizes: [usize; KEPT_SIZES],
    total: usize,
    posted: Option<Instant>,
}

/// A request NCCL holds: a slot of its connection.
pub struct Req {
    magic: u64,
    comm: *const WrapComm,
    st: UnsafeCell<ReqState>,
}

struct CommState {
    hooks: ConnHooks,
    /// Where the search for a free slot starts (round robin: a slot freed is reused last,
    /// which leaves `irecvConsumed` its inner request for as long as possible).
    next: usize,
    full_warned: bool,
}

/// A send or receive connection end.
pub struct WrapComm {
    magic: u64,
    inner: Vp,
    /// The side channel (agreement records; the id and addresses above).
    side: Option<Box<Comm>>,
    direction: ConnDirection,
    owner: AtomicBool,
    st: UnsafeCell<CommState>,
    reqs: Box<[Req]>,
}

// SAFETY: the inner plugin's pointers go to whichever thread NCCL calls from, as they do
// without the wrapper; the mutable state is reached only while holding `owner`.
unsafe impl Send for WrapComm {}
// SAFETY: as above.
unsafe impl Sync for WrapComm {}

/// Exclusive access to a connection's state while alive.
struct Turn<'a>(&'a AtomicBool);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(0);

/// A connection id: random per process, then counted.
fn conn_id() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let mut b = [0u8; 8];
        if crate::handshake::fill_random(&mut b).is_err() {
            b = (std::process::id() as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .to_le_bytes();
        }
        u64::from_le_bytes(b)
    });
    base.wrapping_add(NEXT_CONN.fetch_add(1, Ordering::Relaxed))
}

impl WrapComm {
    fn new(
        inner: Vp,
        direction: ConnDirection,
        dev: u32,
        comm_id: u64,
        side: Option<Box<Comm>>,
    ) -> Box<WrapComm> {
        let (id, peer_port, ends) = match &side {
            Some(s) => (s.conn_id, s.peer_port, s.ends),
            None => (conn_id(), 0, Ends::default()),
        };
        let hooks = ConnHooks::on_open_at(
            ConnInfo {
                direction,
                conn_id: id,
                peer_port,
                dev,
                comm_id,
                nstreams: 0,
            },
            ends,
        );
        let mut c = Box::new(WrapComm {
            magic: COMM_MAGIC,
            inner,
            side,
            direction,
            owner: AtomicBool::new(false),
            st: UnsafeCell::new(CommState {
                hooks,
                next: 0,
                full_warned: false,
            }),
            reqs: Box::new([]),
        });
        let me: *const WrapComm = &*c;
        c.reqs = (0..SLOTS)
            .map(|_| Req {
                magic: REQ_MAGIC,
                comm: me,
                st: UnsafeCell::new(ReqState {
                    kind: Kind::Free,
                    inner: std::ptr::null_mut(),
                    n: 0,
                    sizes: [0; KEPT_SIZES],
                    total: 0,
                    posted: None,
                }),
            })
            .collect();
        c
    }

    fn turn(&self) -> Turn<'_> {
        while self
            .owner
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        Turn(&self.owner)
    }

    /// The state, for the holder of a [`Turn`].
    #[allow(clippy::mut_from_ref)]
    fn state(&self, _t: &Turn<'_>) -> &mut CommState {
        // SAFETY: `_t` proves this thread holds `owner`, so no other reference exists.
        unsafe { &mut *self.st.get() }
    }

    /// A free slot, or `None` when every slot is in use. A completed receive that awaits its
    /// `irecvConsumed` is taken only when no slot is free (the oldest first), so that NCCL's
    /// late `irecvConsumed` still finds its own request, and a caller that never sends one
    /// cannot run out of slots.
    fn take(&self, t: &Turn<'_>) -> Option<usize> {
        let st = self.state(t);
        for want in [Kind::Free, Kind::Consumable] {
            for k in 0..SLOTS {
                let i = (st.next + k) % SLOTS;
                // SAFETY: slots are reached only under the turn `t`.
                let r = unsafe { &*self.reqs[i].st.get() };
                if r.kind == want {
                    st.next = (i + 1) % SLOTS;
                    return Some(i);
                }
            }
        }
        if !st.full_warned {
            st.full_warned = true;
            crate::nlog!(
                WARN,
                NET,
                "a connection has {SLOTS} requests in flight: later posts wait (NCCL allows 32)"
            );
        }
        None
    }

    /// Slot `idx` now holds the inner plugin's request `inner`: records it (with the post time
    /// when a completion program reads latencies) and runs the post hook (not for a flush).
    /// Returns the request NCCL holds.
    #[allow(clippy::too_many_arguments)]
    fn posted(
        &self,
        t: &Turn<'_>,
        idx: usize,
        kind: Kind,
        inner: Vp,
        n: c_int,
        sizes: [usize; KEPT_SIZES],
        total: usize,
    ) -> Vp {
        let st = self.state(t);
        let posted = (kind != Kind::Flush && st.hooks.wants_time()).then(Instant::now);
        *self.slot(t, idx) = ReqState {
            kind,
            inner,
            n,
            sizes,
            total,
            posted,
        };
        if kind != Kind::Flush {
            st.hooks.on_post(total);
        }
        &self.reqs[idx] as *const Req as Vp
    }

    #[allow(clippy::mut_from_ref)]
    fn slot(&self, _t: &Turn<'_>, i: usize) -> &mut ReqState {
        // SAFETY: slots are reached only under the turn `_t`.
        unsafe { &mut *self.reqs[i].st.get() }
    }
}

fn comm_ref<'a>(comm: Vp) -> NetResult<&'a WrapComm> {
    if comm.is_null() {
        return Err(NetError::Misuse("NULL comm".into()));
    }
    // SAFETY: comms handed to NCCL by this module are Box<WrapComm>, live until closed; the
    // magic catches a pointer that is not one.
    let c = unsafe { &*(comm as *const WrapComm) };
    if c.magic != COMM_MAGIC {
        return Err(NetError::Misuse("not a connection of this plugin".into()));
    }
    Ok(c)
}

/// Seconds a side channel may lag its inner connection: `NCCL_BPF_HANDSHAKE_TIMEOUT`.
fn side_wait_s() -> u64 {
    u64::from(
        crate::plugin::get()
            .map_or(10, |p| p.config.handshake_timeout_s)
            .max(1),
    )
}

fn side_endpoint(dev: u32, comm_id: u64) -> Endpoint {
    Endpoint {
        dev,
        comm_id,
        quiet: true,
    }
}

/// Says once per process that a handle had no room for a side channel.
fn no_room(i: &Inner) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        crate::nlog!(
            INFO,
            NET,
            "the handles of inner net plugin '{}' leave no room for a side channel (see \
             docs/guide/interposer.md): its connections carry no agreement records (the agreement \
             runs on the node-local relay only) and each end has its own connection id",
            i.name
        )
    });
}

/// The side channel's listener for a handle the inner plugin just filled, with its trailer
/// written, if the handle has room.
fn side_listen(
    i: &Inner,
    bind: std::net::SocketAddr,
    h: &mut [u8; HANDLE_SIZE],
    dev: u32,
    comm_id: u64,
) -> Option<Box<ListenComm>> {
    let Some(held) = side::room(h, side::len(&bind)) else {
        no_room(i);
        return None;
    };
    let mut ours = [0u8; HANDLE_SIZE];
    let l = side::fresh_secret()
        .map_err(|e| NetError::io("getrandom (side channel secret)", e))
        .and_then(|(seed, secret)| {
            let l = setup::listen_with(
                side_endpoint(dev, comm_id),
                bind,
                side::SHAPE,
                secret,
                &mut ours,
            )?;
            Ok((l, seed, Handle::decode(&ours)?))
        });
    match l {
        Ok((l, seed, theirs)) => {
            side::write(h, &theirs, &seed, held);
            Some(l)
        }
        Err(e) => {
            crate::nlog!(WARN, NET, "side channel: {e}; this connection carries none");
            None
        }
    }
}

/// `listen`: the inner plugin writes its handle into NCCL's; the side channel's trailer goes
/// in the tail if the inner plugin left it free.
pub(crate) fn listen(i: &Inner, ctx: &Ctx, dev: c_int, handle: Vp, lc: *mut Vp) -> NetResult<()> {
    put(lc, std::ptr::null_mut(), "listenComm")?;
    let h = handle_buf(handle)?;
    let bind = i.side_bind_for(dev);
    if bind.is_some() {
        side::prepare(h);
    }
    let mut inner: Vp = std::ptr::null_mut();
    // SAFETY: NCCL's handle and out-pointer, passed on; `ctx.inner` is the plugin's own.
    check("listen", unsafe {
        i.table.listen(ctx.inner, dev, handle, &mut inner)
    })?;
    if !inner.is_null() {
        let dev = dev.max(0) as u32;
        let side = bind.and_then(|bind| side_listen(i, bind, h, dev, ctx.comm_id));
        let l = Box::new(WrapListen {
            magic: LISTEN_MAGIC,
            inner,
            dev,
            comm_id: ctx.comm_id,
            side,
            got_inner: std::ptr::null_mut(),
            got_side: None,
            inner_done_at: None,
        });
        put(lc, Box::into_raw(l) as Vp, "listenComm")?;
    }
    Ok(())
}

/// A connect in progress: the inner plugin's connection and the side channel's, each done or
/// not yet. Keyed by NCCL's handle buffer, which NCCL passes again on every retry, and told
/// apart from another connection whose handle NCCL later puts at the same address (the first
/// connect given up: a communicator aborted) by what the buffer holds.
struct PendingConnect {
    inner: Vp,
    /// The side channel's handle (our socket transport's format), while it is to be made.
    side: Option<Box<[u8; HANDLE_SIZE]>>,
    side_comm: Option<Box<Comm>>,
    started: Instant,
    inner_done_at: Option<Instant>,
    /// The handle buffer as the last call left it (the inner plugin may keep its connect
    /// state there): a retry passes exactly these bytes again.
    left: [u8; HANDLE_SIZE],
}

// SAFETY: the inner plugin's comm pointer goes to whichever thread NCCL calls connect from.
unsafe impl Send for PendingConnect {}

impl PendingConnect {
    /// A connect NCCL gave up on: what it made is closed (nobody else ever will).
    fn abandon(self, i: &Inner) {
        if !self.inner.is_null() {
            // SAFETY: the inner plugin's send comm from its connect, never handed to NCCL.
            let _ = unsafe { i.table.close_send(self.inner) };
        }
        if let Some(s) = self.side_comm {
            s.close();
        }
    }
}

static PENDING: Mutex<Option<HashMap<usize, PendingConnect>>> = Mutex::new(None);

/// The connect in progress on the buffer `h` at `key`, if this call is its retry.
fn pending_take(i: &Inner, key: usize, h: &[u8; HANDLE_SIZE]) -> Option<PendingConnect> {
    let (mine, stale) = {
        let mut g = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        let m = g.get_or_insert_with(HashMap::new);
        // Connects NCCL gave up on are forgotten after a while.
        let old: Vec<usize> = m
            .iter()
            .filter(|(_, p)| p.started.elapsed() >= setup::CONNECT_TIMEOUT * 2)
            .map(|(k, _)| *k)
            .collect();
        let stale: Vec<PendingConnect> = old.iter().filter_map(|k| m.remove(k)).collect();
        (m.remove(&key), stale)
    };
    for p in stale {
        p.abandon(i);
    }
    match mine {
        Some(p) if p.left == *h => Some(p),
        Some(p) => {
            // Another connection's handle at the address of one NCCL gave up on.
            p.abandon(i);
            None
        }
        None => None,
    }
}

fn pending_put(key: usize, p: PendingConnect) {
    let mut g = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(HashMap::new).insert(key, p);
}

/// `connect`: "in progress" (NULL) until the inner plugin's connection and its side channel
/// (if the handle offers one) are both up.
pub(crate) fn connect(
    i: &Inner,
    ctx: &Ctx,
    dev: c_int,
    handle: Vp,
    sc: *mut Vp,
    dh: *mut *mut NetDeviceHandle,
) -> NetResult<()> {
    put(sc, std::ptr::null_mut(), "sendComm")?;
    let h = handle_buf(handle)?;
    let key = handle as usize;
    let udev = dev.max(0) as u32;
    let mut p = pending_take(i, key, h).unwrap_or_else(|| {
        // First call for this handle: the trailer comes out (always, so that the inner
        // plugin sees its own handle), and is used if side channels are on here.
        let theirs = side::take(h).filter(|_| i.sides());
        PendingConnect {
            inner: std::ptr::null_mut(),
            side: theirs.map(|t| {
                let mut b = Box::new([0u8; HANDLE_SIZE]);
                t.encode(&mut b);
                b
            }),
            side_comm: None,
            started: Instant::now(),
            inner_done_at: None,
            left: [0; HANDLE_SIZE],
        }
    });
    if p.inner.is_null() {
        let mut config = ctx.config;
        // SAFETY: NCCL's handle and device-handle out-pointer, passed on.
        check("connect", unsafe {
            i.table
                .connect(ctx.inner, &mut config, dev, handle, &mut p.inner, dh)
        })?;
    }
    if let Some(b) = p.side.as_mut()
        && p.side_comm.is_none()
    {
        match setup::connect(side_endpoint(udev, ctx.comm_id), b) {
            Ok(c) => p.side_comm = c,
            Err(e) => {
                crate::nlog!(
                    WARN,
                    NET,
                    "side channel: {e}; this connection carries no agreement records"
                );
                p.side = None;
            }
        }
    }
    if !p.inner.is_null() && p.side.is_some() && p.side_comm.is_none() {
        // The inner connection is up: the side channel gets the handshake timeout, no more
        // (the listening end gives up on it as soon).
        let since = *p.inner_done_at.get_or_insert_with(Instant::now);
        let wait = side_wait_s();
        if since.elapsed().as_secs() >= wait {
            crate::nlog!(
                WARN,
                NET,
                "side channel: not connected {wait} s after the inner connection: this \
                 connection carries no agreement records"
            );
            p.side = None;
        }
    }
    if p.inner.is_null() || (p.side.is_some() && p.side_comm.is_none()) {
        p.left = *handle_buf(handle)?;
        pending_put(key, p);
        return Ok(());
    }
    let c = WrapComm::new(p.inner, ConnDirection::Send, udev, ctx.comm_id, p.side_comm);
    put(sc, Box::into_raw(c) as Vp, "sendComm")
}

/// `accept`: done once the inner plugin's connection and its side channel (if one was
/// offered) are both in; a side channel that does not come within the handshake timeout
/// (`NCCL_BPF_HANDSHAKE_TIMEOUT`) after the inner connection is given up.
pub(crate) fn accept(
    i: &Inner,
    lc: Vp,
    rc: *mut Vp,
    dh: *mut *mut NetDeviceHandle,
) -> NetResult<()> {
    put(rc, std::ptr::null_mut(), "recvComm")?;
    let l = listen_ref(lc)?;
    if l.got_inner.is_null() {
        // SAFETY: the inner listen comm and NCCL's device-handle out-pointer.
        check("accept", unsafe {
            i.table.accept(l.inner, &mut l.got_inner, dh)
        })?;
    }
    if let Some(s) = l.side.as_mut()
        && l.got_side.is_none()
    {
        match s.accept() {
            Ok(c) => l.got_side = c,
            Err(e) => {
                crate::nlog!(
                    WARN,
                    NET,
                    "side channel: {e}; this connection carries no agreement records"
                );
                l.side = None;
            }
        }
    }
    if l.got_inner.is_null() {
        return Ok(());
    }
    if l.side.is_some() && l.got_side.is_none() {
        let since = *l.inner_done_at.get_or_insert_with(Instant::now);
        let wait = side_wait_s();
        if since.elapsed().as_secs() < wait {
            return Ok(());
        }
        crate::nlog!(
            WARN,
            NET,
            "side channel: the connecting end opened none within {wait} s (side channels off \
             there, NCCL_BPF_NET_SIDE=0, or no route): this connection carries no agreement \
             records"
        );
        l.side = None;
    }
    let inner = std::mem::replace(&mut l.got_inner, std::ptr::null_mut());
    let c = WrapComm::new(
        inner,
        ConnDirection::Recv,
        l.dev,
        l.comm_id,
        l.got_side.take(),
    );
    put(rc, Box::into_raw(c) as Vp, "recvComm")
}

fn listen_ref<'a>(lc: Vp) -> NetResult<&'a mut WrapListen> {
    if lc.is_null() {
        return Err(NetError::Misuse("NULL listenComm".into()));
    }
    // SAFETY: listen comms handed out here are Box<WrapListen>, used by one thread at a time
    // (NCCL's accept); the magic checks it.
    let l = unsafe { &mut *(lc as *mut WrapListen) };
    if l.magic != LISTEN_MAGIC {
        return Err(NetError::Misuse("not a listen comm of this plugin".into()));
    }
    Ok(l)
}

/// `regMr`: the memory handle is the inner plugin's (GPU memory included).
pub(crate) fn reg_mr(
    i: &Inner,
    comm: Vp,
    data: Vp,
    size: usize,
    ty: c_int,
    mh: *mut Vp,
) -> NetResult<()> {
    let c = comm_ref(comm)?;
    // SAFETY: NCCL's arguments, passed on with the inner comm.
    check("regMr", unsafe {
        i.table.reg_mr(c.inner, data, size, ty, mh)
    })
}

/// `regMrDmaBuf`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reg_mr_dma_buf(
    i: &Inner,
    comm: Vp,
    data: Vp,
    size: usize,
    ty: c_int,
    offset: u64,
    fd: c_int,
    mh: *mut Vp,
) -> NetResult<()> {
    let c = comm_ref(comm)?;
    // SAFETY: NCCL's arguments, passed on with the inner comm.
    check("regMrDmaBuf", unsafe {
        i.table
            .reg_mr_dma_buf(c.inner, data, size, ty, offset, fd, mh)
    })
}

/// `deregMr`.
pub(crate) fn dereg_mr(i: &Inner, comm: Vp, mh: Vp) -> NetResult<()> {
    let c = comm_ref(comm)?;
    // SAFETY: the inner comm and the inner plugin's own memory handle.
    check("deregMr", unsafe { i.table.dereg_mr(c.inner, mh) })
}

/// `getDeviceMr`.
pub(crate) fn get_device_mr(i: &Inner, comm: Vp, mh: Vp, dptr: *mut Vp) -> NetResult<()> {
    let c = comm_ref(comm)?;
    // SAFETY: as NCCL calls it, with the inner comm.
    check("getDeviceMr", unsafe {
        i.table.get_device_mr(c.inner, mh, dptr)
    })
}

/// `isend`. `Ok` with `*request` NULL: try again later (no slot, or the inner plugin said so).
#[allow(clippy::too_many_arguments)]
pub(crate) fn isend(
    i: &Inner,
    comm: Vp,
    data: Vp,
    size: usize,
    tag: c_int,
    mh: Vp,
    phandle: Vp,
    request: *mut Vp,
) -> NetResult<()> {
    put(request, std::ptr::null_mut(), "request")?;
    let c = comm_ref(comm)?;
    let t = c.turn();
    let Some(idx) = c.take(&t) else {
        return Ok(());
    };
    let mut inner: Vp = std::ptr::null_mut();
    // SAFETY: NCCL's arguments, passed on with the inner comm.
    let r = unsafe {
        i.table
            .isend(c.inner, data, size, tag, mh, phandle, &mut inner)
    };
    check("isend", r)?;
    if inner.is_null() {
        return Ok(());
    }
    let mut sizes = [0; KEPT_SIZES];
    sizes[0] = size;
    let req = c.posted(&t, idx, Kind::Send, inner, 1, sizes, size);
    put(request, req, "request")
}

/// `irecv`, `n` buffers at once. NCCL's optional-completion hint (`*request == 0x1`) reaches
/// the inner plugin; any other value NCCL left there is one of our old requests, meaningless
/// to it, and it gets NULL.
#[allow(clippy::too_many_arguments)]
pub(crate) fn irecv(
    i: &Inner,
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: *mut Vp,
    phandles: *mut Vp,
    request: *mut Vp,
) -> NetResult<()> {
    if request.is_null() {
        return Err(NetError::Misuse("NULL request pointer".into()));
    }
    // SAFETY: a non-null request pointer from NCCL: read what it left there.
    let hint = unsafe { *request } as usize == NET_OPTIONAL_RECV_COMPLETION;
    put(request, std::ptr::null_mut(), "request")?;
    let c = comm_ref(comm)?;
    if n < 1 || n as usize > MAX_RECVS {
        return Err(NetError::InvalidArgument(format!(
            "irecv of {n} buffers (1 to {MAX_RECVS})"
        )));
    }
    let t = c.turn();
    let Some(idx) = c.take(&t) else {
        return Ok(());
    };
    let mut kept = [0usize; KEPT_SIZES];
    let mut total = 0usize;
    if !sizes.is_null() {
        // SAFETY: NCCL's sizes array holds n entries.
        let all = unsafe { std::slice::from_raw_parts(sizes, n as usize) };
        for (k, &s) in all.iter().enumerate() {
            total = total.saturating_add(s);
            if let Some(slot) = kept.get_mut(k) {
                *slot = s;
            }
        }
    }
    let mut inner: Vp = if hint {
        NET_OPTIONAL_RECV_COMPLETION as Vp
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: NCCL's arrays of n entries, passed on with the inner comm.
    let r = unsafe {
        i.table
            .irecv(c.inner, n, data, sizes, tags, mhs, phandles, &mut inner)
    };
    check("irecv", r)?;
    if inner.is_null() {
        return Ok(());
    }
    let req = c.posted(&t, idx, Kind::Recv, inner, n, kept, total);
    put(request, req, "request")
}

/// `iflush`: a request of its own kind, tested like the others, counted nowhere.
pub(crate) fn iflush(
    i: &Inner,
    comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut c_int,
    mhs: *mut Vp,
    request: *mut Vp,
) -> NetResult<()> {
    put(request, std::ptr::null_mut(), "request")?;
    let c = comm_ref(comm)?;
    let t = c.turn();
    let Some(idx) = c.take(&t) else {
        return Ok(());
    };
    let mut inner: Vp = std::ptr::null_mut();
    // SAFETY: NCCL's arrays, passed on with the inner comm.
    check("iflush", unsafe {
        i.table.iflush(c.inner, n, data, sizes, mhs, &mut inner)
    })?;
    if inner.is_null() {
        return Ok(());
    }
    let req = c.posted(&t, idx, Kind::Flush, inner, 1, [0; KEPT_SIZES], 0);
    put(request, req, "request")
}

fn req_ref<'a>(request: Vp) -> NetResult<(&'a Req, &'a WrapComm, usize)> {
    if request.is_null() {
        return Err(NetError::Misuse("NULL request".into()));
    }
    // SAFETY: requests handed to NCCL are slots of live comms; the magic catches others.
    let r = unsafe { &*(request as *const Req) };
    if r.magic != REQ_MAGIC {
        return Err(NetError::Misuse("not a request of this plugin".into()));
    }
    // SAFETY: a slot's comm outlives it (the slots are the comm's own array).
    let c = unsafe { &*r.comm };
    // SAFETY: `r` is an element of `c.reqs`.
    let idx = unsafe { (r as *const Req).offset_from(c.reqs.as_ptr()) } as usize;
    Ok((r, c, idx))
}

/// `test`: the inner plugin's answer, counted. A plugin that leaves `sizes` unwritten gets
/// what was posted reported for it (NCCL then reads the posted size, as it would from a
/// plugin that fills it).
pub(crate) fn test(i: &Inner, request: Vp, done: *mut c_int, sizes: *mut c_int) -> NetResult<()> {
    let (_, c, idx) = req_ref(request)?;
    let t = c.turn();
    let s = c.slot(&t, idx);
    if matches!(s.kind, Kind::Free | Kind::Consumable) {
        return Err(NetError::Misuse(
            "test() on a request that already completed".into(),
        ));
    }
    let n = if s.kind == Kind::Recv {
        (s.n.max(1) as usize).min(MAX_RECVS)
    } else {
        1
    };
    // The sizes the inner plugin writes (n entries; -1: left unwritten). Most requests have
    // one buffer and `test` is polled: only a receive of more than 8 buffers pays for 64.
    let mut small = [-1 as c_int; KEPT_SIZES];
    let mut large;
    let got: &mut [c_int] = if n <= KEPT_SIZES {
        &mut small
    } else {
        large = [-1 as c_int; MAX_RECVS];
        &mut large
    };
    let mut d: c_int = 0;
    // SAFETY: the inner request, our own out-values (n entries for sizes).
    let r = unsafe { i.table.test(s.inner, &mut d, got.as_mut_ptr()) };
    if !r.is_success() {
        let kind = s.kind;
        s.kind = Kind::Free;
        if kind != Kind::Flush {
            c.state(&t).hooks.on_error(r.0);
        }
        return Err(NetError::Inner {
            op: "test",
            code: r,
        });
    }
    if d == 0 {
        return put(done, 0, "done");
    }
    let mut bytes = 0usize;
    for (k, g) in got.iter_mut().enumerate().take(n) {
        if *g < 0 {
            let posted = if n == 1 {
                s.total
            } else {
                s.sizes.get(k).copied().unwrap_or(0)
            };
            *g = posted.min(c_int::MAX as usize) as c_int;
        }
        bytes += *g as usize;
    }
    let (kind, posted) = (s.kind, s.posted);
    s.kind = if kind == Kind::Recv && i.table.has_irecv_consumed() {
        Kind::Consumable
    } else {
        Kind::Free
    };
    if kind != Kind::Flush {
        c.state(&t).hooks.on_complete(bytes, posted);
    }
    if !sizes.is_null() {
        // SAFETY: NCCL's sizes array holds an entry per buffer of the request.
        unsafe { std::ptr::copy_nonoverlapping(got.as_ptr(), sizes, n) };
    }
    put(done, 1, "done")
}

/// `irecvConsumed`: the inner plugin's request of a completed receive.
pub(crate) fn irecv_consumed(i: &Inner, comm: Vp, n: c_int, request: Vp) -> NetResult<()> {
    let c = comm_ref(comm)?;
    let (_, rc, idx) = req_ref(request)?;
    if !std::ptr::eq(c, rc) {
        return Err(NetError::Misuse(
            "irecvConsumed with a request of another connection".into(),
        ));
    }
    let t = c.turn();
    let s = c.slot(&t, idx);
    if s.kind != Kind::Consumable {
        // Not a completed receive any more: its slot went to a later request (more than
        // 64 requests since); that request is not the inner plugin's to consume.
        return Err(NetError::Misuse(
            "irecvConsumed of a request that is not a completed receive (its slot was reused)"
                .into(),
        ));
    }
    s.kind = Kind::Free;
    // SAFETY: the inner comm and the inner request this slot carried.
    check("irecvConsumed", unsafe {
        i.table.irecv_consumed(c.inner, n, s.inner)
    })
}

/// `closeSend`/`closeRecv`: the close hook, then the inner plugin's close.
pub(crate) fn close(i: &Inner, comm: Vp) -> NetResult<()> {
    if comm.is_null() {
        return Ok(());
    }
    let c = comm_ref(comm)?;
    let r = {
        let t = c.turn();
        c.state(&t).hooks.on_close();
        // SAFETY: the inner comm, closed once as NCCL closes ours once.
        unsafe {
            match c.direction {
                ConnDirection::Send => i.table.close_send(c.inner),
                ConnDirection::Recv => i.table.close_recv(c.inner),
            }
        }
    };
    // SAFETY: NCCL closes each comm we created exactly once; nothing holds it now.
    let mut c = unsafe { Box::from_raw(comm as *mut WrapComm) };
    if let Some(s) = c.side.take() {
        s.close();
    }
    drop(c);
    check("close", r)
}

/// `closeListen`.
pub(crate) fn close_listen(i: &Inner, lc: Vp) -> NetResult<()> {
    if lc.is_null() {
        return Ok(());
    }
    let l = listen_ref(lc)?;
    // An accept NCCL gave up on halfway (the inner plugin's connection in, its side channel
    // not yet): nobody else will ever close that connection.
    let half = std::mem::replace(&mut l.got_inner, std::ptr::null_mut());
    if !half.is_null() {
        // SAFETY: the inner plugin's recv comm from its accept, never handed to NCCL.
        let _ = unsafe { i.table.close_recv(half) };
    }
    if let Some(s) = l.got_side.take() {
        s.close();
    }
    // SAFETY: the inner listen comm, closed once.
    let r = unsafe { i.table.close_listen(l.inner) };
    // SAFETY: NCCL closes each listen comm we created exactly once.
    drop(unsafe { Box::from_raw(lc as *mut WrapListen) });
    check("closeListen", r)
}

/// `ptrSupport` as offered to NCCL: DMA-BUF only where the inner plugin can register it.
pub(crate) fn ptr_support(i: &Inner, raw: c_int) -> c_int {
    if i.table.has_reg_mr_dma_buf() {
        raw
    } else {
        raw & !PtrType::DMABUF.0
    }
}
