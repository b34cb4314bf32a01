//! The wrapper in front of the reference inner plugin (tests/csrc/inner_ref*.c), which checks
//! every argument that reaches it: every pair of the version NCCL calls (v7 to v12) and the
//! version the inner plugin speaks (v6 to v12) moves data with the inner plugin's memory
//! handles, tags, multi-receives and profiler handles intact; the optional slots are offered
//! exactly when the inner plugin has them; injected failures reach NCCL as the inner plugin
//! reported them, and a request the inner plugin never completes is named by the stall
//! finder. Each inner version runs in a child process (the wrapper loads it once per process).

use ncclbpf_harness::anynet::{AnyNet, Obj, RecvBuf, slot};
use ncclbpf_harness::child::in_child;
use ncclbpf_harness::inner_ref::{RefChecks, path};
use ncclbpf_harness::{pattern, plugin_path, read_conn_stats};
use serde_json::Value;
use std::ffi::OsStr;
use std::process::Command;
use std::time::{Duration, Instant};

const CLEARED: [&str; 7] = [
    "NCCL_BPF_NET_INNER",
    "NCCL_BPF_POLICY",
    "NCCL_BPF_NET_POLICY",
    "NCCL_BPF_TUNER_POLICY",
    "NCCL_BPF_METRICS_ADDR",
    "INNER_REF_CONFIG",
    "INNER_REF_INJECT",
];
const NULL: Obj = Obj::NULL;
const OUTER: [u32; 6] = [7, 8, 9, 10, 11, 12];
const LEN: usize = 1 << 16;

/// A pair through the wrapper, polled until both ends are up (the side channel takes a TCP
/// handshake).
fn pair(net: &AnyNet) -> (Obj, Obj) {
    let (mut h, l) = net.listen(0).unwrap();
    let (mut s, mut r) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = net.connect_step(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = net.accept_step(l).unwrap();
        }
        assert!(Instant::now() < deadline, "connect/accept did not finish");
    }
    net.close_listen(l).unwrap();
    (s.unwrap(), r.unwrap())
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

fn inner_env(v: u32, extra: &[(&'static str, &'static OsStr)]) -> Vec<(&'static str, Box<OsStr>)> {
    let mut env: Vec<(&str, Box<OsStr>)> = vec![
        (
            "NCCL_BPF_NET_INNER",
            path(v).into_os_string().into_boxed_os_str(),
        ),
        ("NCCL_SOCKET_IFNAME", OsStr::new("lo").into()),
        ("NCCLBPF_TEST_INNER_V", OsStr::new(&v.to_string()).into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, Box::<OsStr>::from(*v))));
    env
}

fn run(name: &str, env: &[(&'static str, Box<OsStr>)], body: fn()) {
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, &**v)).collect();
    in_child(name, &env, &CLEARED, body);
}

fn inner_version() -> u32 {
    std::env::var("NCCLBPF_TEST_INNER_V")
        .unwrap()
        .parse()
        .unwrap()
}

