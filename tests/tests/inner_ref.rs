//! The reference inner plugin (tests/csrc/inner_ref.c) loaded directly, as NCCL would load it:
//! it moves data on every ABI version, matches multi-receives by tag, every injected failure
//! shows, and every class of violation it promises to catch is caught exactly once.

use ncclbpf_harness::anynet::{AnyNet, Obj, RecvBuf};
use ncclbpf_harness::inner_ref::{REF_VERSIONS, RefChecks, path, serial};
use ncclbpf_harness::pattern;
use ncclnet_headers::net::NetAttr;
use std::sync::{Mutex, MutexGuard};

const NULL: Obj = Obj::NULL;
const BUF: usize = 1 << 16;

/// Locks the plugins' global state, resets variant `v` and opens/inits its table.
fn setup(v: u32) -> (MutexGuard<'static, ()>, RefChecks, AnyNet) {
    let g = serial();
    let chk = RefChecks::open(v).unwrap();
    chk.reset();
    let mut net = AnyNet::open(&path(v), v).unwrap();
    net.init(0x1000 + v as u64, None).unwrap();
    (g, chk, net)
}

/// A connected pair with one registered 64 KiB buffer on each side.
struct Conn {
    s: Obj,
    r: Obj,
    sbuf: Box<[u8]>,
    rbuf: Box<[u8]>,
    smh: Obj,
    rmh: Obj,
}

fn conn(net: &AnyNet) -> Conn {
    let (s, r) = net.connect_pair(0).unwrap();
    let sbuf = pattern(BUF, s.0 as u64).into_boxed_slice();
    let rbuf = vec![0u8; BUF].into_boxed_slice();
    // SAFETY: the buffers move into Conn with their registrations.
    let smh = unsafe { net.reg_mr(s, sbuf.as_ptr(), BUF, 1) }.unwrap();
    // SAFETY: as above: what the call reads and writes outlives it.
    let rmh = unsafe { net.reg_mr(r, rbuf.as_ptr(), BUF, 1) }.unwrap();
    Conn {
        s,
        r,
        sbuf,
        rbuf,
        smh,
        rmh,
    }
}

impl Conn {
    fn send(&self, net: &AnyNet, off: usize, len: usize, tag: i32) -> Obj {
        assert!(off + len <= BUF);
        // SAFETY: the buffer lives in self, past every request the tests wait for.
        unsafe { net.isend(self.s, self.sbuf[off..].as_ptr(), len, tag, self.smh, NULL) }.unwrap()
    }
    fn buf(&mut self, off: usize, len: usize, tag: i32) -> RecvBuf {
        assert!(off + len <= BUF);
        RecvBuf {
            data: self.rbuf[off..].as_mut_ptr(),
            size: len,
            tag,
            mh: self.rmh,
            ph: NULL,
        }
    }
    fn recv(&mut self, net: &AnyNet, off: usize, len: usize, tag: i32) -> Obj {
        let b = self.buf(off, len, tag);
        // SAFETY: as in send.
        unsafe { net.irecv(self.r, &[b], false, true) }.unwrap()
    }
    fn close(self, net: &AnyNet) {
        net.dereg_mr(self.s, self.smh).unwrap();
        net.dereg_mr(self.r, self.rmh).unwrap();
        net.close_send(self.s).unwrap();
        net.close_recv(self.r).unwrap();
    }
}

/// Live objects of each kind (other tests may leave some on a shared variant: compare).
fn live_all(chk: &RefChecks) -> [i32; 6] {
    ["ctx", "listen", "send", "recv", "mr", "req"].map(|k| chk.live(k))
}

fn no_violations(chk: &RefChecks) {
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
}

/// Exactly one violation, whose text contains `what`; then a clean slate.
fn one_violation(chk: &RefChecks, what: &str) {
    let t = chk.violation_text();
    assert_eq!(
        chk.violations(),
        1,
        "expected one violation about {what:?}, got:\n{t}"
    );
    assert!(t.contains(what), "expected {what:?} in:\n{t}");
    chk.reset();
}

