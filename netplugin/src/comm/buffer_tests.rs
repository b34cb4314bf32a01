//! The request-buffer invariant (docs/io-engine.md, "When a request's buffer is ours"): once
//! `test` has reported a request complete or failed, and once the comm is closed, nothing of ours
//! touches that request's buffer. Each test holds one data stream's server with a request's
//! buffer in hand ([`engine::hold`]), as a stopped thread or a busy scheduler would, while the
//! peer breaks the connection on another stream; on every path.
//!
//! The hold is one pool worker (test builds run at least two), so these tests take turns.
use super::tests::{buf, chunk, paths, raw_peer};
use super::*;
use crate::engine::hold;
use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

/// The receive's size: four chunks of 1 MiB.
const MSG: usize = 4 << 20;
/// Bytes after the receive that nothing may write.
const GUARD: usize = 4096;
/// The data stream whose server is held, and the one the peer breaks.
const HELD: usize = 1;
const BREACH: usize = 0;
/// What the held stream's chunk carries (0 is what the buffer holds before).
const FILL: u8 = 0xab;

fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    lock(&TURN)
}

/// The plan's chunk `i` of a [`MSG`]-byte message: (offset, length).
fn planned_chunk(i: usize) -> (u32, u32) {
    let mut plan = vec![];
    wire::plan_chunks(&super::tests::SHAPE, MSG, |o, l| plan.push((o, l)));
    (plan[i].0 as u32, plan[i].1 as u32)
}

fn landed(mem: &[u8]) -> usize {
    mem.iter().filter(|&&b| b == FILL).count()
}

