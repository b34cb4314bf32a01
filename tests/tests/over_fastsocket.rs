//! The wrapper over a real third-party plugin, Google's nccl-fastsocket (ncclNet v6, host
//! memory, TCP), run by hand: fastsocket is built outside the repository (the command is in
//! bench/results/cpu-2026-12-07-harness-over-fastsocket.md) and never in CI. Every test is
//! ignored; run them with
//!
//! ```text
//! NCCL_BPF_NET_INNER=/abs/libnccl-net-fastsocket.so \
//!   cargo test --release -p ncclbpf-harness --test over_fastsocket -- --ignored --test-threads=1
//! ```
//!
//! What fastsocket does differently from our sockets, and what these tests hold to:
//! * its `test` never writes the received size: the wrapper reports the posted size then, so
//!   the receives here are posted exactly as large as the message (NCCL itself, loading
//!   fastsocket directly, reads 0 there);
//! * its `connect` returns before its connection is up (a thread finishes it): a first send
//!   right after `connect` can fail inside fastsocket ("Socket operation on non-socket") when
//!   its flow placement is on (the default); these tests turn it off
//!   (`NCCL_FLOW_PLACEMENT_ENABLE=0`, fastsocket's own setting), which connects in the call;
//! * it holds 16 requests per connection (NCCL keeps at most 8 steps in flight).

use ncclbpf_harness::{Net, VERSIONS, log_text, pattern};
use std::sync::Once;
use std::time::Duration;

fn ready(v: u32) -> Net {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        assert!(
            std::env::var("NCCL_BPF_NET_INNER").is_ok_and(|p| p.contains("fastsocket")),
            "set NCCL_BPF_NET_INNER to the fastsocket library (see this file's header)"
        );
        // SAFETY: once, before the plugin (which reads the environment) is loaded.
        unsafe { std::env::set_var("NCCL_FLOW_PLACEMENT_ENABLE", "0") };
    });
    let n = Net::ready(Some(v));
    let log = log_text();
    assert!(
        log.contains("traffic carried by inner net plugin 'FastSocket' (ncclNetPlugin_v6"),
        "{log}"
    );
    n
}

#[test]
#[ignore = "needs a fastsocket build (NCCL_BPF_NET_INNER); see the file's header"]
fn every_version_moves_every_size_intact() {
    let sizes = [
        0usize,
        1,
        127,
        4095,
        65_536,
        65_537,
        1 << 20,
        (3 << 20) + 7,
        64 << 20,
    ];
    for v in VERSIONS {
        let n = ready(v);
        let (s, r) = n.connect_pair(0).unwrap();
        for (k, &len) in sizes.iter().enumerate() {
            let data = pattern(len, u64::from(v) << 8 | k as u64);
            assert!(
                n.transfer(s, r, &data, len).unwrap() == data,
                "v{v}: {len} bytes"
            );
        }
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}

/// A receive larger than its message: fastsocket leaves the size unwritten, the wrapper
/// reports what was posted, the message's bytes arrive.
#[test]
#[ignore = "needs a fastsocket build (NCCL_BPF_NET_INNER); see the file's header"]
fn a_larger_receive_reports_the_posted_size() {
    let n = ready(12);
    let (s, r) = n.connect_pair(0).unwrap();
    let data = pattern(10, 3);
    let mut buf = vec![0u8; 1000];
    // SAFETY: both buffers outlive the requests, waited for below.
    let rq = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sq = unsafe { n.isend(s, data.as_ptr(), data.len()) }
        .unwrap()
        .unwrap();
    assert_eq!(n.wait(sq, Duration::from_secs(20)).unwrap(), 10);
    assert_eq!(n.wait(rq, Duration::from_secs(20)).unwrap(), 1000);
    assert_eq!(&buf[..10], &data[..]);
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
}

/// Sixteen requests in flight each way (fastsocket's limit) complete in order, intact.
#[test]
#[ignore = "needs a fastsocket build (NCCL_BPF_NET_INNER); see the file's header"]
fn sixteen_requests_in_flight_complete_in_order() {
    for v in [12, 8] {
        let n = ready(v);
        let (s, r) = n.connect_pair(0).unwrap();
        let sizes: Vec<usize> = (0..16)
            .map(|i| [1, 100, 20_000, 300_000][i % 4] + i)
            .collect();
        let data: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &l)| pattern(l, i as u64))
            .collect();
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&l| vec![0u8; l]).collect();
        let mut reqs = vec![];
        for i in 0..16 {
            // SAFETY: buffers live until every request is waited for below.
            let rq = unsafe { n.irecv(r, bufs[i].as_mut_ptr(), bufs[i].len(), false) }
                .unwrap()
                .expect("16 receives fit");
            // SAFETY: as above.
            let sq = unsafe { n.isend(s, data[i].as_ptr(), data[i].len()) }
                .unwrap()
                .expect("16 sends fit");
            reqs.push((sq, rq));
        }
        for (i, (sq, rq)) in reqs.into_iter().enumerate() {
            assert_eq!(
                n.wait(sq, Duration::from_secs(30)).unwrap() as usize,
                sizes[i]
            );
            assert_eq!(
                n.wait(rq, Duration::from_secs(30)).unwrap() as usize,
                sizes[i]
            );
        }
        assert!(bufs == data, "v{v}: data changed");
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}