#[test]
fn each_variant_exports_only_its_version() {
    for v in REF_VERSIONS {
        let lib = ncclbpf_harness::anynet::dlopen_local(&path(v)).unwrap();
        for w in 2..=13 {
            // SAFETY: lib was just opened.
            let p = unsafe { ncclbpf_harness::anynet::dlsym(lib, &format!("ncclNetPlugin_v{w}")) };
            assert_eq!(!p.is_null(), w == v, "v{v} library and symbol v{w}");
        }
        let net = AnyNet::open(&path(v), v).unwrap();
        assert_eq!(net.name(), "RefNet");
        assert_eq!(RefChecks::open(v).unwrap().version, v);
    }
}

#[test]
fn round_trip_on_every_version() {
    for v in REF_VERSIONS {
        let (_g, chk, mut net) = setup(v);
        assert_eq!(net.devices().unwrap(), 1);
        let p = net.props(0).unwrap();
        assert_eq!(
            (p.name.as_str(), p.ptr_support, p.max_recvs),
            ("ref0", 1, 8),
            "v{v}"
        );
        if v >= 9 {
            assert_eq!(p.vdevs, Some(vec![0]));
            assert_eq!(p.max_p2p_bytes, Some(1 << 40));
        }
        let live0 = live_all(&chk);
        let mut c = conn(&net);
        // The first connect said "in progress" and the second completed, through the handle.
        assert_eq!(chk.log_ops("connect").len(), 2, "{}", chk.log());
        let rb = c.buf(0, 4096, 3);
        // SAFETY: the buffers live in c until it is closed below.
        let rq = unsafe { net.irecv(c.r, &[rb], v >= 9, true) }.unwrap();
        let sq = c.send(&net, 100, 1000, 3);
        assert_eq!(net.test(sq, 1).unwrap(), Some(vec![1000]), "v{v} send");
        // A receive larger than the send reports the sent size.
        assert_eq!(net.test(rq, 1).unwrap(), Some(vec![1000]), "v{v} recv");
        assert_eq!(c.rbuf[..1000], c.sbuf[100..1100], "v{v} bytes");
        // Zero bytes, and the send posted before the receive.
        let sq = c.send(&net, 0, 0, 3);
        let rq = c.recv(&net, 8192, 16, 3);
        assert_eq!(net.test(rq, 1).unwrap(), Some(vec![0]));
        assert_eq!(net.test(sq, 0).unwrap(), Some(vec![]));
        if v >= 7 {
            net.irecv_consumed(c.r, 1, rq).unwrap();
        }
        c.close(&net);
        net.finalize().unwrap();
        no_violations(&chk);
        let mut want = live0;
        if v >= 11 {
            want[0] -= 1; // finalized
        }
        assert_eq!(
            live_all(&chk),
            want,
            "v{v}: ctx, listen, send, recv, mr, req still live"
        );
        let order: Vec<String> = chk
            .log()
            .lines()
            .map(|l| l.split(' ').next().unwrap().to_owned())
            .collect();
        let at = |op: &str| {
            order
                .iter()
                .position(|o| o == op)
                .unwrap_or_else(|| panic!("{op}"))
        };
        assert!(at("init") < at("listen") && at("listen") < at("connect"));
        assert!(at("connect") < at("accept") && at("accept") < at("regMr"));
        assert!(at("regMr") < at("irecv") && at("irecv") < at("isend") && at("isend") < at("test"));
        assert!(at("test") < at("deregMr") && at("deregMr") < at("closeSend"));
        assert_eq!(chk.count("isend"), 2);
        assert_eq!(chk.count("test_done"), 4);
    }
}