/// How a request ended, as `test` said it.
#[derive(Debug)]
enum Said {
    Done(#[expect(dead_code, reason = "shown in failure messages")] usize),
    Failed(NetError),
}

fn said(c: &Comm, idx: u32) -> Option<Said> {
    match c.test(idx as usize) {
        Ok(None) => None,
        Ok(Some(n)) => Some(Said::Done(n)),
        Err(e) => Some(Said::Failed(e)),
    }
}

/// Waits up to 10 s for `f`.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A 4 MiB receive on `path`; the peer sends its header and, on data stream [`HELD`], a chunk
/// header and 4 KiB; that stream's server is held with the claimed buffer in hand while 64 KiB
/// more queue behind; then `breach` plays the peer's fault on stream [`BREACH`]. `test` must not
/// report the receive while the server holds its buffer; once it reports (a remote error),
/// not a byte more lands, and nothing lands past the receive.
fn held_receive(path: engine::Path, id: u64, breach: fn(&mut Vec<TcpStream>)) {
    let _turn = serial();
    let (r, mut raw) = raw_peer(path, id);
    hold::watch(id);
    hold::arm(id, HELD);
    let mut mem = vec![0u8; MSG + GUARD];
    let q = r.irecv(buf(&mut mem[..MSG])).unwrap().unwrap();
    raw[0].write_all(&(MSG as u64).to_le_bytes()).unwrap();
    let (off, len) = planned_chunk(1);
    raw[1 + HELD]
        .write_all(&chunk(0, MSG as u32, off, len))
        .unwrap();
    raw[1 + HELD].write_all(&[FILL; 4096]).unwrap();
    // The readers start once `test` has read the control stream's header.
    until(
        &format!("{path}: the held stream's server at its gate"),
        || {
            assert!(said(&r, q.idx).is_none(), "{path}: reported too soon");
            hold::wait_arrived(id, HELD, Duration::from_millis(1))
        },
    );
    raw[1 + HELD].write_all(&[FILL; 65536]).unwrap();
    breach(&mut raw);
    until(&format!("{path}: the breach seen"), || {
        r.stream_failed.load(Ordering::Acquire)
    });
    // NCCL polls; a report now would let it free the buffer the held server is about to fill.
    let mut early = None;
    let t0 = Instant::now();
    while early.is_none() && t0.elapsed() < Duration::from_millis(100) {
        early = said(&r, q.idx).map(|s| (s, landed(&mem)));
    }
    hold::open(id, HELD);
    let (outcome, at_report) = match early {
        Some(e) => e,
        None => {
            let mut out = None;
            until(&format!("{path}: the receive reported"), || {
                out = said(&r, q.idx).map(|s| (s, landed(&mem)));
                out.is_some()
            });
            out.expect("reported")
        }
    };
    let touched_at_report = hold::touches(id);
    // Whatever the held server does now happens before its claim goes.
    until(&format!("{path}: the claim let go"), || {
        r.slots[q.idx as usize].busy.load(Ordering::SeqCst) == 0
    });
    std::thread::sleep(Duration::from_millis(20));
    let after = landed(&mem);
    let touched_after = hold::touches(id);
    drop(raw);
    r.close();
    assert_eq!(
        after - at_report,
        0,
        "{path}: {} bytes landed after `test` reported {outcome:?}",
        after - at_report
    );
    assert_eq!(
        touched_after, touched_at_report,
        "{path}: a server handed the buffer to the kernel after the report"
    );
    assert!(
        matches!(&outcome, Said::Failed(e) if e.code() == NcclResult::REMOTE_ERROR),
        "{path}: {outcome:?}"
    );
    assert!(mem[MSG..].iter().all(|&b| b == 0), "{path}: the guard");
}

/// The peer dies in the middle of a chunk on another stream (its end read mid-chunk fails that
/// stream and the receive) while the held server still has bytes queued for it.
#[test]
fn a_peer_that_dies_mid_chunk_gets_no_byte_written_after_the_report() {
    for (i, path) in paths().into_iter().enumerate() {
        held_receive(path, 0xb0f0_0000 + 0x100 * i as u64, |raw| {
            let (off, len) = planned_chunk(0);
            raw[1 + BREACH]
                .write_all(&chunk(0, MSG as u32, off, len))
                .unwrap();
            raw[1 + BREACH].write_all(&[FILL; 1000]).unwrap();
            // Every socket of the peer goes: what it wrote stays queued on our side.
            raw.clear();
        });
    }
}

/// A chunk off the sender's plan on another stream (the probe).
#[test]
fn an_off_plan_chunk_gets_no_byte_written_after_the_report() {
    for (i, path) in paths().into_iter().enumerate() {
        held_receive(path, 0xb0f1_0000 + 0x100 * i as u64, |raw| {
            raw[1 + BREACH]
                .write_all(&chunk(0, MSG as u32, 1000, 65536))
                .unwrap();
        });
    }
}

/// The held stream's chunk again on another stream.
#[test]
fn a_duplicate_chunk_gets_no_byte_written_after_the_report() {
    for (i, path) in paths().into_iter().enumerate() {
        held_receive(path, 0xb0f2_0000 + 0x100 * i as u64, |raw| {
            let (off, len) = planned_chunk(1);
            raw[1 + BREACH]
                .write_all(&chunk(0, MSG as u32, off, len))
                .unwrap();
            raw[1 + BREACH].write_all(&[FILL; 1000]).unwrap();
        });
    }
}

/// Closing a receive comm while a server holds a claimed buffer returns only once it let go:
/// nothing lands after `close` returned.
#[test]
fn closing_while_a_reader_holds_a_buffer_returns_after_it_let_go() {
    for (i, path) in paths().into_iter().enumerate() {
        let _turn = serial();
        let id = 0xb0f3_0000 + 0x100 * i as u64;
        let (r, mut raw) = raw_peer(path, id);
        hold::watch(id);
        hold::arm(id, HELD);
        let mut mem = vec![0u8; MSG + GUARD];
        let q = r.irecv(buf(&mut mem[..MSG])).unwrap().unwrap();
        raw[0].write_all(&(MSG as u64).to_le_bytes()).unwrap();
        let (off, len) = planned_chunk(1);
        raw[1 + HELD]
            .write_all(&chunk(0, MSG as u32, off, len))
            .unwrap();
        raw[1 + HELD].write_all(&[FILL; 4096]).unwrap();
        until(&format!("{path}: the held server at its gate"), || {
            let _ = r.test(q.idx as usize);
            hold::wait_arrived(id, HELD, Duration::from_millis(1))
        });
        raw[1 + HELD].write_all(&[FILL; 65536]).unwrap();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            hold::open(id, HELD);
        });
        let t0 = Instant::now();
        r.close();
        let took = t0.elapsed();
        let (at_close, touched) = (landed(&mem), hold::touches(id));
        opener.join().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(landed(&mem), at_close, "{path}: bytes landed after close");
        assert_eq!(hold::touches(id), touched, "{path}: touched after close");
        assert!(
            took >= Duration::from_millis(250),
            "{path}: close returned after {took:?}, while the server held the buffer"
        );
        assert!(mem[MSG..].iter().all(|&b| b == 0), "{path}: the guard");
        drop(raw);
    }
}

