//! Who joins a connection. The harness plays the peer on the wire (`ncclbpf_harness::peer`):
//! honest peers that hold the handle's secret, strangers that know everything else (the
//! listener id travels in clear), replays of recorded streams, fake listeners. Every case ends
//! with a real connection on the same listener still working.

use ncclbpf_harness::peer::{self, Target};
use ncclbpf_harness::{ListenComm, Net, pattern};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Once;
use std::time::{Duration, Instant};

/// Short, so expiry is quick to see; every test of this binary runs with it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

fn net() -> Net {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        // SAFETY: before any plugin instance reads the environment (all tests come here first).
        unsafe { std::env::set_var("NCCL_BPF_HANDSHAKE_TIMEOUT", "2") };
    });
    Net::ready(None)
}

/// Polls `accept` until `done()` or the deadline; fails if a connection comes out of it.
fn pump_until(n: &Net, l: ListenComm, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            n.accept_step(l).unwrap().is_none(),
            "accept returned a connection nobody real made"
        );
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A real connect on `l`'s handle: the comm comes out of accept and carries 1 MiB intact.
fn real_connection_works(n: &Net, mut h: [u8; 128], l: ListenComm) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = n.connect_step(0, &mut h).unwrap();
        }
        if r.is_none() {
            r = n.accept_step(l).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the real connection never came up"
        );
    }
    let (s, r) = (s.unwrap(), r.unwrap());
    let data = pattern(1 << 20, 77);
    assert_eq!(n.transfer(s, r, &data, data.len()).unwrap(), data);
    n.close_send(s).unwrap();
    n.close_recv(r).unwrap();
}

fn run_peer<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(f)
}

fn wait_peer<T>(n: &Net, l: ListenComm, j: std::thread::JoinHandle<T>) -> T {
    pump_until(n, l, Duration::from_secs(10), || j.is_finished());
    j.join().unwrap()
}

/// The attack of the review: a stranger who knows the listener id connects first with a full
/// set of streams. It cannot answer the challenge, is turned away, and NCCL's real peer gets
/// the connection.
#[test]
fn a_stranger_with_the_listener_id_never_joins() {
    let n = net();
    let (h, l) = n.listen(0).unwrap();
    let t = Target::from_handle(&h);
    let nstreams = t.nstreams;
    let wrong_key = [0x42u8; 32];
    let tt = t.clone();
    let stranger = run_peer(move || {
        (0..=nstreams)
            .map(|i| peer::join(&tt, 0xbad, i, &wrong_key).unwrap())
            .collect::<Vec<_>>()
    });
    let streams = wait_peer(&n, l, stranger);
    assert!(
        streams.iter().all(|o| !o.acceptor_proved),
        "a wrong key never verifies the listener's proof"
    );
    pump_until(&n, l, Duration::from_secs(5), || {
        streams.iter().all(|o| peer::closed_by_peer(&o.stream))
    });
    real_connection_works(&n, h, l);
    let log = ncclbpf_harness::log_text();
    assert!(
        log.contains(&format!("listener {} turned away", t.addr))
            && log.contains("failed the challenge"),
        "{log}"
    );
    n.close_listen(l).unwrap();
}

/// A recorded stream (hello and a proof that was valid once) replayed while the real
/// connection is still coming together: turned away, and the real stream keeps its place.
#[test]
fn a_replayed_stream_is_turned_away_and_disturbs_nothing() {
    let n = net();
    let (h, l) = n.listen(0).unwrap();
    let t = Target::from_handle(&h);
    let tt = t.clone();
    // An honest peer opens every data stream of connection 0x600d, not yet the control one.
    let honest = run_peer(move || {
        (0..tt.nstreams)
            .map(|i| peer::join(&tt, 0x600d, i, &tt.secret).unwrap())
            .collect::<Vec<_>>()
    });
    let streams = wait_peer(&n, l, honest);
    assert!(
        streams.iter().all(|o| o.acceptor_proved),
        "the listener proves the secret"
    );
    // Replay stream 0's bytes on a new TCP connection.
    let recorded = streams[0].sent.clone();
    let addr = t.addr;
    let replay = run_peer(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&recorded[..peer::HELLO_SIZE]).unwrap();
        let mut reply = [0u8; peer::REPLY_SIZE];
        s.read_exact(&mut reply).unwrap();
        s.write_all(&recorded[peer::HELLO_SIZE..]).unwrap();
        s
    });
    let replayed = wait_peer(&n, l, replay);
    pump_until(&n, l, Duration::from_secs(5), || {
        peer::closed_by_peer(&replayed)
    });
    for o in &streams {
        assert!(
            !peer::closed_by_peer(&o.stream),
            "an admitted stream was dropped because of the replay"
        );
    }
    // The control stream completes the connection: it is the honest one, stream 0 included.
    let tt = t.clone();
    let control = run_peer(move || peer::join(&tt, 0x600d, tt.nstreams, &tt.secret).unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    let r = loop {
        if let Some(r) = n.accept_step(l).unwrap() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the honest connection never came out"
        );
    };
    let mut control = control.join().unwrap();
    // A small message on the control stream (8-byte size, then the bytes) arrives whole.
    let msg = pattern(1000, 5);
    control
        .stream
        .write_all(&(msg.len() as u64).to_le_bytes())
        .unwrap();
    control.stream.write_all(&msg).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: buf outlives the request.
    let q = unsafe { n.irecv(r, buf.as_mut_ptr(), buf.len(), false) }
        .unwrap()
        .unwrap();
    assert_eq!(n.wait(q, Duration::from_secs(5)).unwrap(), 1000);
    assert_eq!(&buf[..1000], &msg[..]);
    n.close_recv(r).unwrap();
    real_connection_works(&n, h, l);
    n.close_listen(l).unwrap();
}