#[test]
fn multi_receive_places_sends_by_tag() {
    for v in [6, 9, 12] {
        let (_g, chk, net) = setup(v);
        let mut c = conn(&net);
        let bufs = [c.buf(0, 128, 7), c.buf(1000, 128, 3), c.buf(2000, 128, 5)];
        // SAFETY: the buffers live in c.
        let rq = unsafe { net.irecv(c.r, &bufs, false, true) }.unwrap();
        let s3 = c.send(&net, 300, 30, 3);
        assert_eq!(
            net.test(rq, 3).unwrap(),
            None,
            "done with one of three buffers"
        );
        // Tag 9 is in no buffer of the oldest receive: it waits for a later one.
        let s9 = c.send(&net, 900, 9, 9);
        let s7 = c.send(&net, 700, 70, 7);
        let s5 = c.send(&net, 500, 50, 5);
        assert_eq!(net.test(rq, 3).unwrap(), Some(vec![70, 30, 50]));
        assert_eq!(c.rbuf[..70], c.sbuf[700..770]);
        assert_eq!(c.rbuf[1000..1030], c.sbuf[300..330]);
        assert_eq!(c.rbuf[2000..2050], c.sbuf[500..550]);
        for s in [s3, s7, s5] {
            assert!(net.test(s, 1).unwrap().is_some());
        }
        assert_eq!(
            net.test(s9, 1).unwrap(),
            None,
            "tag 9 matched a receive without tag 9"
        );
        let r9 = c.recv(&net, 4000, 64, 9);
        assert_eq!(net.test(r9, 1), Ok(Some(vec![9])), "{}", chk.log());
        assert_eq!(net.test(s9, 1).unwrap(), Some(vec![9]));
        // Two buffers with one tag fill in index order; sends posted before the receive.
        let a = c.send(&net, 0, 11, 4);
        let b = c.send(&net, 100, 22, 4);
        let bufs = [c.buf(0, 64, 4), c.buf(100, 64, 4)];
        // SAFETY: as above.
        let rq = unsafe { net.irecv(c.r, &bufs, false, true) }.unwrap();
        assert_eq!(net.test(rq, 2).unwrap(), Some(vec![11, 22]));
        assert!(net.test(a, 1).unwrap().is_some() && net.test(b, 1).unwrap().is_some());
        c.close(&net);
        no_violations(&chk);
    }
}

#[test]
fn injected_failures_are_observable() {
    for v in [6, 12] {
        let (_g, chk, net) = setup(v);
        let live0 = live_all(&chk);
        let mut c = conn(&net);
        // isend_null after one call: the second isend answers "try again".
        chk.inject("isend_null", 1);
        let a = c.send(&net, 0, 8, 0);
        assert!(!a.is_null());
        assert!(c.send(&net, 0, 8, 0).is_null(), "isend_null did not fire");
        let b = c.send(&net, 8, 8, 0);
        assert!(!b.is_null());
        assert_eq!(chk.count("inject:isend_null"), 1);
        chk.inject("irecv_null", 0);
        assert!(c.recv(&net, 0, 8, 0).is_null(), "irecv_null did not fire");
        let (r1, r2) = (c.recv(&net, 0, 8, 0), c.recv(&net, 8, 8, 0));
        // test_error: one ncclRemoteError, the request unchanged.
        chk.inject("test_error", 0);
        assert_eq!(net.test(r1, 1), Err(6));
        assert_eq!(net.test(r1, 1).unwrap(), Some(vec![8]));
        for q in [r2, a, b] {
            assert!(net.test(q, 1).unwrap().is_some());
        }
        // hang: the send never completes, nor does the receive behind it.
        chk.inject("hang", 0);
        let h = c.send(&net, 0, 16, 0);
        let hr = c.recv(&net, 0, 16, 0);
        assert_eq!(net.wait(h, 1, 500).unwrap(), None);
        assert_eq!(net.wait(hr, 1, 500).unwrap(), None);
        assert!(chk.count("test_pending") >= 1000);
        // hang_recv: data lands but the receive never reports done.
        let (s2, r2) = net.connect_pair(0).unwrap();
        // SAFETY: c's buffers, alive until the end of the loop body.
        let (smh, rmh) = unsafe {
            (
                net.reg_mr(s2, c.sbuf.as_ptr(), BUF, 1).unwrap(),
                net.reg_mr(r2, c.rbuf.as_ptr(), BUF, 1).unwrap(),
            )
        };
        chk.inject("hang_recv", 0);
        let b2 = RecvBuf {
            data: c.rbuf[100..].as_mut_ptr(),
            size: 8,
            tag: 0,
            mh: rmh,
            ph: NULL,
        };
        // SAFETY: the buffers live in c.
        let q = unsafe { net.irecv(r2, &[b2], false, true) }.unwrap();
        // SAFETY: as above: what the call reads and writes outlives it.
        let sq = unsafe { net.isend(s2, c.sbuf.as_ptr(), 8, 0, smh, NULL) }.unwrap();
        assert!(net.test(sq, 1).unwrap().is_some());
        assert_eq!(net.wait(q, 1, 100).unwrap(), None);
        // The failures of setup calls.
        chk.inject("regmr_fail", 0);
        // SAFETY: as above: what the call reads and writes outlives it.
        assert_eq!(unsafe { net.reg_mr(s2, c.sbuf.as_ptr(), 8, 1) }, Err(2));
        chk.inject("connect_fail", 0);
        let (mut hd, l) = net.listen(0).unwrap();
        assert_eq!(net.connect_step(0, &mut hd), Err(2));
        chk.inject("accept_fail", 0);
        assert_eq!(net.accept_step(l), Err(2));
        net.close_listen(l).unwrap();
        for q in [
            "hang",
            "hang_recv",
            "regmr_fail",
            "connect_fail",
            "accept_fail",
            "test_error",
        ] {
            assert_eq!(chk.count(&format!("inject:{q}")), 1, "{q}");
        }
        // Closing comms with requests outstanding is allowed; those requests are then stale.
        net.dereg_mr(s2, smh).unwrap();
        net.dereg_mr(r2, rmh).unwrap();
        net.close_send(s2).unwrap();
        net.close_recv(r2).unwrap();
        c.close(&net);
        assert_eq!(live_all(&chk)[1..], live0[1..]);
        no_violations(&chk);
        // init_fail, on a table of its own.
        let mut other = AnyNet::open(&path(v), v).unwrap();
        chk.reset();
        chk.inject("init_fail", 0);
        assert_eq!(other.init(7, None), Err(2));
        assert_eq!(chk.count("inject:init_fail"), 1);
        assert!(chk.log().contains("init -> error (injected)"));
        assert!(
            !chk.try_inject("no_such", 0),
            "an unknown injection was accepted"
        );
    }
}

