//! Who joins a connection: streams are admitted first come, and a stranger or a replayed
//! hello never displaces a stream already admitted. (The keyed-MAC admission of issue 7 will
//! add its cases here.)

use ncclbpf_harness::Net;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A second stream for an index already admitted (a replayed hello) never replaces the first:
/// the listener drops the newcomer and keeps the stream that came first.
#[test]
fn a_duplicate_stream_never_replaces_the_first() {
    use std::io::{Read, Write};
    const HELLO_MAGIC: u64 = 0x4f4c_4c45_4846_5042; // the wire format's "BPFHELLO"
    let n = Net::ready(None);
    let (h, l) = n.listen(0).unwrap();
    let addr = SocketAddr::from((
        Ipv4Addr::new(h[20], h[21], h[22], h[23]),
        u16::from_le_bytes([h[18], h[19]]),
    ));
    let nonce = u64::from_le_bytes(h[8..16].try_into().unwrap());
    let nstreams = u32::from_le_bytes(h[36..40].try_into().unwrap());
    let hello = |index: u32| {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&nonce.to_le_bytes());
        b[16..24].copy_from_slice(&0x5eed_u64.to_le_bytes());
        b[24..28].copy_from_slice(&index.to_le_bytes());
        b[28..32].copy_from_slice(&nstreams.to_le_bytes());
        b
    };
    let open = |index: u32| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello(index)).unwrap();
        s
    };
    let first = open(0);
    for _ in 0..20 {
        assert!(n.accept_step(l).unwrap().is_none());
    }
    let second = open(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let closed = |mut s: &TcpStream| {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        matches!(s.read(&mut [0u8; 1]), Ok(0))
    };
    loop {
        assert!(n.accept_step(l).unwrap().is_none());
        if closed(&second) {
            break;
        }
        assert!(Instant::now() < deadline, "the duplicate was never dropped");
    }
    assert!(
        !closed(&first),
        "the first stream was replaced by the duplicate"
    );
    assert!(ncclbpf_harness::log_text().contains("duplicate stream 0"));
}