/// A send comm on `path` whose peer is the test: the control stream, then the data streams, as
/// raw sockets (it reads none of them).
fn raw_receiver(path: engine::Path, id: u64) -> (Box<Comm>, Vec<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..=super::tests::STREAMS {
        ours.push(TcpStream::connect(addr).unwrap());
        raw.push(l.accept().unwrap().0);
    }
    let ctl = ours.remove(0);
    let ep = Endpoint {
        dev: 0,
        comm_id: 0,
        quiet: false,
    };
    let shape = super::tests::SHAPE;
    let s = Comm::on_path(ConnDirection::Send, id, ep, shape, ctl, ours, path).unwrap();
    (s, raw)
}

/// A 64 MiB send to a peer that reads nothing; data stream [`HELD`]'s server is held with its
/// first chunk in hand; the peer resets stream [`BREACH`], whose server fails in the middle of
/// its chunks. `test` must not report the send while a server still holds a chunk of it, and
/// after the report no server hands its buffer to the kernel.
#[test]
fn a_send_is_not_reported_while_a_server_holds_its_buffer() {
    for (i, path) in paths().into_iter().enumerate() {
        let _turn = serial();
        let id = 0xb0f4_0000 + 0x100 * i as u64;
        let (s, mut raw) = raw_receiver(path, id);
        hold::watch(id);
        hold::arm(id, HELD);
        let mut data = vec![FILL; 64 << 20];
        let q = s.isend(buf(&mut data)).unwrap().unwrap();
        assert!(
            hold::wait_arrived(id, HELD, Duration::from_secs(10)),
            "{path}: the held server never came"
        );
        // The peer never read: closing its end resets the stream.
        drop(raw.remove(1 + BREACH));
        until(&format!("{path}: the reset seen"), || {
            s.stream_failed.load(Ordering::Acquire)
        });
        let mut early = None;
        let t0 = Instant::now();
        while early.is_none() && t0.elapsed() < Duration::from_millis(100) {
            early = said(&s, q.idx).map(|x| (x, hold::touches(id)));
        }
        hold::open(id, HELD);
        let (outcome, touched_at_report) = match early {
            Some(e) => e,
            None => {
                let mut out = None;
                until(&format!("{path}: the send reported"), || {
                    out = said(&s, q.idx).map(|x| (x, hold::touches(id)));
                    out.is_some()
                });
                out.expect("reported")
            }
        };
        until(&format!("{path}: every chunk settled"), || {
            s.slots[q.idx as usize]
                .pending_chunks
                .load(Ordering::Acquire)
                == 0
        });
        std::thread::sleep(Duration::from_millis(20));
        let touched_after = hold::touches(id);
        s.close();
        drop(raw);
        assert_eq!(
            touched_after, touched_at_report,
            "{path}: a server handed the send's buffer to the kernel after `test` reported \
             {outcome:?}"
        );
        assert!(matches!(outcome, Said::Failed(_)), "{path}: {outcome:?}");
    }
}