#[test]
fn violations_are_detected_one_each() {
    let (_g, chk, net) = setup(12);
    let mut c = conn(&net);
    // A memory handle registered on the other comm.
    // SAFETY (every isend/irecv below): the buffers live in c until the end of the test.
    // SAFETY: as above: what the call reads and writes outlives it.
    let q = unsafe { net.isend(c.s, c.sbuf.as_ptr(), 8, 0, c.rmh, NULL) }.unwrap();
    one_violation(&chk, "belongs to comm");
    let r = c.recv(&net, 0, 8, 0);
    assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
    // A buffer outside its memory handle's registration.
    let other = pattern(64, 1);
    // SAFETY: as above: what the call reads and writes outlives it.
    let q = unsafe { net.isend(c.s, other.as_ptr(), 8, 0, c.smh, NULL) }.unwrap();
    one_violation(&chk, "lies outside");
    let r = c.recv(&net, 0, 8, 0);
    assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
    // A NULL memory handle, unless allowed.
    // SAFETY: as above: what the call reads and writes outlives it.
    let q = unsafe { net.isend(c.s, c.sbuf.as_ptr(), 8, 0, NULL, NULL) }.unwrap();
    one_violation(&chk, "mhandle[0] is NULL");
    chk.config("allow_null_mhandle", 1);
    // SAFETY: as above: what the call reads and writes outlives it.
    let q2 = unsafe { net.isend(c.s, c.sbuf.as_ptr(), 8, 0, NULL, NULL) }.unwrap();
    no_violations(&chk);
    chk.reset();
    let (r, r2) = (c.recv(&net, 0, 8, 0), c.recv(&net, 8, 8, 0));
    for x in [q, q2, r, r2] {
        assert!(net.test(x, 1).unwrap().is_some());
    }
    // A request never issued, and one tested after it was reported done.
    assert_eq!(net.test(Obj::addr(0xdead0), 1), Err(3));
    one_violation(&chk, "was not issued by this plugin");
    assert_eq!(net.test(q, 1), Err(3));
    one_violation(&chk, "used after test() reported it done");
    // A comm handle of the wrong kind.
    assert_eq!(
        // SAFETY: as above: what the call reads and writes outlives it.
        unsafe { net.isend(c.r, c.sbuf.as_ptr(), 8, 0, c.smh, NULL) },
        Err(3)
    );
    one_violation(&chk, "is a recv handle, not a send");
    // Sizes: a send larger than its receive fails both with ncclInvalidUsage.
    let q = c.send(&net, 0, 100, 0);
    let r = c.recv(&net, 0, 50, 0);
    assert_eq!(net.test(q, 1), Err(5));
    assert_eq!(net.test(r, 1), Err(5));
    one_violation(&chk, "size mismatch");
    // Tags: an n == 1 receive takes the next send in order; a different tag is reported.
    let q = c.send(&net, 0, 8, 1);
    let r = c.recv(&net, 0, 8, 2);
    assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
    one_violation(&chk, "tag mismatch");
    // n above maxRecvs.
    let bufs: Vec<RecvBuf> = (0..9).map(|i| c.buf(i * 8, 8, 0)).collect();
    // SAFETY: as above: what the call reads and writes outlives it.
    assert_eq!(unsafe { net.irecv(c.r, &bufs, false, true) }, Err(3));
    one_violation(&chk, "outside 1..8");
    // irecvConsumed of a receive not reported done, then of one that was (no violation).
    let r = c.recv(&net, 0, 8, 0);
    net.irecv_consumed(c.r, 1, r).unwrap();
    one_violation(&chk, "has not been reported done");
    let q = c.send(&net, 0, 8, 0);
    assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
    net.irecv_consumed(c.r, 1, r).unwrap();
    no_violations(&chk);
    // deregMr of a handle through the other comm.
    // SAFETY: c's buffer.
    let mh = unsafe { net.reg_mr(c.s, c.sbuf.as_ptr(), 64, 1) }.unwrap();
    net.dereg_mr(c.r, mh).unwrap();
    one_violation(&chk, "registered on another comm");
    assert_eq!(net.dereg_mr(c.s, mh), Err(3));
    one_violation(&chk, "used after deregMr");
    // A connect retried with fresh copies of the handle instead of the bytes connect wrote.
    let (h0, l) = net.listen(0).unwrap();
    assert_eq!(net.connect_step(0, &mut h0.clone()).unwrap(), None);
    assert_eq!(net.connect_step(0, &mut h0.clone()).unwrap(), None);
    one_violation(&chk, "retried without the state");
    net.close_listen(l).unwrap();
    // A comm used after close, and closed twice.
    let (s2, r2) = net.connect_pair(0).unwrap();
    net.close_send(s2).unwrap();
    assert_eq!(
        // SAFETY: as above: what the call reads and writes outlives it.
        unsafe { net.isend(s2, c.sbuf.as_ptr(), 8, 0, c.smh, NULL) },
        Err(3)
    );
    one_violation(&chk, "used after close");
    assert_eq!(net.close_send(s2), Err(3));
    one_violation(&chk, "used after close");
    net.close_recv(r2).unwrap();
    c.close(&net);
    no_violations(&chk);
}

