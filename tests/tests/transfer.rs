//! Messages of every interesting size, through every exported ABI version, contents checked.

use ncclbpf_harness::{Net, VERSIONS, pattern};
use std::time::Duration;

const SIZES: [usize; 11] = [
    0,
    1,
    127,
    128,
    129,
    4095,
    65535,
    65536,
    65537,
    1 << 20,
    64 << 20,
];

#[test]
fn newest_version_is_picked_by_default() {
    let n = Net::open(None).unwrap();
    assert_eq!(n.version, 12);
    assert_eq!(n.name(), "BPF");
}

#[test]
fn properties_look_like_socket() {
    for v in VERSIONS {
        let n = Net::ready(Some(v));
        let p = n.props(0).unwrap();
        assert_eq!(p.name, "lo", "v{v}");
        assert_eq!(p.ptr_support, 1, "host memory only");
        assert_eq!(p.max_recvs, 1);
        assert_eq!(p.max_comms, 65536);
        assert_eq!(p.net_device_type, 0, "HOST");
        assert!(p.speed > 0);
        if v >= 9 {
            // No larger than what test() can report in its int sizes.
            assert_eq!(p.max_p2p_bytes, Some(i32::MAX as usize));
        }
        assert!(n.props(99).is_err(), "bad device index is an error");
    }
}

#[test]
fn all_sizes_every_version() {
    for v in VERSIONS {
        let n = Net::ready(Some(v));
        let (s, r) = n.connect_pair(0).unwrap();
        for (i, &size) in SIZES.iter().enumerate() {
            let data = pattern(size, i as u64 + u64::from(v) * 100);
            let got = n.transfer(s, r, &data, size + 7).unwrap();
            assert!(got == data, "v{v}: {size} bytes corrupted");
        }
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}

#[test]
fn random_sizes_and_exact_fit() {
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).unwrap();
    let mut x: u64 = 0x1234_5678;
    for i in 0..60 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let size = (x >> 40) as usize % (3 << 20);
        let data = pattern(size, i);
        let cap = if i % 2 == 0 {
            size
        } else {
            size + (x as usize % 1000)
        };
        assert!(
            n.transfer(s, r, &data, cap).unwrap() == data,
            "random size {size}"
        );
    }
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
}

#[test]
fn thirty_two_outstanding_requests_complete_in_order() {
    for v in [12, 8] {
        let n = Net::ready(Some(v));
        let (s, r) = n.connect_pair(0).unwrap();
        let sizes: Vec<usize> = (0..32)
            .map(|i| [0, 100, 20_000, 300_000][i % 4] + i)
            .collect();
        let data: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &l)| pattern(l, i as u64))
            .collect();
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&l| vec![0u8; l + 64]).collect();
        let mut rreq = vec![];
        let mut sreq = vec![];
        for i in 0..32 {
            // SAFETY: buffers live until every request is waited for below.
            rreq.push(
                unsafe { n.irecv(r, bufs[i].as_mut_ptr(), bufs[i].len(), false) }
                    .unwrap()
                    .expect("32 receives fit"),
            );
            // SAFETY: as above.
            sreq.push(
                unsafe { n.isend(s, data[i].as_ptr(), data[i].len()) }
                    .unwrap()
                    .expect("32 sends fit"),
            );
        }
        for i in 0..32 {
            assert_eq!(
                n.wait(sreq[i], Duration::from_secs(30)).unwrap() as usize,
                sizes[i]
            );
        }
        for i in 0..32 {
            assert_eq!(
                n.wait(rreq[i], Duration::from_secs(30)).unwrap() as usize,
                sizes[i],
                "v{v} req {i}"
            );
            assert!(
                bufs[i][..sizes[i]] == data[i][..],
                "v{v} message {i} matched out of order or corrupted"
            );
        }
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}