/// One inner version, every outer version: the checks of the module comment.
fn forwards_everything() {
    let v = inner_version();
    let chk = RefChecks::open(v).unwrap();
    for ov in OUTER {
        let mut net = AnyNet::open(&plugin_path(), ov).unwrap();
        net.init(0x77, None).unwrap();
        // The optional slots are the inner plugin's.
        let has = |i: usize| net.raw(i) != 0;
        assert!(has(slot::REG_MR_DMABUF), "v{ov} over v{v}: regMrDmaBuf");
        assert_eq!(
            has(slot::GET_DEVICE_MR),
            v >= 7,
            "v{ov} over v{v}: getDeviceMr"
        );
        assert_eq!(
            has(slot::IRECV_CONSUMED),
            v >= 7,
            "v{ov} over v{v}: irecvConsumed"
        );
        if ov >= 9 {
            assert_eq!(
                has(slot::MAKE_VDEVICE),
                v >= 9,
                "v{ov} over v{v}: makeVDevice"
            );
        }
        let p = net.props(0).unwrap();
        assert_eq!(p.name, "ref0", "the inner plugin's device");
        assert_eq!(p.max_recvs, 8, "the inner plugin's maxRecvs");

        let (s, r) = pair(&net);
        let out = pattern(2 * LEN, u64::from(ov) << 8 | u64::from(v));
        let mut inb = vec![0u8; 2 * LEN];
        // SAFETY: both buffers outlive their registrations and every request below.
        let (smh, rmh) = unsafe {
            (
                net.reg_mr(s, out.as_ptr(), out.len(), 1).unwrap(),
                net.reg_mr(r, inb.as_ptr(), inb.len(), 1).unwrap(),
            )
        };
        // A phandle reaches an inner plugin of v10+ only from an NCCL of v10+.
        let ph = if ov >= 10 && v >= 10 {
            let ph = Obj::addr(0x5100 + ov as usize);
            chk.expect_phandle(ph);
            ph
        } else {
            NULL
        };
        // One message, tag 7.
        // SAFETY: as above.
        let rq = unsafe {
            net.irecv(
                r,
                &[RecvBuf {
                    data: inb.as_mut_ptr(),
                    size: LEN,
                    tag: 7,
                    mh: rmh,
                    ph,
                }],
                false,
                true,
            )
        }
        .unwrap();
        // SAFETY: as above.
        let sq = unsafe { net.isend(s, out.as_ptr(), LEN - 5, 7, smh, ph) }.unwrap();
        assert!(!rq.is_null() && !sq.is_null());
        assert_eq!(wait(&net, sq, 1), [LEN as i32 - 5]);
        assert_eq!(wait(&net, rq, 1), [LEN as i32 - 5], "the sent size");
        assert!(inb[..LEN - 5] == out[..LEN - 5]);
        if v >= 7 {
            net.irecv_consumed(r, 1, rq).unwrap();
        }
        chk.expect_phandle(NULL);
        // Two buffers in one receive, matched by tag: the send tagged 2 lands in the second.
        let (a, b) = inb.split_at_mut(LEN);
        // SAFETY: as above.
        let rq = unsafe {
            net.irecv(
                r,
                &[
                    RecvBuf {
                        data: a.as_mut_ptr(),
                        size: LEN,
                        tag: 1,
                        mh: rmh,
                        ph: NULL,
                    },
                    RecvBuf {
                        data: b.as_mut_ptr(),
                        size: LEN,
                        tag: 2,
                        mh: rmh,
                        ph: NULL,
                    },
                ],
                false,
                true,
            )
        }
        .unwrap();
        // SAFETY: as above.
        let s2 = unsafe { net.isend(s, out[LEN..].as_ptr(), 100, 2, smh, NULL) }.unwrap();
        // SAFETY: as above.
        let s1 = unsafe { net.isend(s, out.as_ptr(), 200, 1, smh, NULL) }.unwrap();
        wait(&net, s2, 1);
        wait(&net, s1, 1);
        assert_eq!(wait(&net, rq, 2), [200, 100]);
        assert!(inb[..200] == out[..200] && inb[LEN..LEN + 100] == out[LEN..LEN + 100]);
        net.dereg_mr(s, smh).unwrap();
        net.dereg_mr(r, rmh).unwrap();
        net.close_send(s).unwrap();
        net.close_recv(r).unwrap();
        net.finalize().unwrap();
    }
    assert_eq!(chk.violations(), 0, "{}", chk.violation_text());
    if v <= 10 {
        assert_eq!(
            chk.count("init"),
            1,
            "a v6-v10 plugin is initialised once per process"
        );
    }
    if v >= 7 {
        assert_eq!(chk.count("irecvConsumed"), OUTER.len() as i64);
    }
    for kind in ["send", "recv", "listen", "mr", "req"] {
        assert_eq!(chk.live(kind), 0, "v{v}: {kind} left open by the wrapper");
    }
}

macro_rules! per_inner_version {
    ($($name:ident = $v:expr),*) => {$(
        #[test]
        fn $name() {
            run(stringify!($name), &inner_env($v, &[]), forwards_everything);
        }
    )*};
}

per_inner_version!(
    every_outer_version_over_inner_v6 = 6,
    every_outer_version_over_inner_v7 = 7,
    every_outer_version_over_inner_v8 = 8,
    every_outer_version_over_inner_v9 = 9,
    every_outer_version_over_inner_v10 = 10,
    every_outer_version_over_inner_v11 = 11,
    every_outer_version_over_inner_v12 = 12
);

