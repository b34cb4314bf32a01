//! What bad input gets: errors with the code NCCL expects, never a crash, a hang or a silent cut.

use ncclbpf_harness::{Net, pattern};
use std::time::{Duration, Instant};

#[test]
fn receive_smaller_than_message_is_an_error_not_a_cut() {
    for (size, cap) in [(100usize, 99usize), (1 << 20, 65536), (10, 0)] {
        let n = Net::ready(None);
        let (s, r) = n.connect_pair(0).unwrap();
        let data = pattern(size, 1);
        let mut buf = vec![0u8; cap + 16];
        let canary = buf.clone();
        // SAFETY: buffers outlive the requests.
        let rq = unsafe { n.irecv(r, buf.as_mut_ptr(), cap, false) }
            .unwrap()
            .unwrap();
        // SAFETY: as above.
        let sq = unsafe { n.isend(s, data.as_ptr(), size) }.unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = loop {
            let _ = n.test(sq, true);
            match n.test(rq, true) {
                Err(e) => break e,
                Ok(Some(got)) => panic!("receive of {size} into {cap} completed with {got}"),
                Ok(None) => assert!(Instant::now() < deadline, "truncation never reported"),
            }
        };
        assert_eq!(err.name(), "ncclInvalidUsage");
        assert!(buf[cap..] == canary[cap..], "wrote past the posted size");
        assert!(ncclbpf_harness::log_text().contains("message truncated"));
        // The comm is unusable afterwards, and says so instead of hanging.
        // SAFETY: buffer outlives the call.
        assert!(unsafe { n.irecv(r, buf.as_mut_ptr(), cap, false) }.is_err());
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}

#[test]
fn garbage_handle_makes_connect_fail() {
    let n = Net::ready(None);
    for fill in [0u8, 0xa5, 0xff] {
        let mut h = [fill; 128];
        let e = n.connect_step(0, &mut h).unwrap_err();
        assert_eq!(e.name(), "ncclInvalidUsage");
    }
    let mut x = 7u64;
    for _ in 0..200 {
        let mut h = [0u8; 128];
        for b in h.iter_mut() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            *b = (x >> 56) as u8;
        }
        assert!(n.connect_step(0, &mut h).is_err());
    }
    assert!(ncclbpf_harness::log_text().contains("bad connection handle"));
}

#[test]
fn handle_whose_listener_is_gone_makes_connect_fail() {
    let n = Net::ready(None);
    let (mut h, l) = n.listen(0).unwrap();
    n.close_listen(l).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let e = loop {
        match n.connect_step(0, &mut h) {
            Err(e) => break e,
            Ok(Some(_)) => panic!("connected to a closed listener"),
            Ok(None) => assert!(
                Instant::now() < deadline,
                "connect to a closed listener never failed"
            ),
        }
    };
    assert_eq!(e.name(), "ncclSystemError");
    assert!(ncclbpf_harness::log_text().contains("listener is gone"));
}

#[test]
fn peer_close_fails_pending_receive() {
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).unwrap();
    let mut buf = vec![0u8; 1000];
    // SAFETY: buf outlives the request.
    let q = unsafe { n.irecv(r, buf.as_mut_ptr(), 1000, false) }
        .unwrap()
        .unwrap();
    assert_eq!(n.test(q, true).unwrap(), None);
    n.close_send(s).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let e = loop {
        match n.test(q, true) {
            Err(e) => break e,
            Ok(Some(_)) => panic!("receive completed without data"),
            Ok(None) => assert!(Instant::now() < deadline),
        }
    };
    assert_eq!(e.name(), "ncclRemoteError");
    n.close_recv(r).unwrap();
}

#[test]
fn closing_with_requests_in_flight_does_not_hang() {
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).unwrap();
    let data = pattern(32 << 20, 2);
    // Nobody receives: the helper threads block in write until close shuts the sockets.
    // SAFETY: data outlives the close below, after which nothing touches it.
    let _q = unsafe { n.isend(s, data.as_ptr(), data.len()) }
        .unwrap()
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn requests_beyond_the_slots_ask_to_retry() {
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).unwrap();
    let mut buf = vec![0u8; 8];
    let mut posted = 0;
    // SAFETY: buf outlives every request (the comm is closed with them pending).
    while let Some(_q) = unsafe { n.irecv(r, buf.as_mut_ptr(), 8, false) }.unwrap() {
        posted += 1;
        assert!(posted <= 1024, "no limit on outstanding requests");
    }
    assert!(posted >= 32, "only {posted} outstanding receives");
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
}

#[test]
fn bad_arguments_are_errors() {
    let n = Net::ready(None);
    assert!(
        n.listen(42).is_err(),
        "listen on a device that does not exist"
    );
    let mut h = [0u8; 128];
    assert!(n.connect_step(-1, &mut h).is_err());
}

#[test]
fn sizes_nccl_cannot_mean_are_invalid_arguments_and_the_comm_carries_on() {
    for v in [7, 9, 10, 12] {
        let n = Net::ready(Some(v));
        let (s, r) = n.connect_pair(0).unwrap();
        let mut small = vec![0u8; 64];
        let over = i32::MAX as usize + 1;
        // SAFETY: every call below is refused before the buffer is touched (the sizes are
        // checked first); the one buffer passed is 64 bytes and outlives the calls.
        let refused = unsafe {
            [
                n.isend(s, std::ptr::null(), 100).map(|_| ()),
                n.isend(s, small.as_ptr(), over).map(|_| ()),
                n.irecv(r, std::ptr::null_mut(), 100, false).map(|_| ()),
                n.irecv(r, small.as_mut_ptr(), over, false).map(|_| ()),
            ]
        };
        for (k, e) in refused.into_iter().enumerate() {
            let e = e.expect_err(&format!("v{v}: call {k} accepted"));
            assert_eq!(e.name(), "ncclInvalidArgument", "v{v}: call {k}");
        }
        // (Versions whose sizes are `int` receive the oversized count as a negative one.)
        let log = ncclbpf_harness::log_text();
        assert!(log.contains("over maxP2pBytes") || log.contains("negative size"));
        assert!(ncclbpf_harness::log_text().contains("NULL buffer"));
        // Nothing was taken: the comm still moves data, and a NULL buffer of 0 bytes is fine.
        let data = pattern(1000, 3);
        assert_eq!(n.transfer(s, r, &data, 1000).unwrap(), data);
        assert_eq!(n.transfer(s, r, &[], 0).unwrap(), Vec::<u8>::new());
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}
