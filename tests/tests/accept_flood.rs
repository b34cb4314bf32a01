//! A listener survives a flood of silent connections with the process out of descriptors:
//! `accept` treats EMFILE as "later", not as a dead listener, and stale strangers give their
//! descriptors to a real connection. Its own test binary, because it lowers the process's
//! descriptor limit.

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

/// Both tests lower the process's descriptor limit: one at a time.
fn nofile_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

#[test]
fn accept_survives_a_flood_of_silent_connections_near_the_fd_limit() {
    let _turn = nofile_turn();
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

/// Strangers that hold every descriptor the listener can get (the process at its limit)
/// do not make a real connection wait until their handshake times out: once they are stale
/// (1 s in their handshake), each gives its descriptor to a stream waiting in the backlog.
/// Before, the real connection waited in the backlog for NCCL_BPF_HANDSHAKE_TIMEOUT.
#[test]
fn a_real_connection_does_not_wait_for_strangers_holding_every_descriptor() {
    let _turn = nofile_turn();
    let n = Net::ready(None);
    let (mut h, l) = n.listen(0).unwrap();
    let port = u16::from_le_bytes([h[18], h[19]]);
    let ip = Ipv4Addr::new(h[20], h[21], h[22], h[23]);
    let strangers: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(SocketAddr::from((ip, port))).unwrap())
        .collect();
    for _ in 0..5 {
        assert!(n.accept_step(l).unwrap().is_none());
    }
    // The listener holds them all; they go stale.
    std::thread::sleep(Duration::from_millis(1100));
    // Room for the connector's 5 sockets and 2 more: the listener runs out while taking the
    // real connection's streams.
    let old = set_nofile(open_fds() + 7);
    let t0 = Instant::now();
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = n.connect_step(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = n.accept_step(l).unwrap();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no connection in 30 s"
        );
        std::thread::sleep(Duration::from_micros(500));
    }
    let waited = t0.elapsed();
    set_nofile(old);
    eprintln!("a real connection with 40 stale strangers holding the descriptors: {waited:?}");
    assert!(
        waited < Duration::from_secs(3),
        "the real connection waited {waited:?} (the strangers' handshake timeout?)"
    );
    let data = ncclbpf_harness::pattern(4096, 9);
    assert_eq!(
        n.transfer(s.unwrap(), r.unwrap(), &data, 4096).unwrap(),
        data
    );
    drop(strangers);
}