#[test]
fn version_specific_violations() {
    // v6-v8 never see NCCL's 0x1 receive hint; v9+ may.
    for (v, want) in [(8, 1), (9, 0)] {
        let (_g, chk, net) = setup(v);
        let mut c = conn(&net);
        let b = c.buf(0, 8, 0);
        // SAFETY: the buffer lives in c.
        let r = unsafe { net.irecv(c.r, &[b], true, true) }.unwrap();
        assert_eq!(chk.violations(), want, "v{v}: {}", chk.violation_text());
        if want == 1 {
            one_violation(&chk, "0x1 receive-completion hint");
        }
        let q = c.send(&net, 0, 8, 0);
        assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
        c.close(&net);
    }
    // A v6-v10 plugin is initialised once per load.
    let (_g, chk, mut net) = setup(9);
    net.init(1, None).unwrap();
    one_violation(&chk, "called 2 times");
    drop(_g);
    // v11+: listen/connect get a ctx that init returned and finalize has not retired.
    let (_g, chk, mut net) = setup(11);
    let ctx = net.ctx;
    net.ctx = 0x5ef0_1234 as *mut std::ffi::c_void;
    let (_, l) = net.listen(0).unwrap();
    one_violation(&chk, "was not issued by this plugin");
    net.ctx = ctx;
    net.close_listen(l).unwrap();
    net.finalize().unwrap();
    net.ctx = ctx;
    let (_, l) = net.listen(0).unwrap();
    one_violation(&chk, "used after finalize");
    net.close_listen(l).unwrap();
    drop(_g);
    // v10+: phandles are NCCL's, passed through unchanged.
    let (_g, chk, net) = setup(10);
    let mut c = conn(&net);
    let p = Obj::addr(0x7000);
    chk.expect_phandle(p);
    // SAFETY (below): the buffers live in c.
    // SAFETY: as above: what the call reads and writes outlives it.
    let q = unsafe { net.isend(c.s, c.sbuf.as_ptr(), 8, 0, c.smh, p) }.unwrap();
    let mut b = c.buf(0, 8, 0);
    b.ph = p;
    // SAFETY: as above: what the call reads and writes outlives it.
    let r = unsafe { net.irecv(c.r, &[b], false, true) }.unwrap();
    no_violations(&chk);
    assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
    // SAFETY: as above: what the call reads and writes outlives it.
    let q = unsafe { net.isend(c.s, c.sbuf.as_ptr(), 8, 0, c.smh, Obj::addr(0x7008)) }.unwrap();
    assert!(chk.log().contains("ph=0x7008"), "{}", chk.log());
    one_violation(&chk, "is not the expected");
    chk.expect_phandle(p);
    // SAFETY: as above: what the call reads and writes outlives it.
    let r = unsafe { net.irecv(c.r, &[b], false, false) }.unwrap();
    one_violation(&chk, "phandles array is NULL");
    assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
    c.close(&net);
}