/// The same stream index twice, both proving the secret: the connection fails as a whole and
/// its remaining streams cannot complete it later.
#[test]
fn an_admitted_index_twice_fails_the_connection() {
    let n = net();
    let (h, l) = n.listen(0).unwrap();
    let t = Target::from_handle(&h);
    let tt = t.clone();
    let twice = run_peer(move || {
        let a = peer::join(&tt, 0xd0b1e, 0, &tt.secret).unwrap();
        let b = peer::join(&tt, 0xd0b1e, 0, &tt.secret).unwrap();
        (a, b)
    });
    let (a, b) = wait_peer(&n, l, twice);
    pump_until(&n, l, Duration::from_secs(5), || {
        peer::closed_by_peer(&a.stream) && peer::closed_by_peer(&b.stream)
    });
    assert!(ncclbpf_harness::log_text().contains("stream 0 arrived twice"));
    let tt = t.clone();
    let rest = run_peer(move || {
        (1..=tt.nstreams)
            .map(|i| peer::join(&tt, 0xd0b1e, i, &tt.secret).unwrap())
            .collect::<Vec<_>>()
    });
    let rest = wait_peer(&n, l, rest);
    // The rest are turned away too (accept never returns the failed connection).
    pump_until(&n, l, Duration::from_secs(5), || {
        rest.iter().all(|o| peer::closed_by_peer(&o.stream))
    });
    real_connection_works(&n, h, l);
    n.close_listen(l).unwrap();
}

/// A connection whose streams do not all arrive is dropped after the handshake timeout.
#[test]
fn an_incomplete_connection_expires() {
    let n = net();
    let (h, l) = n.listen(0).unwrap();
    let tt = Target::from_handle(&h);
    let first = run_peer(move || peer::join(&tt, 0x1ace, 0, &tt.secret).unwrap());
    let first = wait_peer(&n, l, first);
    let admitted = Instant::now();
    pump_until(&n, l, HANDSHAKE_TIMEOUT * 3, || {
        peer::closed_by_peer(&first.stream)
    });
    let after = admitted.elapsed();
    assert!(
        after >= HANDSHAKE_TIMEOUT - Duration::from_millis(100),
        "dropped before its time: {after:?}"
    );
    assert!(ncclbpf_harness::log_text().contains("of its"));
    real_connection_works(&n, h, l);
    n.close_listen(l).unwrap();
}

