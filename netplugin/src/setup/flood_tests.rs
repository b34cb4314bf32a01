//! A listener under a flood of silent strangers: how long a real connection waits.
use super::*;
use crate::wire::{HANDLE_SIZE, Shape};
use std::net::TcpStream;
use std::time::Instant;

const SHAPE: Shape = Shape {
    nstreams: 4,
    inline_bytes: 64 * 1024,
    min_chunk: 64 * 1024,
};

/// Seconds a real connection took to connect and be accepted with `strangers` silent streams
/// (each sending `first` bytes of nothing useful) already at the listener.
fn wait_under(strangers: usize, first: usize) -> Duration {
    let mut handle = [0u8; HANDLE_SIZE];
    let ep = Endpoint::default();
    let mut l = listen(ep, "127.0.0.1:0".parse().unwrap(), SHAPE, &mut handle).unwrap();
    let addr = l.local_addr().unwrap();
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..strangers {
        let mut s = TcpStream::connect(addr).unwrap();
        use std::io::Write;
        if first == usize::MAX {
            // A whole hello for this listener (its id is public), then silence.
            let h = crate::wire::Hello {
                nonce: crate::wire::Handle::decode(&handle).unwrap().nonce,
                conn_id: random_u64(),
                index: 0,
                nstreams: SHAPE.nstreams,
                challenge: [0; 16],
            };
            let _ = s.write_all(&h.encode());
        } else if first > 0 {
            let _ = s.write_all(&vec![0u8; first]);
        }
        held.push(s);
    }
    // The listener sees them first, as it would if they came before the real connect.
    for _ in 0..4 {
        assert!(l.accept().unwrap().is_none());
    }
    // More keep coming while the real connection is made.
    let more = std::thread::spawn(move || {
        let mut v = Vec::new();
        for _ in 0..strangers {
            if let Ok(s) = TcpStream::connect(addr) {
                if first == usize::MAX {
                    use std::io::Write;
                    let h = crate::wire::Hello {
                        nonce: 0,
                        conn_id: random_u64(),
                        index: 0,
                        nstreams: SHAPE.nstreams,
                        challenge: [0; 16],
                    };
                    let _ = (&s).write_all(&h.encode());
                }
                v.push(s);
            }
        }
        std::thread::sleep(Duration::from_secs(15));
        v
    });
    let t0 = Instant::now();
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = connect(ep, &mut handle).unwrap();
        }
        if r.is_none() {
            r = l.accept().unwrap();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no connection in 30 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let took = t0.elapsed();
    drop(more);
    took
}

#[test]
#[ignore = "a measurement: run by name with --nocapture"]
fn real_connection_wait_under_a_flood() {
    for (n, first) in [
        (0, 0),
        (256, 0),
        (300, 0),
        (600, 1),
        (100, usize::MAX),
        (256, usize::MAX),
        (600, usize::MAX),
    ] {
        eprintln!(
            "{n} strangers sending {first} byte(s): {:?}",
            wait_under(n, first)
        );
    }
}

/// Whether the listener closed `s` (end of stream or reset), without waiting.
fn closed_by_listener(s: &TcpStream) -> bool {
    use std::io::Read;
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 64];
    let closed =
        !matches!((&*s).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    closed
}

/// A full listener (256 strangers that each sent one byte of a hello, long ago) makes room for
/// a stream that has just arrived and not sent its hello yet (a real connector's is one round
/// trip away on a real network) by dropping a stale stranger, not the newcomer. Before, the
/// strangers' byte ranked them above it and the real stream was dropped at once.
#[test]
fn a_fresh_stream_is_not_pushed_out_by_stale_strangers_that_sent_a_byte() {
    use std::io::Write;
    let mut handle = [0u8; HANDLE_SIZE];
    let mut l = listen(
        Endpoint::default(),
        "127.0.0.1:0".parse().unwrap(),
        SHAPE,
        &mut handle,
    )
    .unwrap();
    let addr = l.local_addr().unwrap();
    let strangers: Vec<TcpStream> = (0..accept::MAX_PENDING)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&[0x4e]).unwrap();
            s
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while l.pending() < accept::MAX_PENDING {
        assert!(l.accept().unwrap().is_none());
        assert!(Instant::now() < deadline, "strangers not taken");
    }
    for _ in 0..3 {
        assert!(l.accept().unwrap().is_none());
    }
    std::thread::sleep(Duration::from_millis(1100));
    let newcomer = TcpStream::connect(addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while strangers.iter().all(|s| !closed_by_listener(s)) {
        assert!(l.accept().unwrap().is_none());
        assert!(Instant::now() < deadline, "the newcomer never taken");
    }
    assert!(!closed_by_listener(&newcomer), "the newcomer was dropped");
    assert_eq!(
        strangers.iter().filter(|s| closed_by_listener(s)).count(),
        1,
        "one stale stranger made room"
    );
}