#[test]
fn virtual_devices_and_two_nics() {
    for v in [9, 12] {
        let (_g, chk, net) = setup(v);
        chk.config("ndev", 2);
        assert_eq!(net.devices().unwrap(), 2);
        assert_eq!(net.props(1).unwrap().name, "ref1");
        let d = net.make_vdevice(&[0, 1]).unwrap();
        assert_eq!(d, 2);
        assert_eq!(net.devices().unwrap(), 3);
        let p = net.props(2).unwrap();
        assert_eq!((p.name.as_str(), p.vdevs), ("ref0+1", Some(vec![0, 1])));
        assert_eq!(p.guid, 2);
        // A connection over the virtual device.
        let (s, r) = net.connect_pair(d).unwrap();
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
        no_violations(&chk);
        assert_eq!(net.make_vdevice(&[0, 5]), Err(4));
        one_violation(&chk, "not a physical device");
        chk.reset();
        assert_eq!(
            net.devices().unwrap(),
            1,
            "reset forgets the virtual device"
        );
    }
}

static PROF_EVENTS: Mutex<Vec<(i32, usize, i64)>> = Mutex::new(Vec::new());

type Vp = *mut std::ffi::c_void;

unsafe extern "C" fn prof(eh: *mut Vp, ty: i32, ph: Vp, id: i64, _ext: Vp) -> i32 {
    PROF_EVENTS.lock().unwrap().push((ty, ph as usize, id));
    if ty == 0 {
        // SAFETY: eh points at the plugin's event-handle slot.
        unsafe { *eh = 0xe0 as Vp };
    }
    0
}

#[test]
fn profiler_callback_sees_the_phandles() {
    for v in [10, 12] {
        let _g = serial();
        let chk = RefChecks::open(v).unwrap();
        chk.reset();
        PROF_EVENTS.lock().unwrap().clear();
        let mut net = AnyNet::open(&path(v), v).unwrap();
        net.init(5, Some(prof)).unwrap();
        assert!(chk.log_ops("init")[0].contains("prof=1"), "{}", chk.log());
        let mut c = conn(&net);
        // SAFETY: the buffers live in c.
        let q = unsafe { net.isend(c.s, c.sbuf.as_ptr(), 8, 0, c.smh, Obj::addr(0x77)) }.unwrap();
        let mut b = c.buf(0, 8, 0);
        b.ph = Obj::addr(0x88);
        // SAFETY: as above: what the call reads and writes outlives it.
        let r = unsafe { net.irecv(c.r, &[b], false, true) }.unwrap();
        assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
        let id = (3 << 16) | 1;
        let ev = PROF_EVENTS.lock().unwrap().clone();
        assert_eq!(
            ev,
            vec![(0, 0x77, id), (0, 0x88, id), (1, 0, 0), (1, 0, 0)],
            "v{v}"
        );
        assert_eq!((chk.count("prof_start"), chk.count("prof_stop")), (2, 2));
        c.close(&net);
        net.finalize().unwrap();
        no_violations(&chk);
    }
}

