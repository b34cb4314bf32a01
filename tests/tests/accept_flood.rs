//! A listener survives a flood of silent connections with the process out of descriptors:
//! `accept` treats EMFILE as "later", not as a dead listener. Its own test binary, because it
//! lowers the process's descriptor limit.

use ncclbpf_harness::Net;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn set_nofile(soft: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        let old = r.rlim_cur;
        r.rlim_cur = soft.min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        old
    }
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

#[test]
fn accept_survives_a_flood_of_silent_connections_near_the_fd_limit() {
    let n = Net::ready(None);
    let (mut h, l) = n.listen(0).unwrap();
    // The handle holds the listener's address (IPv4 on loopback: tag 4, port, octets).
    assert_eq!(h[16], 4, "loopback IPv4 listener");
    let port = u16::from_le_bytes([h[18], h[19]]);
    let ip = Ipv4Addr::new(h[20], h[21], h[22], h[23]);
    let strangers: Vec<TcpStream> = (0..60)
        .map(|_| TcpStream::connect(SocketAddr::from((ip, port))).unwrap())
        .collect();
    // Leave room for only a few more descriptors: accepting the flood runs out of them.
    let old = set_nofile(open_fds() + 8);
    for _ in 0..50 {
        let r = n.accept_step(l);
        assert!(r.is_ok(), "accept failed under EMFILE: {:?}", r.err());
        assert!(r.unwrap().is_none(), "a stranger became a connection");
    }
    assert!(
        ncclbpf_harness::log_text().contains("transient"),
        "EMFILE was never reached: the test did not test"
    );
    set_nofile(old);
    drop(strangers);
    // The listener still works: a real connection arrives.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = n.connect_step(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = n.accept_step(l).unwrap();
        }
        assert!(Instant::now() < deadline, "no connection after the flood");
    }
    let data = ncclbpf_harness::pattern(4096, 9);
    assert_eq!(
        n.transfer(s.unwrap(), r.unwrap(), &data, 4096).unwrap(),
        data
    );
}