/// The inner plugin says "try again" (a NULL request): so does the wrapper, and nothing is
/// counted for it; its `test` fails: the wrapper returns that code and counts the error.
#[test]
fn the_inner_plugin_s_answers_reach_nccl_and_are_counted() {
    let policy = ncclbpf_harness::shipped_policy("net_stats").expect("policies built");
    let env = inner_env(
        11,
        &[("INNER_REF_CONFIG", OsStr::new("allow_null_mhandle=1"))],
    );
    let mut env = env;
    env.push((
        "NCCL_BPF_POLICY",
        policy.into_os_string().into_boxed_os_str(),
    ));
    run(
        "the_inner_plugin_s_answers_reach_nccl_and_are_counted",
        &env,
        || {
            let chk = RefChecks::open(11).unwrap();
            let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
            net.init(0x78, None).unwrap();
            let (s, r) = pair(&net);
            let out = pattern(LEN, 3);
            let mut inb = vec![0u8; LEN];
            let buf = |inb: &mut Vec<u8>| RecvBuf {
                data: inb.as_mut_ptr(),
                size: LEN,
                tag: 0,
                mh: NULL,
                ph: NULL,
            };
            chk.inject("isend_null", 0);
            // SAFETY: buffers outlive the requests.
            let none = unsafe { net.isend(s, out.as_ptr(), 10, 0, NULL, NULL) }.unwrap();
            assert!(
                none.is_null(),
                "the inner plugin's 'try again' passes through"
            );
            // SAFETY: as above.
            let rq = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
            // SAFETY: as above.
            let sq = unsafe { net.isend(s, out.as_ptr(), 10, 0, NULL, NULL) }.unwrap();
            wait(&net, sq, 1);
            wait(&net, rq, 1);
            chk.inject("test_error", 0);
            // SAFETY: as above.
            let rq = unsafe { net.irecv(r, &[buf(&mut inb)], false, true) }.unwrap();
            assert_eq!(
                net.test(rq, 1).unwrap_err(),
                6,
                "ncclRemoteError, as the inner plugin said"
            );
            let stats = read_conn_stats(std::process::id()).unwrap();
            let sends: u64 = stats.iter().map(|s| s.sends).sum();
            let errors: u64 = stats.iter().map(|s| s.errors).sum();
            assert_eq!(sends, 1, "the NULL request was not a send: {stats:?}");
            assert_eq!(errors, 1, "{stats:?}");
            // Testing that request again is the caller's misuse: an error, never a crash.
            assert!(net.test(rq, 1).is_err());
        },
    );
}

/// A request the inner plugin never completes: `ncclbpf status` names the wrapper's
/// connection, with the id both ends share (over the side channel) and the pending request.
#[test]
fn a_request_the_inner_plugin_hangs_is_named_by_the_stall_finder() {
    let shm = std::env::temp_dir().join(format!("ncclbpf-ref-stall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&shm);
    let mut env = inner_env(
        11,
        &[("INNER_REF_CONFIG", OsStr::new("allow_null_mhandle=1"))],
    );
    env.push((
        "NCCL_BPF_SHM_DIR",
        shm.clone().into_os_string().into_boxed_os_str(),
    ));
    run(
        "a_request_the_inner_plugin_hangs_is_named_by_the_stall_finder",
        &env,
        || {
            let chk = RefChecks::open(11).unwrap();
            let mut net = AnyNet::open(&plugin_path(), 12).unwrap();
            net.init(0x79, None).unwrap();
            let (s, r) = pair(&net);
            let mut inb = vec![0u8; LEN];
            chk.inject("hang_recv", 0);
            // SAFETY: the buffer is leaked: the request never completes.
            let rq = unsafe {
                net.irecv(
                    r,
                    &[RecvBuf {
                        data: inb.as_mut_ptr(),
                        size: LEN,
                        tag: 0,
                        mh: NULL,
                        ph: NULL,
                    }],
                    false,
                    true,
                )
            }
            .unwrap();
            std::mem::forget(inb);
            assert!(net.test(rq, 1).unwrap().is_none());
            std::thread::sleep(Duration::from_millis(1500));
            let out = Command::new(ncclbpf_harness::cli_path())
                .args([
                    "status",
                    "--stall-after",
                    "1",
                    "--json",
                    &std::process::id().to_string(),
                ])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert_eq!(
                out.status.code(),
                Some(1),
                "a stalled connection is exit 1: {text}"
            );
            let v: Value = serde_json::from_str(&text).unwrap();
            let stalled = v["stalled"].as_array().unwrap();
            assert_eq!(stalled.len(), 1, "{text}");
            assert_eq!(stalled[0]["direction"], "recv", "{text}");
            assert_eq!(stalled[0]["pending"], 1, "{text}");
            assert_eq!(
                stalled[0]["peer_addr"], "127.0.0.1",
                "the side channel's peer: {text}"
            );
            let conns = v["processes"][0]["connections"].as_array().unwrap();
            assert_eq!(conns.len(), 2, "{text}");
            assert_eq!(
                conns[0]["conn_id"], conns[1]["conn_id"],
                "one id for both ends: {text}"
            );
            let _ = s;
        },
    );
    let _ = std::fs::remove_dir_all(&shm);
}
