//! A listener under a flood of strangers: which streams it keeps, and how long a real
//! connection waits.
use super::*;
use crate::wire::{HANDLE_SIZE, Shape};
use std::net::TcpStream;
use std::time::Instant;

const SHAPE: Shape = Shape {
    nstreams: 4,
    inline_bytes: 64 * 1024,
    min_chunk: 64 * 1024,
};

/// What a stranger sends before it falls silent.
#[derive(Clone, Copy, Debug)]
enum Stranger {
    Silent,
    OneByte,
    /// A whole hello for the listener (its id is public): it then waits for a proof.
    Hello,
}

fn stranger(addr: std::net::SocketAddr, nonce: u64, kind: Stranger) -> Option<TcpStream> {
    use std::io::Write;
    let mut s = TcpStream::connect(addr).ok()?;
    let _ = match kind {
        Stranger::Silent => Ok(()),
        Stranger::OneByte => s.write_all(&[0x4e]),
        Stranger::Hello => s.write_all(
            &crate::wire::Hello {
                nonce,
                conn_id: random_u64(),
                index: 0,
                nstreams: SHAPE.nstreams,
                challenge: [0; 16],
            }
            .encode(),
        ),
    };
    Some(s)
}

/// How long a real connection took to be made (connect and accept polled in turn, as NCCL's
/// proxies do) with `n` strangers of `kind` already taken by the listener and `n` more arriving
/// meanwhile.
fn wait_under(n: usize, kind: Stranger) -> Duration {
    let mut handle = [0u8; HANDLE_SIZE];
    let ep = Endpoint::default();
    let mut l = listen(ep, "127.0.0.1:0".parse().unwrap(), SHAPE, &mut handle).unwrap();
    let addr = l.local_addr().unwrap();
    let nonce = crate::wire::Handle::decode(&handle).unwrap().nonce;
    let _held: Vec<TcpStream> = (0..n).filter_map(|_| stranger(addr, nonce, kind)).collect();
    for _ in 0..4 {
        assert!(l.accept().unwrap().is_none());
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let more = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let v: Vec<_> = (0..n).filter_map(|_| stranger(addr, nonce, kind)).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            v
        })
    };
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(more.join());
    took
}

/// The figures in the README's security section ("Under a flood of strangers").
#[test]
#[ignore = "a measurement: run by name with --nocapture"]
fn real_connection_wait_under_a_flood() {
    for n in [0, 100, 256, 600] {
        for kind in [Stranger::Silent, Stranger::OneByte, Stranger::Hello] {
            eprintln!("{n} + {n} strangers ({kind:?}): {:?}", wait_under(n, kind));
        }
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
