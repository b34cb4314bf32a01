//! An independent review of the interposer (`NCCL_BPF_NET_INNER`), each finding a test that
//! failed on the code as reviewed: the wrapper in front of the reference inner plugin
//! (tests/csrc/inner_ref*.c, which checks every argument that reaches it), driven as NCCL
//! drives a net plugin, in the corners the first tests left alone. Each case runs in a child
//! process (the wrapper loads its inner plugin once per process).

use ncclbpf_harness::anynet::{AnyNet, Obj, RecvBuf};
use ncclbpf_harness::child::in_child;
use ncclbpf_harness::inner_ref::{RefChecks, path};
use ncclbpf_harness::{pattern, plugin_path};
use std::ffi::OsStr;
use std::time::{Duration, Instant};

const CLEARED: [&str; 8] = [
    "NCCL_BPF_NET_INNER",
    "NCCL_BPF_POLICY",
    "NCCL_BPF_NET_POLICY",
    "NCCL_BPF_TUNER_POLICY",
    "NCCL_BPF_METRICS_ADDR",
    "NCCL_BPF_HANDSHAKE_TIMEOUT",
    "INNER_REF_CONFIG",
    "INNER_REF_INJECT",
];
const NULL: Obj = Obj::NULL;
const OUTER: [u32; 6] = [7, 8, 9, 10, 11, 12];
const LEN: usize = 1 << 12;

fn run(name: &str, v: u32, extra: &[(&str, &str)], body: fn()) {
    let p = path(v).into_os_string();
    let vs = v.to_string();
    let mut env: Vec<(&str, &OsStr)> = vec![
        ("NCCL_BPF_NET_INNER", &p),
        ("NCCL_SOCKET_IFNAME", OsStr::new("lo")),
        ("NCCLBPF_TEST_INNER_V", OsStr::new(&vs)),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, OsStr::new(v))));
    in_child(name, &env, &CLEARED, body);
}

fn inner_version() -> u32 {
    std::env::var("NCCLBPF_TEST_INNER_V")
        .unwrap()
        .parse()
        .unwrap()
}

/// Polls connect and accept until both ends are up.
fn pair(net: &AnyNet) -> (Obj, Obj) {
    let (mut h, l) = net.listen(0).unwrap();
    let (s, r) = finish(net, &mut h, l, Duration::from_secs(20)).expect("connect/accept");
    net.close_listen(l).unwrap();
    (s, r)
}

/// connect on `h` and accept on `l` in turn until both are up, or `None` after `within`.
fn finish(net: &AnyNet, h: &mut [u8; 128], l: Obj, within: Duration) -> Option<(Obj, Obj)> {
    let (mut s, mut r) = (None, None);
    let deadline = Instant::now() + within;
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = net.connect_step(0, h).unwrap();
        }
        if r.is_none() {
            r = net.accept_step(l).unwrap();
        }
        if Instant::now() > deadline {
            return None;
        }
    }
    Some((s.unwrap(), r.unwrap()))
}

fn wait(net: &AnyNet, req: Obj, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(sizes) = net.test(req, n).unwrap() {
            return sizes;
        }
        assert!(Instant::now() < deadline, "request did not complete");
    }
}

fn buf(b: &mut [u8]) -> RecvBuf {
    RecvBuf {
        data: b.as_mut_ptr(),
        size: b.len(),
        tag: 0,
        mh: NULL,
        ph: NULL,
    }
}

// ------------------------------------------------------------------ the 0x1 receive hint