#[test]
fn flush_device_mr_dmabuf_and_attrs_are_recorded() {
    let (_g, chk, mut net) = setup(12);
    let c = conn(&net);
    let rb = [c.rbuf.as_ptr() as *mut u8];
    // SAFETY (iflush, regMr*): c's buffers, alive until c.close below.
    // SAFETY: as above: what the call reads and writes outlives it.
    let f = unsafe { net.iflush(c.r, &rb, &[100], &[c.rmh]) }.unwrap();
    assert!(!f.is_null());
    assert_eq!(net.test(f, 0).unwrap(), Some(vec![]));
    chk.config("flush_null", 1);
    assert!(
        // SAFETY: as above: what the call reads and writes outlives it.
        unsafe { net.iflush(c.r, &rb, &[100], &[c.rmh]) }
            .unwrap()
            .is_null()
    );
    assert_eq!(net.get_device_mr(c.r, c.rmh).unwrap(), NULL);
    // SAFETY: as above: what the call reads and writes outlives it.
    let mh = unsafe { net.reg_mr_dmabuf(c.s, c.sbuf.as_ptr(), 4096, 1, 4096, 9) }.unwrap();
    assert!(chk.log().contains("offset=4096 fd=9"), "{}", chk.log());
    net.dereg_mr(c.s, mh).unwrap();
    // ptrSupport is HOST: CUDA memory is refused (not a violation).
    // SAFETY: as above: what the call reads and writes outlives it.
    assert_eq!(unsafe { net.reg_mr(c.s, c.sbuf.as_ptr(), 64, 2) }, Err(3));
    // SAFETY: NetAttr is plain integers.
    let mut attr: NetAttr = unsafe { std::mem::zeroed() };
    attr.op = 0x10;
    net.set_net_attr(&mut attr).unwrap();
    assert!(
        chk.log_ops("setNetAttr")[0].contains("op=0x10"),
        "{}",
        chk.log()
    );
    c.close(&net);
    net.finalize().unwrap();
    no_violations(&chk);
    for op in [
        "iflush",
        "getDeviceMr",
        "regMrDmaBuf",
        "setNetAttr",
        "finalize",
    ] {
        assert_eq!(chk.count(op), if op == "iflush" { 2 } else { 1 }, "{op}");
    }
}

#[test]
fn done_after_tests_delays_completion() {
    let (_g, chk, net) = setup(11);
    chk.config("done_after_tests", 2);
    let mut c = conn(&net);
    let r = c.recv(&net, 0, 8, 0);
    let q = c.send(&net, 0, 8, 0);
    assert_eq!(net.test(q, 1).unwrap(), None);
    assert_eq!(net.test(q, 1).unwrap(), None);
    assert_eq!(net.test(q, 1).unwrap(), Some(vec![8]));
    assert_eq!(net.wait(r, 1, 3).unwrap(), Some(vec![8]));
    c.close(&net);
    no_violations(&chk);
}

#[test]
fn concurrent_connections_are_thread_safe() {
    let (_g, chk, net) = setup(12);
    let live0 = live_all(&chk);
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let net = &net;
            sc.spawn(move || {
                let mut c = conn(net);
                for i in 0..300usize {
                    let len = (i * 37 + t as usize * 101) % 4096;
                    let r = c.recv(net, 8192, 4096, t as i32);
                    let q = c.send(net, i % 1000, len, t as i32);
                    assert_eq!(net.wait(q, 1, 100).unwrap(), Some(vec![len as i32]));
                    assert_eq!(net.wait(r, 1, 100).unwrap(), Some(vec![len as i32]));
                    assert_eq!(c.rbuf[8192..8192 + len], c.sbuf[i % 1000..i % 1000 + len]);
                }
                c.close(net);
            });
        }
    });
    no_violations(&chk);
    assert_eq!(chk.count("isend"), 1200);
    assert_eq!(live_all(&chk), live0);
}

/// The environment's settings, read when the library loads: checked in a child process of this
/// test binary, which runs `env_child` with them set (and dumps its log at exit).
#[test]
fn environment_settings_apply_at_load() {
    let dump = std::env::temp_dir().join(format!("inner-ref-env-{}.log", std::process::id()));
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "env_child", "--test-threads=1"])
        .env("INNER_REF_ENV_CHILD", "1")
        .env("INNER_REF_NDEV", "2")
        .env("INNER_REF_CONFIG", "connect_delay=0,maxrecvs=4")
        .env("INNER_REF_INJECT", "isend_null:1")
        .env("INNER_REF_LOG_FILE", &dump)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "the child test did not run:\n{stdout}"
    );
    let text = std::fs::read_to_string(&dump).unwrap();
    let _ = std::fs::remove_file(&dump);
    assert!(text.starts_with("# inner_ref v7: 0 violation(s)"), "{text}");
    assert!(text.contains("inject isend_null"), "{text}");
}