/// Silent streams wait at most the handshake timeout; foreign ones are dropped at once.
#[test]
fn silent_and_foreign_streams_are_dropped() {
    let n = net();
    let (h, l) = n.listen(0).unwrap();
    let t = Target::from_handle(&h);
    let silent = TcpStream::connect(t.addr).unwrap();
    let mut garbage = TcpStream::connect(t.addr).unwrap();
    garbage.write_all(&[0xa5; 48]).unwrap();
    let mut other = TcpStream::connect(t.addr).unwrap();
    let stale = Target {
        listener_id: t.listener_id ^ 1,
        ..t.clone()
    };
    other.write_all(&stale.hello(1, 0, [0; 16])).unwrap();
    let mut shape = TcpStream::connect(t.addr).unwrap();
    let wrong_shape = Target {
        nstreams: t.nstreams + 1,
        ..t.clone()
    };
    shape.write_all(&wrong_shape.hello(1, 0, [0; 16])).unwrap();
    let start = Instant::now();
    pump_until(&n, l, Duration::from_secs(1), || {
        [&garbage, &other, &shape]
            .iter()
            .all(|s| peer::closed_by_peer(s))
    });
    assert!(!peer::closed_by_peer(&silent));
    pump_until(&n, l, HANDSHAKE_TIMEOUT * 3, || {
        peer::closed_by_peer(&silent)
    });
    assert!(start.elapsed() >= HANDSHAKE_TIMEOUT - Duration::from_millis(100));
    let log = ncclbpf_harness::log_text();
    for why in [
        "not an ncclbpf hello",
        "for another listener",
        "stream count",
    ] {
        assert!(log.contains(why), "no {why:?} in the log");
    }
    real_connection_works(&n, h, l);
    n.close_listen(l).unwrap();
}

/// Many strangers at once: at most 256 are held, a real connection still comes through, and
/// the log says so in a line or two, not one line per stranger.
#[test]
fn pending_strangers_are_capped_and_logged_once() {
    let n = net();
    let (h, l) = n.listen(0).unwrap();
    let t = Target::from_handle(&h);
    let silent: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(t.addr).unwrap())
        .collect();
    let before = ncclbpf_harness::log_text()
        .matches(&format!("listener {} turned away", t.addr))
        .count();
    pump_until(&n, l, Duration::from_secs(5), || {
        silent.iter().filter(|s| peer::closed_by_peer(s)).count() >= 300 - 256
    });
    let mut wrong = Vec::new();
    for i in 0..50 {
        let tt = t.clone();
        let j = run_peer(move || peer::join(&tt, 0x5000 + i, 0, &[7; 32]).unwrap());
        wrong.push(wait_peer(&n, l, j));
    }
    real_connection_works(&n, h, l);
    let lines = ncclbpf_harness::log_text()
        .matches(&format!("listener {} turned away", t.addr))
        .count()
        - before;
    assert!(
        (1..=10).contains(&lines),
        "{lines} log lines for 94+ strangers in a few seconds"
    );
    n.close_listen(l).unwrap();
}

/// The connector checks the listener too: a process at the handle's address that does not
/// hold the secret (it took the port over) never gets a connection, whatever it answers.
#[test]
fn connect_refuses_a_listener_without_the_secret() {
    let n = net();
    let (h, l) = n.listen(0).unwrap();
    for answer in ["random proof", "closes"] {
        let fake = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut fh = h;
        fh[18..20].copy_from_slice(&fake.local_addr().unwrap().port().to_le_bytes());
        fh[20..24].copy_from_slice(&[127, 0, 0, 1]);
        let imposter = std::thread::spawn(move || {
            let mut kept = Vec::new();
            fake.set_nonblocking(true).unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok((mut s, _)) = fake.accept() {
                    s.set_nonblocking(false).unwrap();
                    let mut hello = [0u8; peer::HELLO_SIZE];
                    if s.read_exact(&mut hello).is_ok() && answer == "random proof" {
                        let _ = s.write_all(&[0x3c; peer::REPLY_SIZE]);
                        kept.push(s);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let err = loop {
            match n.connect_step(0, &mut fh) {
                Ok(None) => assert!(Instant::now() < deadline, "connect never failed"),
                Ok(Some(_)) => panic!("connected to an imposter ({answer})"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.name(), "ncclRemoteError", "{answer}");
        drop(imposter);
    }
    let log = ncclbpf_harness::log_text();
    assert!(log.contains("no proof of the handle's secret"), "{log}");
    assert!(log.contains("closed during the handshake"), "{log}");
    real_connection_works(&n, h, l);
    n.close_listen(l).unwrap();
}

/// A handle from the ncclbpf before admission by secret is refused with a message that says so.
#[test]
fn a_handle_of_the_previous_format_names_the_version() {
    let n = net();
    let (mut h, l) = n.listen(0).unwrap();
    let good = h;
    h[0..8].copy_from_slice(&0x3146_5042_4c43_434e_u64.to_le_bytes()); // "NCCLBPF1"
    let e = n.connect_step(0, &mut h).unwrap_err();
    assert_eq!(e.name(), "ncclInvalidUsage");
    assert!(ncclbpf_harness::log_text().contains("older ncclbpf"));
    real_connection_works(&n, good, l);
    n.close_listen(l).unwrap();
}