/// NCCL's optional-completion hint (`*request == 0x1` before `irecv`) is a v9+ convention:
/// NCCL's own adapters for v6 to v8 plugins reset it to NULL before calling them, since such a
/// plugin may leave `*request` alone (and NCCL would then test request 0x1). The wrapper must
/// strip it for them too; the reference plugin reports a hint that reaches a v6-v8 `irecv`.
fn the_hint_reaches_only_plugins_that_know_it() {
    let v = inner_version();
    let chk = RefChecks::open(v).unwrap();
    for ov in OUTER {
        let mut net = AnyNet::open(&plugin_path(), ov).unwrap();
        net.init(0x80 + u64::from(ov), None).unwrap();
        let (s, r) = pair(&net);
        let out = pattern(LEN, u64::from(ov));
        let mut inb = vec![0u8; LEN];
        // SAFETY: both buffers outlive the requests.
        let rq = unsafe { net.irecv(r, &[buf(&mut inb)], true, true) }.unwrap();
        // SAFETY: as above.
        let sq = unsafe { net.isend(s, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
        assert!(!rq.is_null() && !sq.is_null());
        wait(&net, sq, 1);
        wait(&net, rq, 1);
        assert!(inb == out);
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
        net.finalize().unwrap();
    }
    assert_eq!(chk.violations(), 0, "inner v{v}: {}", chk.violation_text());
}

macro_rules! per_inner_version {
    ($body:ident: $($name:ident = $v:expr),*) => {$(
        #[test]
        fn $name() {
            run(stringify!($name), $v, &[("INNER_REF_CONFIG", "allow_null_mhandle=1")], $body);
        }
    )*};
}

per_inner_version!(the_hint_reaches_only_plugins_that_know_it:
    hint_over_inner_v6 = 6,
    hint_over_inner_v7 = 7,
    hint_over_inner_v8 = 8,
    hint_over_inner_v9 = 9
);

// ------------------------------------------------------------------ vProps across versions

/// A v12 inner plugin's virtual device may fuse up to 8 NICs; NCCL calling the wrapper's v9 to
/// v11 table has room for 4 (`ncclNetVDeviceProps_v11_t.devs[4]`). `ndevs` must never say more
/// than the array NCCL reads holds (NCCL loops over `ndevs` entries: past the array it reads
/// `maxP2pBytes` as device indexes).
fn vprops_fit_the_version_nccl_reads() {
    let mut n12 = AnyNet::open(&plugin_path(), 12).unwrap();
    n12.init(0x90, None).unwrap();
    let d = n12.make_vdevice(&[0; 6]).unwrap();
    assert_eq!(n12.props(d).unwrap().vdevs.unwrap(), [0; 6]);
    for ov in [9, 10, 11] {
        let mut n = AnyNet::open(&plugin_path(), ov).unwrap();
        n.init(0x91, None).unwrap();
        let p = n.props(d).unwrap();
        let vd = p.vdevs.unwrap();
        assert!(
            vd.len() <= 4,
            "v{ov}: ndevs {} in a 4-entry array",
            vd.len()
        );
        assert!(vd.iter().all(|&x| x == 0), "v{ov}: {vd:?}");
        n.finalize().unwrap();
    }
    n12.finalize().unwrap();
}

#[test]
fn a_v12_virtual_device_of_6_nics_fits_a_v11_nccl() {
    run(
        "a_v12_virtual_device_of_6_nics_fits_a_v11_nccl",
        12,
        &[],
        vprops_fit_the_version_nccl_reads,
    );
}

// ------------------------------------------------------------------ connect keyed by buffer

/// NCCL gives up on a connect (a communicator aborted while connecting) and the memory of its
/// handle buffer serves the next connection's handle. That connect must reach the new listener,
/// not resume the abandoned one (whose inner connection, to another peer, is then closed).
fn a_reused_handle_buffer_is_a_new_connection() {
    let chk = RefChecks::open(inner_version()).unwrap();
    let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
    net.init(0xa0, None).unwrap();
    let (ha, la) = net.listen(0).unwrap();
    let mut h = ha;
    // The inner plugin connects at once (connect_delay=0); the side channel is still to come:
    // its listener (A's) is never polled.
    assert!(net.connect_step(0, &mut h).unwrap().is_none());
    // Given up. The same buffer now holds the handle of another listener.
    let (hb, lb) = net.listen(0).unwrap();
    h = hb;
    let (s, r) = finish(&net, &mut h, lb, Duration::from_secs(10))
        .expect("the connect on B's handle reaches B (the wrapper resumed A's)");
    let out = pattern(LEN, 9);
    let mut inb = vec![0u8; LEN];
    // SAFETY: buffers outlive the requests.
    let rq = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
    // SAFETY: as above.
    let sq = unsafe { net.isend(s, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
    wait(&net, sq, 1);
    wait(&net, rq, 1);
    assert!(inb == out);
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
    net.close_listen(la).unwrap();
    net.close_listen(lb).unwrap();
    assert_eq!(
        chk.live("send"),
        0,
        "the abandoned connect's inner connection is closed"
    );
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
}

#[test]
fn a_reused_handle_buffer_connects_to_its_own_listener() {
    run(
        "a_reused_handle_buffer_connects_to_its_own_listener",
        11,
        &[
            ("INNER_REF_CONFIG", "allow_null_mhandle=1,connect_delay=0"),
            ("NCCL_BPF_HANDSHAKE_TIMEOUT", "1"),
        ],
        a_reused_handle_buffer_is_a_new_connection,
    );
}

// ------------------------------------------------------------------ close during accept

/// NCCL closes a listen comm whose accept is half done (the inner plugin's connection is in,
/// the side channel not yet: the communicator was aborted). The inner plugin's accepted
/// connection must be closed with it, not leaked.
fn closing_a_half_accepted_listener_closes_the_inner_connection() {
    let chk = RefChecks::open(inner_version()).unwrap();
    let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
    net.init(0xb0, None).unwrap();
    let (h, l) = net.listen(0).unwrap();
    // The connecting end makes no side channel (as with NCCL_BPF_NET_SIDE=0 there): no trailer.
    let mut hc = h;
    hc[127] ^= 0xff;
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        if let Some(s) = net.connect_step(0, &mut hc).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline);
    };
    assert!(
        net.accept_step(l).unwrap().is_none(),
        "waiting for the side channel"
    );
    assert_eq!(chk.live("recv"), 1, "the inner plugin accepted");
    net.close_listen(l).unwrap();
    net.close_send(s).unwrap();
    assert_eq!(chk.live("recv"), 0, "the accepted inner connection leaked");
    assert_eq!(chk.live("listen"), 0);
    net.finalize().unwrap();
}

#[test]
fn closing_a_listener_mid_accept_leaks_nothing() {
    run(
        "closing_a_listener_mid_accept_leaks_nothing",
        11,
        &[],
        closing_a_half_accepted_listener_closes_the_inner_connection,
    );
}

// ------------------------------------------------------------------ irecvConsumed

/// NCCL calls `irecvConsumed` for every receive once the GPU has consumed its data, which may be
/// well after `test` reported it done. The request must still name that receive then, even if
/// the connection posted 64 more in between: the wrapper must never hand the inner plugin
/// another receive's request (the reference plugin reports an `irecvConsumed` of a receive not
/// yet done).
fn consumed_names_its_own_receive() {
    let chk = RefChecks::open(inner_version()).unwrap();
    let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
    net.init(0xc0, None).unwrap();
    let (s, r) = pair(&net);
    let out = pattern(LEN, 11);
    let mut inb = vec![0u8; LEN];
    let round = |consume: bool| {
        let mut inb = vec![0u8; LEN];
        // SAFETY: both buffers outlive the requests (waited for below).
        let rq = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
        // SAFETY: as above.
        let sq = unsafe { net.isend(s, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
        wait(&net, sq, 1);
        wait(&net, rq, 1);
        if consume {
            net.irecv_consumed(r, 1, rq).unwrap();
        }
        rq
    };
    // A: done, not yet consumed (the GPU is slow).
    let a = round(false);
    // 63 more receives, each consumed at once.
    for _ in 0..63 {
        round(true);
    }
    // B: posted, not done.
    // SAFETY: `inb` outlives the request (completed below).
    let b = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
    assert!(!b.is_null());
    // Now A is consumed.
    net.irecv_consumed(r, 1, a).unwrap();
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
    // SAFETY: as above.
    let sq = unsafe { net.isend(s, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
    wait(&net, sq, 1);
    wait(&net, b, 1);
    net.irecv_consumed(r, 1, b).unwrap();
    assert!(inb == out);
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
    assert_eq!(chk.count("irecvConsumed"), 65);
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
    net.finalize().unwrap();
}

#[test]
fn irecv_consumed_reaches_its_own_receive_64_posts_later() {
    run(
        "irecv_consumed_reaches_its_own_receive_64_posts_later",
        11,
        &[("INNER_REF_CONFIG", "allow_null_mhandle=1")],
        consumed_names_its_own_receive,
    );
}

// ------------------------------------------------------------------ int sizes of regMr

/// `regMr` of a v6/v7 plugin takes an `int` size: NCCL's own adapters refuse 2 GiB and more
/// (`size >= 1 << 31`), not the 1 GiB bound of a message (`maxP2pBytes`). A user buffer of
/// 1.5 GiB (ncclCommRegister) registers with the plugin loaded directly, and must through the
/// wrapper too; 2 GiB must not (it would wrap negative). v8 (`size_t`) is the control.
fn reg_mr_takes_what_an_int_holds() {
    let v = inner_version();
    let chk = RefChecks::open(v).unwrap();
    let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
    net.init(0xd0, None).unwrap();
    let (s, r) = pair(&net);
    let len = 3usize << 29; // 1.5 GiB, reserved, never touched
    // SAFETY: an anonymous reservation, unmapped below; nothing reads or writes it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + (1 << 29),
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let p = base as *const u8;
    // SAFETY: the reference plugin only records the range.
    let mh = unsafe { net.reg_mr(s, p, len, 1) }.expect("1.5 GiB registers over an int size");
    net.dereg_mr(s, mh).unwrap();
    // SAFETY: as above.
    let mh = unsafe { net.reg_mr(s, p, (1 << 31) - 1, 1) }.expect("the largest int");
    net.dereg_mr(s, mh).unwrap();
    if v <= 7 {
        // SAFETY: as above.
        assert!(unsafe { net.reg_mr(s, p, 1 << 31, 1) }.is_err(), "2 GiB");
    }
    // SAFETY: the reservation made above.
    unsafe { libc::munmap(base, len + (1 << 29)) };
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
    net.finalize().unwrap();
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
}

per_inner_version!(reg_mr_takes_what_an_int_holds:
    reg_mr_of_1_5_gib_over_inner_v6 = 6,
    reg_mr_of_1_5_gib_over_inner_v7 = 7,
    reg_mr_of_1_5_gib_over_inner_v8 = 8
);

// ------------------------------------------------------------------ init retried

/// The inner plugin's `init` fails once (NCCL then moves on, or retries with the next
/// communicator): a later `init` must reach the inner plugin again and work, a v6-v10 plugin
/// must then be initialised no more (one success per process), and every v11+ context made
/// must be finalised once.
fn init_is_retried_after_a_failure() {
    let v = inner_version();
    let chk = RefChecks::open(v).unwrap();
    chk.inject("init_fail", 0);
    for ov in [12, 9] {
        let mut net = AnyNet::open(&plugin_path(), ov).unwrap();
        if ov == 12 {
            assert!(net.init(0xe0, None).is_err(), "the injected failure");
        }
        net.init(0xe1, None).unwrap();
        let has = |i: usize| net.raw(i) != 0;
        assert_eq!(
            has(ncclbpf_harness::anynet::slot::IRECV_CONSUMED),
            v >= 7,
            "v{ov}: optional slots filled after the retry"
        );
        let (s, r) = pair(&net);
        let out = pattern(LEN, 13);
        let mut inb = vec![0u8; LEN];
        // SAFETY: buffers outlive the requests.
        let rq = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
        // SAFETY: as above.
        let sq = unsafe { net.isend(s, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
        wait(&net, sq, 1);
        wait(&net, rq, 1);
        assert!(inb == out);
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
        net.finalize().unwrap();
    }
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
    if v <= 10 {
        assert_eq!(chk.count("init"), 2, "one failure, one success");
    } else {
        // The failure, the v12 communicator's, and the one context for the v9 table (never
        // finalised: that NCCL has no finalize).
        assert_eq!(chk.count("init"), 3);
        assert_eq!(chk.count("finalize"), 1);
        assert_eq!(chk.live("ctx"), 1);
    }
}

per_inner_version!(init_is_retried_after_a_failure:
    init_retried_over_inner_v8 = 8,
    init_retried_over_inner_v11 = 11
);

// ------------------------------------------------------------------ forged trailers

/// A handle whose side-channel trailer is forged or corrupt (wrong family byte, port 0, an
/// address nobody listens on): the connection is made without a side channel, never a crash,
/// and the inner plugin's connect sees its own handle (the reference plugin refuses another).
fn forged_trailers_cost_only_the_side_channel() {
    let chk = RefChecks::open(inner_version()).unwrap();
    let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
    net.init(0xf0, None).unwrap();
    type Forge = fn(&mut [u8; 128]);
    let forgeries: [(&str, Forge); 3] = [
        ("family 9", |h| h[118] = 9),
        ("port 0", |h| {
            h[116] = 0;
            h[117] = 0
        }),
        ("address 0.0.0.0", |h| h[88..92].fill(0)),
    ];
    for (what, forge) in forgeries {
        let (h, l) = net.listen(0).unwrap();
        let mut hc = h;
        forge(&mut hc);
        let (s, r) = finish(&net, &mut hc, l, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{what}: no connection"));
        let out = pattern(LEN, 17);
        let mut inb = vec![0u8; LEN];
        // SAFETY: buffers outlive the requests.
        let rq = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
        // SAFETY: as above.
        let sq = unsafe { net.isend(s, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
        wait(&net, sq, 1);
        wait(&net, rq, 1);
        assert!(inb == out, "{what}");
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
        net.close_listen(l).unwrap();
    }
    net.finalize().unwrap();
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
}

#[test]
fn forged_side_channel_trailers_cost_only_the_side_channel() {
    run(
        "forged_side_channel_trailers_cost_only_the_side_channel",
        11,
        &[
            ("INNER_REF_CONFIG", "allow_null_mhandle=1"),
            ("NCCL_BPF_HANDSHAKE_TIMEOUT", "1"),
        ],
        forged_trailers_cost_only_the_side_channel,
    );
}

// ------------------------------------------------------------------ side channel dies

/// The side channel's peer dies mid-job (here: every TCP stream of the process, which over the
/// in-process reference plugin are only the side channels, is shut down under the wrapper):
/// the wrapped connection keeps carrying data, and closing it does not hang.
fn a_dead_side_channel_leaves_the_connection_working() {
    let chk = RefChecks::open(inner_version()).unwrap();
    let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
    net.init(0x100, None).unwrap();
    let (s, r) = pair(&net);
    let mut killed = 0;
    for e in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(fd) = e.unwrap().file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: a zeroed sockaddr_storage and its length are valid out-values.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: getpeername on any descriptor only fills `ss`.
        let connected = unsafe { libc::getpeername(fd, (&raw mut ss).cast(), &mut len) } == 0;
        let inet =
            i32::from(ss.ss_family) == libc::AF_INET || i32::from(ss.ss_family) == libc::AF_INET6;
        if connected && inet {
            // SAFETY: shuts down a connected TCP stream; the descriptor stays its owner's.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            killed += 1;
        }
    }
    assert!(killed >= 2, "both ends of the side channel ({killed})");
    let out = pattern(LEN, 19);
    for round in 0..20 {
        let mut inb = vec![0u8; LEN];
        // SAFETY: buffers outlive the requests.
        let rq = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
        // SAFETY: as above.
        let sq = unsafe { net.isend(s, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
        wait(&net, sq, 1);
        wait(&net, rq, 1);
        assert!(inb == out, "round {round}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    net.close_send(s).unwrap();
    net.close_recv(r).unwrap();
    net.finalize().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "close took {:?}",
        t.elapsed()
    );
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
}

#[test]
fn a_dead_side_channel_costs_nothing_but_itself() {
    run(
        "a_dead_side_channel_costs_nothing_but_itself",
        11,
        &[("INNER_REF_CONFIG", "allow_null_mhandle=1")],
        a_dead_side_channel_leaves_the_connection_working,
    );
}

// ------------------------------------------------------------------ two connects, one listener

/// Two connections accepted on one listen comm (NCCL's net transport listens once per
/// connection; a plugin user that accepts several, such as an out-of-band bootstrap over the
/// net plugin, does not). The side channels arrive in their own order: connection X's inner
/// connection first, Y's side channel first. The accepted connection must get the side channel
/// of its own peer, else `ncclbpf status` pairs the wrong ends and the agreement's records
/// reach another connection's peer: over one process, each connection id must have moved as
/// many bytes out as in.
fn two_connects_on_one_listener_pair_their_own_side_channels() {
    let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
    net.init(0x110, None).unwrap();
    let (h, l) = net.listen(0).unwrap();
    let (mut hx, mut hy) = (h, h);
    // X: the inner connection is up at once (connect_delay=0); its side channel is left
    // mid-handshake (X is not polled again until Y is through).
    assert!(net.connect_step(0, &mut hx).unwrap().is_none());
    assert!(net.connect_step(0, &mut hy).unwrap().is_none());
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut sy, mut r1) = (None, None);
    while sy.is_none() || r1.is_none() {
        if sy.is_none() {
            sy = net.connect_step(0, &mut hy).unwrap();
        }
        if r1.is_none() {
            r1 = net.accept_step(l).unwrap();
        }
        assert!(Instant::now() < deadline, "Y and the first accept");
    }
    let (mut sx, mut r2) = (None, None);
    while sx.is_none() || r2.is_none() {
        if sx.is_none() {
            sx = net.connect_step(0, &mut hx).unwrap();
        }
        if r2.is_none() {
            r2 = net.accept_step(l).unwrap();
        }
        assert!(Instant::now() < deadline, "X and the second accept");
    }
    net.close_listen(l).unwrap();
    let (sx, sy, r1, r2) = (sx.unwrap(), sy.unwrap(), r1.unwrap(), r2.unwrap());
    let out = pattern(LEN, 23);
    let mut a = vec![0u8; LEN];
    let mut b = vec![0u8; LEN];
    // SAFETY: buffers outlive the requests.
    let q1 = unsafe { net.irecv(r1, &[buf(&mut a)], false, true) }.unwrap();
    // SAFETY: as above.
    let q2 = unsafe { net.irecv(r2, &[buf(&mut b)], false, true) }.unwrap();
    // Different sizes, so that the two connections' counts differ.
    // SAFETY: as above.
    let qx = unsafe { net.isend(sx, out.as_ptr(), LEN, 0, NULL, NULL) }.unwrap();
    // SAFETY: as above.
    let qy = unsafe { net.isend(sy, out.as_ptr(), LEN / 2, 0, NULL, NULL) }.unwrap();
    for q in [qx, qy, q1, q2] {
        wait(&net, q, 1);
    }
    let stats = ncclbpf_harness::read_conn_stats(std::process::id()).unwrap();
    for c in &stats {
        assert_eq!(
            c.send_bytes, c.recv_bytes,
            "connection {:#x}: its two ends are not one connection: {stats:?}",
            c.conn_id
        );
    }
    for c in [sx, sy] {
        net.close_send(c).unwrap();
    }
    for c in [r1, r2] {
        net.close_recv(c).unwrap();
    }
    net.finalize().unwrap();
}

#[test]
#[ignore = "open finding, too big to fix here: a listen comm has one side listener, and the \
            wrapper cannot tell which inner connection a side channel belongs to when several \
            connect to one listener (docs/guide/interposer.md, Limits)"]
fn two_connects_on_one_listener_each_get_their_own_side_channel() {
    let policy = ncclbpf_harness::shipped_policy("net_stats").expect("policies built");
    let policy = policy.to_string_lossy().into_owned();
    let policy: &'static str = Box::leak(policy.into_boxed_str());
    run(
        "two_connects_on_one_listener_each_get_their_own_side_channel",
        11,
        &[
            ("INNER_REF_CONFIG", "allow_null_mhandle=1,connect_delay=0"),
            ("NCCL_BPF_POLICY", policy),
        ],
        two_connects_on_one_listener_pair_their_own_side_channels,
    );
}