/// Closing a send comm while a server holds a chunk returns only once it let go.
#[test]
fn closing_while_a_sender_holds_a_buffer_returns_after_it_let_go() {
    for (i, path) in paths().into_iter().enumerate() {
        let _turn = serial();
        let id = 0xb0f5_0000 + 0x100 * i as u64;
        let (s, raw) = raw_receiver(path, id);
        hold::watch(id);
        hold::arm(id, HELD);
        let mut data = vec![FILL; 8 << 20];
        let _q = s.isend(buf(&mut data)).unwrap().unwrap();
        assert!(
            hold::wait_arrived(id, HELD, Duration::from_secs(10)),
            "{path}: the held server never came"
        );
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            hold::open(id, HELD);
        });
        let t0 = Instant::now();
        s.close();
        let took = t0.elapsed();
        let touched = hold::touches(id);
        opener.join().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(hold::touches(id), touched, "{path}: touched after close");
        assert!(
            took >= Duration::from_millis(250),
            "{path}: close returned after {took:?}, while the server held the buffer"
        );
        drop(raw);
    }
}

/// The probe, without holds, for as long as `NCCL_BPF_SOAK_SECS` says (600 by default)
/// on every path `NCCL_BPF_IO` leaves (all by default): a 4 MiB receive; the peer sends its
/// header, a chunk header and 4 KiB on one stream and 64 KiB more, and on another stream a
/// breach (off the plan, a chunk twice, or a death mid-chunk), with random pauses between.
/// Each round checks that nothing changes in the buffer between `test`'s report and the
/// comm's close, and that the 4 KiB canaries on either side of it stay whole. Not run by
/// default (`cargo test --release -p ncclbpf-netplugin hostile_peer_soak -- --ignored
/// --nocapture`); prints the rounds and the writes after a report per path.
#[test]
#[ignore = "a soak of minutes: run it by name"]
fn hostile_peer_soak() {
    let secs: u64 = std::env::var("NCCL_BPF_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let mut rng = fastrand::Rng::with_seed(0x5eed_0039);
    for (i, path) in paths().into_iter().enumerate() {
        let t0 = Instant::now();
        let (mut rounds, mut late, mut failed, mut done) = (0u64, 0u64, 0u64, 0u64);
        while t0.elapsed() < Duration::from_secs(secs) {
            let id = 0x50a0_0000_0000 + (i as u64) * 0x1_0000_0000 + rounds;
            match soak_round(path, id, &mut rng) {
                Soak::Clean { failed: true } => failed += 1,
                Soak::Clean { failed: false } => done += 1,
                Soak::Late(what) => {
                    late += 1;
                    eprintln!("{path} round {rounds}: {what}");
                }
            }
            rounds += 1;
        }
        eprintln!(
            "hostile_peer_soak {path}: {rounds} rounds in {:?}: {failed} failed, {done} \
             completed, {late} with a write after the report",
            t0.elapsed()
        );
        assert_eq!(late, 0, "{path}: writes after a report");
    }
}

enum Soak {
    Clean { failed: bool },
    Late(String),
}

fn soak_round(path: engine::Path, id: u64, rng: &mut fastrand::Rng) -> Soak {
    const CANARY: u8 = 0x5c;
    let (r, mut raw) = raw_peer(path, id);
    let mut mem = vec![CANARY; GUARD + MSG + GUARD];
    mem[GUARD..GUARD + MSG].fill(0);
    let q = r.irecv(buf(&mut mem[GUARD..GUARD + MSG])).unwrap().unwrap();
    let (held, breach) = if rng.bool() { (1, 0) } else { (2, 3) };
    let pause = |rng: &mut fastrand::Rng| {
        if rng.u8(..4) == 0 {
            std::thread::sleep(Duration::from_micros(rng.u64(..2000)));
        }
    };
    raw[0].write_all(&(MSG as u64).to_le_bytes()).unwrap();
    let (off, len) = planned_chunk(1);
    raw[1 + held]
        .write_all(&chunk(0, MSG as u32, off, len))
        .unwrap();
    raw[1 + held].write_all(&[FILL; 4096]).unwrap();
    // The readers start with the header `test` reads.
    let mut out = said(&r, q.idx);
    pause(rng);
    raw[1 + held].write_all(&[FILL; 65536]).unwrap();
    pause(rng);
    let kind = rng.u8(..3);
    match kind {
        0 => raw[1 + breach]
            .write_all(&chunk(0, MSG as u32, 1000, 65536))
            .unwrap(),
        1 => {
            raw[1 + breach]
                .write_all(&chunk(0, MSG as u32, off, len))
                .unwrap();
            raw[1 + breach].write_all(&[FILL; 1000]).unwrap();
        }
        _ => {
            let (o, l) = planned_chunk(0);
            raw[1 + breach]
                .write_all(&chunk(0, MSG as u32, o, l))
                .unwrap();
            raw[1 + breach].write_all(&[FILL; 1000]).unwrap();
            raw.clear();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.is_none() {
        assert!(Instant::now() < deadline, "{path}: no report in 10 s");
        out = said(&r, q.idx);
    }
    let at_report = mem.clone();
    r.close();
    drop(raw);
    let outcome = out.expect("reported");
    if mem[..GUARD]
        .iter()
        .chain(&mem[GUARD + MSG..])
        .any(|&b| b != CANARY)
    {
        return Soak::Late(format!("a canary was written (breach {kind}, {outcome:?})"));
    }
    if mem != at_report {
        let n = mem.iter().zip(&at_report).filter(|(a, b)| a != b).count();
        return Soak::Late(format!(
            "{n} bytes changed after `test` reported {outcome:?} (breach {kind})"
        ));
    }
    Soak::Clean {
        failed: matches!(outcome, Said::Failed(_)),
    }
}

/// An inline receive half read from the control stream when the comm fails: once `test` has
/// reported it, neither NCCL's proxy thread (`test`, `irecv`) nor the agreement's frame mover
/// (`take_frames`) copies the rest of its payload into its buffer. On every path (the failure
/// comes from a data stream).
#[test]
fn an_inline_receive_is_not_written_after_its_report() {
    for (i, path) in paths().into_iter().enumerate() {
        let (r, mut raw) = raw_peer(path, 0xb0f6_0000 + 0x100 * i as u64);
        // A chunked message first starts the data streams' readers.
        let mut first = vec![0u8; 100_000];
        let q0 = r.irecv(buf(&mut first)).unwrap().unwrap();
        raw[0].write_all(&100_000u64.to_le_bytes()).unwrap();
        super::tests::planned(&mut raw[1], 0, 100_000, 0, 0x11);
        super::tests::planned(&mut raw[1], 0, 100_000, 1, 0x11);
        until(&format!("{path}: message 0"), || said(&r, q0.idx).is_some());
        // Message 1, inline: its header and half its bytes.
        let mut into = vec![0u8; 1000];
        let q = r.irecv(buf(&mut into)).unwrap().unwrap();
        raw[0].write_all(&1000u64.to_le_bytes()).unwrap();
        raw[0].write_all(&[FILL; 500]).unwrap();
        until(&format!("{path}: half of it read"), || {
            assert!(said(&r, q.idx).is_none());
            into[..500].iter().all(|&b| b == FILL)
        });
        // A chunk off the plan fails the comm.
        raw[2]
            .write_all(&chunk(2, MSG as u32, 1000, 65536))
            .unwrap();
        let mut out = None;
        until(&format!("{path}: the failure reported"), || {
            out = said(&r, q.idx);
            out.is_some()
        });
        assert!(matches!(out, Some(Said::Failed(_))), "{path}: {out:?}");
        raw[0].write_all(&[FILL; 500]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let _ = r.take_frames();
        let _ = r.irecv(buf(&mut first));
        assert!(
            into[500..].iter().all(|&b| b == 0),
            "{path}: written after the report"
        );
        drop(raw);
        r.close();
    }
}