/// The child half of `environment_settings_apply_at_load`; does nothing in a normal run.
#[test]
fn env_child() {
    if std::env::var_os("INNER_REF_ENV_CHILD").is_none() {
        return;
    }
    let chk = RefChecks::open(7).unwrap();
    let mut net = AnyNet::open(&path(7), 7).unwrap();
    net.init(1, None).unwrap();
    assert_eq!(net.devices().unwrap(), 2);
    assert_eq!(net.props(0).unwrap().max_recvs, 4);
    let c = conn(&net);
    assert_eq!(
        chk.log_ops("connect").len(),
        1,
        "connect_delay=0: no 'in progress'"
    );
    let (a, b) = (c.send(&net, 0, 8, 0), c.send(&net, 0, 8, 0));
    assert!(
        !a.is_null() && b.is_null(),
        "isend_null:1 fires on the second isend"
    );
    c.close(&net);
}

/// A handle is told apart from a later object in the same slot by its generation
/// (handles are 0x5EF0 | kind | generation | slot, the slot in the low 16 bits).
#[test]
fn stale_handles_are_told_apart_from_reused_slots() {
    let (_g, chk, net) = setup(9);
    let mut c = conn(&net);
    let slot = |o: Obj| o.0 as usize & 0xffff;
    let (q, r) = (c.send(&net, 0, 8, 0), c.recv(&net, 0, 8, 0));
    assert!(net.test(q, 1).unwrap().is_some() && net.test(r, 1).unwrap().is_some());
    // Transfer until a new request, still live, sits in q's slot.
    let mut live = None;
    for _ in 0..20_000 {
        let r2 = c.recv(&net, 0, 8, 0);
        let s2 = c.send(&net, 0, 8, 0);
        if slot(r2) == slot(q) || slot(s2) == slot(q) {
            live = Some((s2, r2));
            break;
        }
        assert!(net.test(s2, 1).unwrap().is_some() && net.test(r2, 1).unwrap().is_some());
    }
    let (s2, r2) = live.expect("the request slots never wrapped around");
    assert_eq!(
        net.test(q, 1),
        Err(3),
        "a done request's handle reached the slot's new owner"
    );
    one_violation(&chk, "used after test() reported it done");
    assert!(net.test(s2, 1).unwrap().is_some() && net.test(r2, 1).unwrap().is_some());
    c.close(&net);
    no_violations(&chk);
}

/// The loopback is in-process: a handle written by another process is refused, not matched
/// with whatever local listener has the same id.
#[test]
fn handles_of_other_processes_are_refused() {
    let (_g, chk, net) = setup(12);
    let (mut h, l) = net.listen(0).unwrap();
    let pid = u32::from_ne_bytes(h[24..28].try_into().unwrap());
    assert_eq!(
        pid,
        std::process::id(),
        "the handle carries the listener's process id"
    );
    h[24..28].copy_from_slice(&(pid ^ 1).to_ne_bytes());
    assert_eq!(net.connect_step(0, &mut h), Err(2));
    assert!(
        chk.log().contains("refused (a handle of process"),
        "{}",
        chk.log()
    );
    net.close_listen(l).unwrap();
    no_violations(&chk);
}

/// The harness's NCCL-like driver runs over the reference plugin unchanged (v7 to v12), so a
/// wrapper test that points it at the wrapper in front of this plugin blames only the wrapper.
#[test]
fn the_harness_net_drives_it() {
    for v in ncclbpf_harness::VERSIONS {
        let _g = serial();
        let chk = RefChecks::open(v).unwrap();
        chk.reset();
        chk.config("allow_null_mhandle", 1); // Net passes NULL mhandles and tag 0
        let mut net = ncclbpf_harness::Net::open_path(&path(v), Some(v)).unwrap();
        net.init(0x77).unwrap();
        assert_eq!(net.devices().unwrap(), 1);
        assert_eq!(net.props(0).unwrap().max_recvs, 8);
        let (s, r) = net.connect_pair(0).unwrap();
        for len in [0, 1, 4096, 100_000] {
            let data = pattern(len, len as u64);
            assert_eq!(
                net.transfer(s, r, &data, len + 64).unwrap(),
                data,
                "v{v} {len} bytes"
            );
        }
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
        net.finalize().unwrap();
        no_violations(&chk);
        assert_eq!(chk.count("isend"), 4);
    }
}