#[test]
fn hint_in_request_and_null_sizes() {
    for v in [9, 10, 11, 12] {
        let n = Net::ready(Some(v));
        let (s, r) = n.connect_pair(0).unwrap();
        let data = pattern(1000, 5);
        let mut out = vec![0u8; 1000];
        // SAFETY: buffers outlive the requests.
        let rr = unsafe { n.irecv(r, out.as_mut_ptr(), 1000, true) }
            .unwrap()
            .unwrap();
        // SAFETY: as above: what the call reads and writes outlives it.
        let sr = unsafe { n.isend(s, data.as_ptr(), 1000) }.unwrap().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let (mut sd, mut rd) = (false, false);
        while !(sd && rd) {
            sd = sd || n.test(sr, false).unwrap().is_some();
            rd = rd || n.test(rr, false).unwrap().is_some();
            assert!(std::time::Instant::now() < deadline);
        }
        assert_eq!(out, data);
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}

#[test]
fn sixty_four_comms_at_once() {
    let n = Net::ready(None);
    let pairs: Vec<_> = (0..64).map(|_| n.connect_pair(0).unwrap()).collect();
    let data: Vec<Vec<u8>> = (0..64)
        .map(|i| pattern(100_000 + i * 13, i as u64))
        .collect();
    let mut outs: Vec<Vec<u8>> = (0..64).map(|_| vec![0u8; 200_000]).collect();
    let mut reqs = vec![];
    for (i, (s, r)) in pairs.iter().enumerate() {
        // SAFETY: buffers outlive the requests.
        let rr = unsafe { n.irecv(*r, outs[i].as_mut_ptr(), 200_000, false) }
            .unwrap()
            .unwrap();
        // SAFETY: as above: what the call reads and writes outlives it.
        let sr = unsafe { n.isend(*s, data[i].as_ptr(), data[i].len()) }
            .unwrap()
            .unwrap();
        reqs.push((sr, rr));
    }
    for (i, (sr, rr)) in reqs.into_iter().enumerate() {
        n.wait(sr, Duration::from_secs(30)).unwrap();
        assert_eq!(
            n.wait(rr, Duration::from_secs(30)).unwrap() as usize,
            data[i].len()
        );
        assert!(outs[i][..data[i].len()] == data[i][..], "comm {i}");
    }
    for (s, r) in pairs {
        n.close_send(s).unwrap();
        n.close_recv(r).unwrap();
    }
}

#[test]
fn threads_drive_their_own_comms_concurrently() {
    let n = std::sync::Arc::new(Net::ready(None));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let n = n.clone();
            std::thread::spawn(move || {
                let (s, r) = n.connect_pair(0).unwrap();
                for i in 0..20 {
                    let data = pattern(1 + (i * 37_777 + t * 1000) % 500_000, (t * 100 + i) as u64);
                    assert!(n.transfer(s, r, &data, 600_000).unwrap() == data);
                }
                n.close_send(s).unwrap();
                n.close_recv(r).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn sender_and_receiver_on_different_threads() {
    // As in NCCL, the two ends live in different proxies; here, different threads.
    let n = std::sync::Arc::new(Net::ready(None));
    let (s, r) = n.connect_pair(0).unwrap();
    let msgs: Vec<Vec<u8>> = (0..50)
        .map(|i| pattern(i * 40_001 % 3_000_000, i as u64))
        .collect();
    let expect = msgs.clone();
    let n2 = n.clone();
    let tx = std::thread::spawn(move || {
        for m in &msgs {
            // SAFETY: m outlives the wait.
            let req = loop {
                // SAFETY: as above: what the call reads and writes outlives it.
                if let Some(q) = unsafe { n2.isend(s, m.as_ptr(), m.len()) }.unwrap() {
                    break q;
                }
            };
            n2.wait(req, Duration::from_secs(30)).unwrap();
        }
    });
    let mut buf = vec![0u8; 3_000_000];
    for m in &expect {
        // SAFETY: buf outlives the wait.
        let req = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
            .unwrap()
            .unwrap();
        let got = n.wait(req, Duration::from_secs(30)).unwrap() as usize;
        assert_eq!(got, m.len());
        assert!(buf[..got] == m[..]);
    }
    tx.join().unwrap();
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
}

#[test]
fn v11_contexts_are_per_communicator() {
    let mut a = Net::ready(Some(11));
    let mut b = Net::ready(Some(12));
    let mut attr = ncclnet_headers::net::NetAttr {
        send_comm_attr: ncclnet_headers::net::NetCommAttr {
            max_concurrent_peers: 2,
            min_concurrent_peers: 1,
            max_flows_per_peer: 4,
            min_flows_per_peer: 1,
        },
        recv_comm_attr: ncclnet_headers::net::NetCommAttr {
            max_concurrent_peers: -1,
            min_concurrent_peers: -1,
            max_flows_per_peer: -1,
            min_flows_per_peer: -1,
        },
        op: 1 << 4,
        algo: 1 << 1,
        proto: 1 << 2,
    };
    assert_eq!(a.set_net_attr(&mut attr), Some(Ok(())));
    let (s, r) = a.connect_pair(0).unwrap();
    assert_eq!(a.transfer(s, r, b"ctx", 3).unwrap(), b"ctx");
    a.close_send(s).unwrap();
    a.close_recv(r).unwrap();
    a.finalize().unwrap();
    // Another communicator's context keeps working after the first is finalized.
    let (s, r) = b.connect_pair(0).unwrap();
    assert_eq!(b.transfer(s, r, b"still", 5).unwrap(), b"still");
    b.close_send(s).unwrap();
    b.close_recv(r).unwrap();
    b.finalize().unwrap();
}

#[test]
fn register_host_memory_only() {
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: s and r are live comms.
    let mh = unsafe { n.reg_mr(s.0, buf.as_mut_ptr().cast(), 64, 1) }.unwrap();
    assert!(!mh.is_null(), "regMr always writes a handle");
    assert!(
        // SAFETY: r is a live comm.
        unsafe { n.reg_mr(r.0, buf.as_mut_ptr().cast(), 64, 2) }.is_err(),
        "CUDA memory is refused"
    );
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
}
