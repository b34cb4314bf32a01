//! `NCCL_BPF_TIMEOUT` reaches every stream: keepalive on and `TCP_USER_TIMEOUT` set, on both
//! ends, so a dead peer host or link fails the stream. (Its own test binary: the setting is
//! read once per process, at `init`.)

use ncclbpf_harness::Net;

/// (keepalive, TCP_USER_TIMEOUT in ms) of every TCP socket of this process.
fn tcp_options() -> Vec<(bool, u32)> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let get = |level, opt| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt into a c_int of the given length; a non-socket fd just fails.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    level,
                    opt,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            (r == 0).then_some(v)
        };
        if get(libc::SOL_SOCKET, libc::SO_TYPE) != Some(libc::SOCK_STREAM) {
            continue;
        }
        if let (Some(ka), Some(uto)) = (
            get(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
        ) {
            out.push((ka != 0, uto as u32));
        }
    }
    out
}

#[test]
fn every_stream_of_a_connection_gets_the_dead_peer_timeout() {
    // SAFETY: set before any thread of this test binary's single test starts the plugin.
    unsafe { std::env::set_var("NCCL_BPF_TIMEOUT", "7") };
    let n = Net::ready(None);
    let (s, r) = n.connect_pair(0).unwrap();
    let set = tcp_options()
        .into_iter()
        .filter(|&(ka, uto)| ka && uto == 7000)
        .count();
    // Both ends of the control stream and of the 4 default data streams.
    assert!(
        set >= 10,
        "only {set} streams have keepalive and TCP_USER_TIMEOUT=7000"
    );
    let data = ncclbpf_harness::pattern(1 << 20, 5);
    assert_eq!(n.transfer(s, r, &data, 1 << 20).unwrap(), data);
}
