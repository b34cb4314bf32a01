//! Tests of the data path of one connection end: both ends on loopback on every path
//! (threads, epoll, uring), and a receive end whose peer is the test on raw sockets.
use super::send::least_queued;
use super::*;
use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

pub(super) const STREAMS: u32 = 4;
const BIG: usize = 1 << 20;

/// Every path this machine can serve data streams with; only the one `NCCL_BPF_IO` names, if
/// it names one (`NCCL_BPF_IO=epoll cargo test ...`).
pub(super) fn paths() -> Vec<engine::Path> {
    let mut p = vec![engine::Path::Threads, engine::Path::Epoll];
    if engine::uring::probe().is_ok() {
        p.push(engine::Path::Uring);
    }
    let only = std::env::var("NCCL_BPF_IO").ok();
    match only.as_deref().and_then(engine::IoMode::parse) {
        Some(engine::IoMode::Threads) => p.retain(|&x| x == engine::Path::Threads),
        Some(engine::IoMode::Epoll) => p.retain(|&x| x == engine::Path::Epoll),
        Some(engine::IoMode::Uring) => p.retain(|&x| x == engine::Path::Uring),
        _ => {}
    }
    p
}

/// A connected (send, recv) pair of comms over loopback, 4 data streams, 64 KiB inline,
/// the data streams served by helper threads.
fn pair(send_id: u64, recv_id: u64) -> (Box<Comm>, Box<Comm>) {
    pair_on(engine::Path::Threads, send_id, recv_id)
}

/// [`pair`] on `path`.
fn pair_on(path: engine::Path, send_id: u64, recv_id: u64) -> (Box<Comm>, Box<Comm>) {
    pair_of(path, send_id, recv_id, 0)
}

/// [`pair_on`], both ends of communicator `comm_id` (0: none named, as before net v11).
fn pair_of(path: engine::Path, send_id: u64, recv_id: u64, comm_id: u64) -> (Box<Comm>, Box<Comm>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..=STREAMS {
        a.push(TcpStream::connect(addr).unwrap());
        b.push(l.accept().unwrap().0);
    }
    let ep = || Endpoint {
        dev: 0,
        comm_id,
        quiet: false,
    };
    let (ac, bc) = (a.remove(0), b.remove(0));
    let s = Comm::on_path(ConnDirection::Send, send_id, ep(), SHAPE, ac, a, path).unwrap();
    let r = Comm::on_path(ConnDirection::Recv, recv_id, ep(), SHAPE, bc, b, path).unwrap();
    (s, r)
}

pub(super) const SHAPE: Shape = Shape {
    nstreams: STREAMS,
    inline_bytes: 64 * 1024,
    min_chunk: 64 * 1024,
};

pub(super) fn buf(v: &mut [u8]) -> Buf {
    // SAFETY: every test keeps its vectors alive until the comms are closed.
    unsafe { Buf::new(v.as_mut_ptr(), v.len()) }
}

/// Tests `slot` until it completes or fails; panics if neither happens within 10 s.
fn wait(c: &Comm, slot: &ReqSlot) -> NetResult<usize> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(n) = c.test(slot.idx as usize)? {
            return Ok(n);
        }
        assert!(Instant::now() < deadline, "request neither done nor failed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The communicator's busy clock runs while either end has a request in flight, on every
/// path: it stops once all are done (and again when a comm closes with a receive still
/// posted), and it does not run while nothing is posted.
#[test]
fn the_communicators_busy_clock_runs_while_a_request_is_in_flight() {
    use ncclbpf_agreement::net_busy;
    for (i, path) in paths().into_iter().enumerate() {
        let id = 0xb05e_0001 + 0x1000 * i as u64;
        let comm_id = 0xb05e_c000 + i as u64;
        let clock = net_busy::clock(comm_id).unwrap();
        let (s, r) = pair_of(path, id, id + 1, comm_id);
        let mut data: Vec<u8> = (0..BIG).map(|i| (i * 3) as u8).collect();
        let mut into = vec![0u8; BIG];
        let rr = r.irecv(buf(&mut into)).unwrap().unwrap();
        // Only the receive is posted: the clock runs.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(clock.inflight(), 1);
        let a = s.isend(buf(&mut data)).unwrap().unwrap();
        assert_eq!(wait(&s, a).unwrap(), BIG);
        assert_eq!(wait(&r, rr).unwrap(), BIG);
        assert_eq!(clock.inflight(), 0, "{path:?}");
        let busy = clock.busy_ns();
        assert!(busy >= 20_000_000, "{path:?}: {busy} ns");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(clock.busy_ns(), busy, "{path:?}: idle time counted");
        // A receive that never completes stops counting when its comm goes.
        let _never = r.irecv(buf(&mut into)).unwrap().unwrap();
        assert_eq!(clock.inflight(), 1);
        s.close();
        r.close();
        assert_eq!(clock.inflight(), 0, "{path:?}");
    }
}

/// Frames sent between messages arrive in order, consume no receive, and leave the
/// messages (inline and chunked) intact.
#[test]
fn control_frames_travel_between_messages() {
    for (i, path) in paths().into_iter().enumerate() {
        let id = 0xf2a0_0001 + 0x1000 * i as u64;
        frames_between_messages(path, id);
    }
}

fn frames_between_messages(path: engine::Path, id: u64) {
    let (s, r) = pair_on(path, id, id + 1);
    let mut small: Vec<u8> = (0..100u8).collect();
    let mut big: Vec<u8> = (0..BIG).map(|i| (i * 7) as u8).collect();
    let (mut into_small, mut into_big) = (vec![0u8; 100], vec![0u8; BIG]);
    s.send_frame(b"first").unwrap();
    let a = s.isend(buf(&mut small)).unwrap().unwrap();
    s.send_frame(&[0xab; 3000]).unwrap();
    let b = s.isend(buf(&mut big)).unwrap().unwrap();
    s.send_frame(b"").unwrap();
    s.send_frame(b"last").unwrap();
    let ra = r.irecv(buf(&mut into_small)).unwrap().unwrap();
    let rb = r.irecv(buf(&mut into_big)).unwrap().unwrap();
    assert_eq!(wait(&s, a).unwrap(), 100);
    assert_eq!(wait(&s, b).unwrap(), BIG);
    assert_eq!(wait(&r, ra).unwrap(), 100);
    assert_eq!(wait(&r, rb).unwrap(), BIG);
    assert!(into_small == small && into_big == big, "messages intact");
    // The last frames follow the last message: read with no receive posted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = vec![];
    while got.len() < 4 {
        let (f, dropped) = r.take_frames();
        assert_eq!(dropped, 0);
        got.extend(f);
        assert!(Instant::now() < deadline, "frames missing: {}", got.len());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        got,
        [
            b"first".to_vec(),
            vec![0xab; 3000],
            vec![],
            b"last".to_vec()
        ]
    );
    // A frame, then a message whose receive is not posted yet, then a frame: the first
    // is read at once, the message waits (its header read) for its receive, and the frame
    // behind it comes with that message.
    s.send_frame(b"before").unwrap();
    let mut late: Vec<u8> = (0..50u8).collect();
    let c = s.isend(buf(&mut late)).unwrap().unwrap();
    s.send_frame(b"after").unwrap();
    assert_eq!(wait(&s, c).unwrap(), 50);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (f, _) = r.take_frames();
        if !f.is_empty() {
            assert_eq!(f, [b"before".to_vec()]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "frame before the message missing"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut into_late = vec![0u8; 64];
    let rc = r.irecv(buf(&mut into_late)).unwrap().unwrap();
    assert_eq!(wait(&r, rc).unwrap(), 50);
    assert_eq!(&into_late[..50], &late[..]);
    let (f, _) = r.take_frames();
    assert_eq!(f, [b"after".to_vec()], "no frame completes a receive");
    s.close();
    r.close();
}

/// A peer that reads none of its control stream (stalled, or hostile) cannot make this
/// end queue frames without bound: the oldest not yet started go, counted, and the stream
/// stays well formed (the frame being written is kept whole).
#[test]
fn frames_a_peer_does_not_read_are_bounded_on_the_send_side_too() {
    let (s, r) = pair(0xf2a0_0101, 0xf2a0_0102);
    let frame = vec![7u8; wire::MAX_FRAME];
    for _ in 0..1024 {
        s.send_frame(&frame).unwrap();
    }
    let (queued, counted) = {
        let st = lock(&s.state);
        (
            st.frames_out.iter().map(Vec::len).sum::<usize>(),
            st.frames_out_bytes,
        )
    };
    assert!(queued <= MAX_OUTBOX_BYTES, "{} MiB queued", queued >> 20);
    assert_eq!(queued, counted, "the byte count follows the queue");
    assert!(s.frames_out_dropped() > 0);
    // The receiver then reads what arrives: whole frames only, and a message after them.
    let mut one = [9u8; 1];
    let q = s.isend(buf(&mut one)).unwrap().unwrap();
    let mut into = [0u8; 1];
    let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut frames = 0;
    loop {
        let (f, _) = r.take_frames();
        assert!(f.iter().all(|x| x.len() == wire::MAX_FRAME && x[0] == 7));
        frames += f.len();
        let _ = s.test(q.idx as usize);
        if r.test(rq.idx as usize).unwrap().is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the message never came");
    }
    assert!(frames > 0 && into == [9]);
    s.close();
    r.close();
}

#[test]
fn frames_are_bounded_and_go_one_way() {
    let (s, r) = pair(0xf2a0_0003, 0xf2a0_0004);
    let e = s.send_frame(&vec![0u8; wire::MAX_FRAME + 1]).unwrap_err();
    assert!(e.to_string().contains("over the 65536-byte limit"), "{e}");
    assert!(r.send_frame(b"x").is_err(), "a receive comm sends none");
    // More frames than the inbox holds: the oldest go, counted.
    for i in 0..(MAX_INBOX + 5) as u32 {
        s.send_frame(&i.to_le_bytes()).unwrap();
    }
    let mut one = [1u8; 1];
    let q = s.isend(buf(&mut one)).unwrap().unwrap();
    let mut into = [0u8; 1];
    let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
    assert_eq!(wait(&s, q).unwrap(), 1);
    assert_eq!(wait(&r, rq).unwrap(), 1);
    let (f, dropped) = r.take_frames();
    assert_eq!((f.len(), dropped), (MAX_INBOX, 5));
    assert_eq!(f[0], 5u32.to_le_bytes(), "the oldest five were dropped");
    // And in bytes: 40 frames of 64 KiB keep the last 16 (1 MiB).
    for i in 0..40u8 {
        s.send_frame(&vec![i; wire::MAX_FRAME]).unwrap();
    }
    let q = s.isend(buf(&mut one)).unwrap().unwrap();
    let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
    assert_eq!(wait(&s, q).unwrap(), 1);
    assert_eq!(wait(&r, rq).unwrap(), 1);
    let (f, dropped) = r.take_frames();
    assert_eq!((f.len(), dropped), (16, 24));
    assert_eq!(f[0][0], 24);
    s.close();
    r.close();
}

/// A frame header no sender of ours writes (over the limit) fails the connection with a
/// message, instead of reading 2^63 bytes.
/// A sender that closes right after its last large message (as a rank does at the end of a
/// job) ends the control stream while the message's chunks are still on the data streams:
/// reading that end between messages (the frame mover does, with no receive posted) must not
/// fail the receive, and only a receive that needs another message fails.
#[test]
fn a_peer_that_closes_after_its_last_message_does_not_fail_that_message() {
    for (i, path) in paths().into_iter().enumerate() {
        closes_after_last_message(path, 0xf2a1_0010 + 0x1000 * i as u64);
    }
}

fn closes_after_last_message(path: engine::Path, base: u64) {
    for round in 0..20u64 {
        let (s, r) = pair_on(path, base + 2 * round, base + 1 + 2 * round);
        let mut big: Vec<u8> = (0..BIG).map(|i| (i * 3) as u8).collect();
        let mut into = vec![0u8; BIG];
        let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
        let sq = s.isend(buf(&mut big)).unwrap().unwrap();
        assert_eq!(wait(&s, sq).unwrap(), BIG);
        s.close();
        // Read the end of the control stream as the frame mover would.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !{
            let st = lock(&r.state);
            st.closed || st.error.is_some()
        } {
            let _ = r.take_frames();
            assert!(Instant::now() < deadline, "the end never came");
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(wait(&r, rq).unwrap(), BIG, "round {round}");
        assert!(into == big);
        let mut more = vec![0u8; 16];
        let next = r.irecv(buf(&mut more)).unwrap().unwrap();
        let e = wait(&r, next).unwrap_err();
        assert_eq!(e.code(), NcclResult::REMOTE_ERROR, "{e}");
        r.close();
    }
}

#[test]
fn a_broken_frame_header_fails_the_connection() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut raw = TcpStream::connect(addr).unwrap();
    let ctl = l.accept().unwrap().0;
    let shape = Shape {
        nstreams: 0,
        inline_bytes: 64 * 1024,
        min_chunk: 64 * 1024,
    };
    let ep = Endpoint {
        dev: 0,
        comm_id: 0,
        quiet: false,
    };
    let r = Comm::new(ConnDirection::Recv, 0xf2a0_0005, ep, shape, ctl, vec![]).unwrap();
    raw.write_all(&(wire::FRAME_FLAG | (wire::MAX_FRAME as u64 + 1)).to_le_bytes())
        .unwrap();
    let mut into = [0u8; 16];
    let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
    let e = wait(&r, rq).unwrap_err();
    assert!(e.to_string().contains("broke the framing"), "{e}");
    r.close();
}

#[test]
fn a_panicking_send_helper_fails_its_request_and_the_comm() {
    for (i, path) in paths().into_iter().enumerate() {
        send_io_panics(path, 0x9a11_0001 + 0x1000 * i as u64);
    }
}

fn send_io_panics(path: engine::Path, sid: u64) {
    let rid = sid + 1;
    inject::panic_in_helper(sid, 1);
    let (s, r) = pair_on(path, sid, rid);
    let mut data = vec![7u8; BIG];
    let mut into = vec![0u8; BIG];
    let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
    let sq = s.isend(buf(&mut data)).unwrap().unwrap();
    let e = wait(&s, sq).unwrap_err();
    assert_eq!(e.code(), NcclResult::INTERNAL_ERROR, "{e}");
    let text = e.to_string();
    assert!(text.contains("panicked"), "{text}");
    assert!(text.contains("injected test panic in ncclbpf S1"), "{text}");
    assert!(text.contains(&format!("connection {sid:#018x}")), "{text}");
    // The comm stays failed, naming the panic, with the same code.
    let later = s.isend(buf(&mut data)).map(|_| ()).unwrap_err();
    assert!(later.to_string().contains("panicked"), "{later}");
    assert_eq!(later.code(), NcclResult::INTERNAL_ERROR);
    // The helper shut its stream: the peer's receive fails instead of waiting forever.
    assert!(wait(&r, rq).is_err());
    s.close();
    r.close();
}

#[test]
fn a_panicking_recv_helper_fails_its_request_and_the_comm() {
    for (i, path) in paths().into_iter().enumerate() {
        recv_io_panics(path, 0x9a11_0003 + 0x1000 * i as u64);
    }
}

fn recv_io_panics(path: engine::Path, sid: u64) {
    let rid = sid + 1;
    inject::panic_in_helper(rid, 2);
    let (s, r) = pair_on(path, sid, rid);
    let mut data = vec![7u8; BIG];
    let mut into = vec![0u8; BIG];
    let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
    let _sq = s.isend(buf(&mut data)).unwrap().unwrap();
    let e = wait(&r, rq).unwrap_err();
    assert_eq!(e.code(), NcclResult::INTERNAL_ERROR, "{e}");
    assert!(
        e.to_string().contains("injected test panic in ncclbpf R2"),
        "{e}"
    );
    assert!(r.irecv(buf(&mut into)).is_err());
    // Closing with the sender's request possibly still pending does not hang.
    s.close();
    r.close();
}

#[test]
fn a_refused_helper_thread_fails_the_comm_and_keeps_no_slot() {
    let (sid, rid) = (0x9a11_0005, 0x9a11_0006);
    inject::fail_spawn(sid, 2);
    let (s, r) = pair(sid, rid);
    let mut data = vec![7u8; BIG];
    let e = s.isend(buf(&mut data)).map(|_| ()).unwrap_err();
    assert_eq!(e.code(), NcclResult::SYSTEM_ERROR, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("cannot start helper thread 3 of 4 for connection 0x000000009a110005 (send)"),
        "{text}"
    );
    assert!(text.contains("NCCL_BPF_NSTREAMS"), "{text}");
    // The two helpers started before the refusal were stopped and joined.
    assert!(lock(&s.state).workers.is_none());
    // No slot was kept: every later call reports the error, none says "busy".
    for k in 0..2 * SLOTS {
        let size = if k % 2 == 0 { BIG } else { 100 };
        match s.isend(buf(&mut data[..size])) {
            Err(e) => {
                assert_eq!(e.code(), NcclResult::SYSTEM_ERROR);
                assert!(e.to_string().contains("cannot start helper thread 3 of 4"));
            }
            Ok(q) => panic!("isend {k} after the failure: {:?}", q.map(|q| q.idx)),
        }
    }
    assert_eq!(lock(&s.state).free.len(), SLOTS);
    s.close();
    r.close();
}

#[test]
fn a_refused_recv_helper_fails_the_receive_with_a_system_error() {
    let (sid, rid) = (0x9a11_0007, 0x9a11_0008);
    inject::fail_spawn(rid, 0);
    let (s, r) = pair(sid, rid);
    let mut data = vec![7u8; BIG];
    let mut into = vec![0u8; BIG];
    let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
    let _sq = s.isend(buf(&mut data)).unwrap().unwrap();
    let e = wait(&r, rq).unwrap_err();
    assert_eq!(e.code(), NcclResult::SYSTEM_ERROR, "{e}");
    assert!(
        e.to_string()
            .contains("cannot start helper thread 1 of 4 for connection 0x000000009a110008 (recv)"),
        "{e}"
    );
    assert_eq!(
        lock(&r.state).free.len(),
        SLOTS,
        "the failed receive kept its slot"
    );
    for _ in 0..2 * SLOTS {
        assert!(r.irecv(buf(&mut into)).is_err());
    }
    s.close();
    r.close();
}

/// Messages that queue behind a full control stream (the receiver not reading yet) go out
/// several to a write once it drains, cut anywhere (in a header, in a payload), and arrive
/// whole and in order, with a chunked message among them.
#[test]
fn queued_messages_go_out_together_and_arrive_whole() {
    let (s, r) = pair(0xba7c_0001, 0xba7c_0002);
    socket2::SockRef::from(&lock(&s.state).control)
        .set_send_buffer_size(32 << 10)
        .unwrap();
    socket2::SockRef::from(&lock(&r.state).control)
        .set_recv_buffer_size(32 << 10)
        .unwrap();
    let sizes: Vec<usize> = (0..48)
        .map(|k| match k % 8 {
            0 => 0,
            1 => 1,
            2 => 7,
            3 => 9,
            4 => 4093,
            5 => 65_536,
            6 if k == 22 => 200_000, // chunked, over the data streams
            _ => 30_011 + k,
        })
        .collect();
    let mut out: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7) as u8).collect())
        .collect();
    let mut inb: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xee; n.max(1)]).collect();
    let sends: Vec<_> = out
        .iter_mut()
        .map(|v| s.isend(buf(v)).unwrap().unwrap())
        .collect();
    assert!(
        lock(&s.state).fifo.len() > 1,
        "messages queued behind the full stream"
    );
    let recvs: Vec<_> = inb
        .iter_mut()
        .map(|v| r.irecv(buf(v)).unwrap().unwrap())
        .collect();
    for (k, q) in recvs.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let n = loop {
            // The sender makes progress only when NCCL tests its requests.
            for q in &sends {
                let _ = s.test(q.idx as usize);
            }
            if let Some(n) = r.test(q.idx as usize).unwrap() {
                break n;
            }
            assert!(Instant::now() < deadline, "message {k} never arrived");
        };
        assert_eq!(n, sizes[k], "message {k}");
        assert!(inb[k][..n] == out[k][..], "message {k}'s bytes");
    }
    assert!(
        lock(&s.state).batched_writes > 0,
        "some write carried several messages"
    );
    s.close();
    r.close();
}

/// A sender that announces a message, delivers part of it and closes (or resets) fails the
/// pending receive with a remote error on every path.
#[test]
fn a_message_cut_short_fails_the_receive_on_every_way() {
    for (i, way) in paths().into_iter().enumerate() {
        for reset in [false, true] {
            let id = 0xc075_0000 + 0x10 * i as u64 + u64::from(reset);
            let (r, mut raw) = raw_peer(way, id);
            let mut into = vec![0u8; 800_000];
            let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
            raw[0].write_all(&800_000u64.to_le_bytes()).unwrap();
            // Half of a 200,000-byte chunk on the first stream, then the end.
            raw[1].write_all(&chunk(0, 800_000, 0, 200_000)).unwrap();
            raw[1].write_all(&[7u8; 100_000]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            for s in &raw {
                if reset {
                    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
                }
            }
            drop(raw);
            let e = wait(&r, rq).unwrap_err();
            assert_eq!(
                e.code(),
                NcclResult::REMOTE_ERROR,
                "{way}, reset {reset}: {e}"
            );
            r.close();
        }
    }
}

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|n| n.trim_end().starts_with(prefix))
        })
        .count()
}

/// Many comms at once on a pool path: every message arrives intact, in order, both ways
/// at once, with mixed sizes (inline and chunked, one chunk and many), and no comm starts
/// a thread of its own.
#[test]
fn many_comms_share_the_pool_workers() {
    for (i, path) in paths().into_iter().enumerate() {
        if path == engine::Path::Threads {
            continue;
        }
        let base = 0x7e00_0000 + 0x10_0000 * i as u64;
        let pairs: Vec<_> = (0..24u64)
            .map(|k| pair_on(path, base + 2 * k, base + 2 * k + 1))
            .collect();
        let sizes = [BIG, 100, 3 * BIG + 17, 70_000, 0, 200_001];
        let mut out: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut into: Vec<Vec<Vec<u8>>> = Vec::new();
        for (k, _) in pairs.iter().enumerate() {
            out.push(
                sizes
                    .iter()
                    .enumerate()
                    .map(|(j, &n)| (0..n).map(|b| (b * 31 + j * 7 + k) as u8).collect())
                    .collect(),
            );
            into.push(sizes.iter().map(|&n| vec![0u8; n.max(1)]).collect());
        }
        let mut reqs = Vec::new();
        for (k, (s, r)) in pairs.iter().enumerate() {
            for j in 0..sizes.len() {
                let rq = r.irecv(buf(&mut into[k][j])).unwrap().unwrap();
                let sq = s.isend(buf(&mut out[k][j])).unwrap().unwrap();
                reqs.push((k, j, sq, rq));
            }
        }
        for (s, r) in &pairs {
            for c in [s, r] {
                let on_pool = matches!(lock(&c.state).workers, Some(DataPath::Pool(_)));
                // A receive comm that has read no chunked header yet has no data path.
                assert!(
                    on_pool
                        || (c.direction == ConnDirection::Recv && lock(&c.state).workers.is_none()),
                    "{path}: not on the pool"
                );
            }
        }
        for (k, j, sq, rq) in reqs {
            let (s, r) = &pairs[k];
            assert_eq!(wait(s, sq).unwrap(), sizes[j]);
            assert_eq!(
                wait(r, rq).unwrap(),
                sizes[j],
                "{path} comm {k} message {j}"
            );
            assert!(
                into[k][j][..sizes[j]] == out[k][j][..],
                "{path} comm {k} message {j} differs"
            );
        }
        let workers = engine::pool::started_workers(path).expect("the pool started");
        assert!(workers >= 1 && threads_named("ncclbpf io") >= workers);
        for (s, r) in pairs {
            s.close();
            r.close();
        }
    }
}

/// Closing comms whose chunks are still queued or in flight (nobody receives; nobody
/// sends) returns at once on every path, and the pool serves new comms afterwards.
#[test]
fn closing_with_chunks_in_flight_does_not_hang() {
    for (i, path) in paths().into_iter().enumerate() {
        let base = 0x7f00_0000 + 0x1000 * i as u64;
        let (s, r) = pair_on(path, base, base + 1);
        // 64 MiB to a receiver that never posts: the sender's chunks block in the kernel.
        let mut data = vec![3u8; 64 << 20];
        let _sq = s.isend(buf(&mut data)).unwrap().unwrap();
        // A receive for a message nobody sends.
        let (s2, r2) = pair_on(path, base + 2, base + 3);
        let mut into = vec![0u8; BIG];
        let _rq = r2.irecv(buf(&mut into)).unwrap().unwrap();
        let mut one = vec![1u8; BIG];
        let q = s2.isend(buf(&mut one)).unwrap().unwrap();
        wait(&s2, q).unwrap();
        let t0 = Instant::now();
        s.close();
        r.close();
        s2.close();
        r2.close();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{path}: closing took {:?}",
            t0.elapsed()
        );
        // The same path still carries new comms.
        let (s, r) = pair_on(path, base + 4, base + 5);
        let mut m: Vec<u8> = (0..BIG).map(|b| b as u8).collect();
        let mut got = vec![0u8; BIG];
        let rq = r.irecv(buf(&mut got)).unwrap().unwrap();
        let sq = s.isend(buf(&mut m)).unwrap().unwrap();
        assert_eq!(wait(&s, sq).unwrap(), BIG);
        assert_eq!(wait(&r, rq).unwrap(), BIG);
        assert!(got == m);
        s.close();
        r.close();
    }
}

/// A peer that goes away mid-message fails the pending receive with a remote error on
/// every path (the stream's end is seen by the engine, not only by `test`).
#[test]
fn a_peer_gone_mid_message_fails_the_receive() {
    for (i, path) in paths().into_iter().enumerate() {
        let base = 0x7f10_0000 + 0x1000 * i as u64;
        let (s, r) = pair_on(path, base, base + 1);
        let mut into = vec![0u8; 16 << 20];
        let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
        let mut data = vec![5u8; 16 << 20];
        let _sq = s.isend(buf(&mut data)).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        s.close();
        match wait(&r, rq) {
            // All of it may have made it into the socket buffers before the close.
            Ok(n) => assert_eq!(n, 16 << 20),
            Err(e) => assert_eq!(e.code(), NcclResult::REMOTE_ERROR, "{path}: {e}"),
        }
        r.close();
    }
}

/// Chunks that arrive before their receive is posted wait in the kernel: the stream's
/// reader stops at the header and goes on once the receive is posted (a poke), on every
/// path; inline and chunked messages interleave, and every message arrives whole.
#[test]
fn chunks_wait_for_their_receive() {
    for (i, path) in paths().into_iter().enumerate() {
        let id = 0xc4a1_0001 + 0x10 * i as u64;
        let (s, r) = pair_on(path, id, id + 1);
        let sizes = [BIG, 1000, 3 * BIG + 5, 70_000, 2 * BIG];
        let mut out: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(j, &n)| (0..n).map(|b| (b * 11 + j) as u8).collect())
            .collect();
        let mut into: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let sends: Vec<_> = out
            .iter_mut()
            .map(|v| s.isend(buf(v)).unwrap().unwrap())
            .collect();
        let mut sent = vec![false; sizes.len()];
        let pump = |sent: &mut Vec<bool>| {
            for (j, q) in sends.iter().enumerate() {
                if !sent[j] && s.test(q.idx as usize).unwrap().is_some() {
                    sent[j] = true;
                }
            }
        };
        for j in 0..sizes.len() {
            // Give the chunks time to arrive (and the readers to stop) before the post.
            std::thread::sleep(Duration::from_millis(20));
            pump(&mut sent);
            let q = r.irecv(buf(&mut into[j])).unwrap().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let n = loop {
                pump(&mut sent);
                if let Some(n) = r.test(q.idx as usize).unwrap() {
                    break n;
                }
                assert!(Instant::now() < deadline, "{path}: message {j} stuck");
            };
            assert_eq!(n, sizes[j], "{path}: message {j}");
            assert!(into[j] == out[j], "{path}: message {j}'s bytes");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while sent.iter().any(|&d| !d) {
            pump(&mut sent);
            assert!(Instant::now() < deadline, "{path}: a send never completed");
        }
        s.close();
        r.close();
    }
}

/// A receive comm on `path` whose peer is the test: the control stream, then the data
/// streams, as raw sockets.
pub(super) fn raw_peer(path: engine::Path, id: u64) -> (Box<Comm>, Vec<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (mut raw, mut ends) = (Vec::new(), Vec::new());
    for _ in 0..=STREAMS {
        raw.push(TcpStream::connect(addr).unwrap());
        ends.push(l.accept().unwrap().0);
    }
    let ctl = ends.remove(0);
    let ep = Endpoint {
        dev: 0,
        comm_id: 0,
        quiet: false,
    };
    let r = Comm::on_path(ConnDirection::Recv, id, ep, SHAPE, ctl, ends, path).unwrap();
    (r, raw)
}

pub(super) fn chunk(seq: u64, size: u32, offset: u32, len: u32) -> [u8; wire::CHUNK_HEADER_SIZE] {
    wire::ChunkHeader {
        seq,
        size,
        offset,
        len,
    }
    .encode()
}

/// Writes chunk `i` of the plan for message `seq` of `size` bytes on `s`, header and
/// `fill` bytes; returns the chunk's length.
pub(super) fn planned(s: &mut TcpStream, seq: u64, size: usize, i: usize, fill: u8) -> usize {
    let mut plan = vec![];
    wire::plan_chunks(&SHAPE, size, |o, l| plan.push((o, l)));
    let (o, l) = plan[i];
    s.write_all(&chunk(seq, size as u32, o as u32, l as u32))
        .unwrap();
    s.write_all(&vec![fill; l]).unwrap();
    l
}

/// Tests `q` on `c` until it is done or fails, or 5 s pass ("HANG").
fn outcome(c: &Comm, q: &ReqSlot) -> Result<usize, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match c.test(q.idx as usize) {
            Ok(Some(n)) => return Ok(n),
            Err(e) => return Err(e.to_string()),
            Ok(None) if Instant::now() > deadline => return Err("HANG".into()),
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// A peer that breaks the chunk protocol fails the connection with a remote error, on
/// every path, and never gets a byte written outside a posted receive: a chunk past the
/// message's end, an empty chunk, one off the sender's plan, message numbers going back on
/// one stream, a chunk for an inline message, a chunk twice (two of them would otherwise
/// add up to a message with a hole), chunks that disagree on the size, a chunk for a
/// receive already over, a size no message has, a reserved word set.
#[test]
fn a_peer_that_breaks_the_chunk_protocol_fails_the_connection() {
    const POSTED: usize = 300_000;
    const GUARD: usize = 4096;
    type Play = fn(&mut [TcpStream]);
    let cases: [(&str, Play); 11] = [
        ("past the end", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            raw[1]
                .write_all(&chunk(0, 200_000, 250_000, 65536))
                .unwrap();
            raw[1].write_all(&[0xee; 65536]).unwrap();
        }),
        ("empty", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            raw[1].write_all(&chunk(0, 200_000, 0, 0)).unwrap();
        }),
        ("off the plan", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            raw[1].write_all(&chunk(0, 200_000, 1000, 65536)).unwrap();
            raw[1].write_all(&[0xee; 65536]).unwrap();
        }),
        ("back in order", |raw| {
            raw[0].write_all(&100_000u64.to_le_bytes()).unwrap();
            raw[0].write_all(&100_000u64.to_le_bytes()).unwrap();
            planned(&mut raw[1], 1, 100_000, 0, 0xee);
            planned(&mut raw[1], 0, 100_000, 0, 0xee);
        }),
        ("for an inline message", |raw| {
            // A chunked message first (the receive side's readers start with it).
            raw[0].write_all(&100_000u64.to_le_bytes()).unwrap();
            planned(&mut raw[1], 0, 100_000, 0, 0xee);
            planned(&mut raw[1], 0, 100_000, 1, 0xee);
            // Then a chunk for message 1, which the control stream sends inline.
            planned(&mut raw[2], 1, 100_000, 0, 0xee);
            std::thread::sleep(Duration::from_millis(30));
            raw[0].write_all(&10u64.to_le_bytes()).unwrap();
            raw[0].write_all(&[0x11; 10]).unwrap();
        }),
        ("twice", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            planned(&mut raw[1], 0, 200_000, 0, 0xee);
            planned(&mut raw[1], 0, 200_000, 1, 0xee);
            planned(&mut raw[2], 0, 200_000, 0, 0xee);
            planned(&mut raw[2], 0, 200_000, 1, 0xee);
        }),
        ("sizes disagree", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            planned(&mut raw[1], 0, 200_000, 0, 0xee);
            planned(&mut raw[2], 0, 131_072, 1, 0xee);
        }),
        ("a size unlike its header's", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            planned(&mut raw[1], 0, 131_072, 0, 0xee);
            planned(&mut raw[2], 0, 131_072, 1, 0xee);
        }),
        ("after its receive", |raw| {
            raw[0].write_all(&100_000u64.to_le_bytes()).unwrap();
            planned(&mut raw[1], 0, 100_000, 0, 0xee);
            planned(&mut raw[1], 0, 100_000, 1, 0xee);
            std::thread::sleep(Duration::from_millis(50));
            planned(&mut raw[2], 0, 100_000, 0, 0xee);
        }),
        ("a size no message has", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            raw[1]
                .write_all(&chunk(0, u32::MAX, 4095 << 20, 1 << 20))
                .unwrap();
            raw[1].write_all(&[0xee; 65536]).unwrap();
        }),
        ("reserved word", |raw| {
            raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
            let mut h = chunk(0, 200_000, 0, 65536);
            h[22] = 1;
            raw[1].write_all(&h).unwrap();
            raw[1].write_all(&[0xee; 65536]).unwrap();
        }),
    ];
    for (i, path) in paths().into_iter().enumerate() {
        for (c, (what, play)) in cases.iter().enumerate() {
            let id = 0xbad0_0000 + 0x100 * i as u64 + 2 * c as u64;
            let (r, mut raw) = raw_peer(path, id);
            // Two receives, each followed by a guard that no byte may reach, and a third
            // for a message that never comes.
            let mut mem = vec![0u8; 2 * (POSTED + GUARD)];
            let mut spare = [0u8; 16];
            let (a, b) = mem.split_at_mut(POSTED + GUARD);
            let qs = [
                r.irecv(buf(&mut a[..POSTED])).unwrap().unwrap(),
                r.irecv(buf(&mut b[..POSTED])).unwrap().unwrap(),
                r.irecv(buf(&mut spare)).unwrap().unwrap(),
            ];
            play(&mut raw);
            // A receive before the breach may complete; the comm fails at the latest on
            // the receive after it.
            let e = qs
                .iter()
                .find_map(|q| outcome(&r, q).err())
                .expect("the breach went unnoticed");
            assert!(
                e.contains("protocol") || e.contains("peer"),
                "{path}, {what}: {e}"
            );
            assert!(!e.contains("HANG"), "{path}, {what}: {e}");
            r.close();
            for g in [&mem[POSTED..POSTED + GUARD], &mem[2 * POSTED + GUARD..]] {
                assert!(
                    g.iter().all(|&b| b == 0),
                    "{path}, {what}: a guard was written"
                );
            }
        }
    }
}

/// A peer that dies while a message still owes a chunk fails the receive, on every path,
/// even when a stream has already read the header of the next message (not posted, so it
/// stopped there and never reads its end): every stream is past the message, so no byte
/// of it can come.
#[test]
fn a_dead_peer_fails_a_short_receive_even_with_a_stream_stopped_ahead() {
    for (i, path) in paths().into_iter().enumerate() {
        let (r, mut raw) = raw_peer(path, 0x5e71_0000 + 0x10 * i as u64);
        let mut into = vec![0u8; 200_000];
        let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
        // Message 0: 200,000 bytes, four chunks; only the first comes (stream 1) ...
        raw[0].write_all(&200_000u64.to_le_bytes()).unwrap();
        planned(&mut raw[1], 0, 200_000, 0, 7);
        // ... followed on the same stream by the first header of message 1 (not posted).
        raw[1].write_all(&chunk(1, 100_000, 0, 65536)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        drop(raw);
        let out = outcome(&r, rq);
        assert!(
            out.as_ref().is_err_and(|e| e.contains("moved past")),
            "{path}: {out:?}"
        );
        r.close();
    }
}

/// A sender ahead by one message and then closed with chunks still queued (as
/// `ncclCommAbort` does on a failing rank): the receiver, which posted only the first
/// message, sees it complete or fail, never hang, on every path.
#[test]
fn an_aborted_sender_ahead_by_one_message_never_hangs_the_receiver() {
    for (i, path) in paths().into_iter().enumerate() {
        for round in 0..8u64 {
            let id = 0x5e72_0000 + 0x1000 * i as u64 + 2 * round;
            let (s, r) = pair_on(path, id, id + 1);
            let mut m0 = vec![1u8; 16 << 20];
            let mut m1 = vec![2u8; 16 << 20];
            let mut into = vec![0u8; 16 << 20];
            let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
            let _a = s.isend(buf(&mut m0)).unwrap().unwrap();
            let _b = s.isend(buf(&mut m1)).unwrap().unwrap();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(1 + round % 8) {
                let _ = r.test(rq.idx as usize);
            }
            s.close();
            let out = outcome(&r, rq);
            assert!(
                out.as_ref().is_ok_and(|&n| n == 16 << 20)
                    || out.as_ref().is_err_and(|e| e != "HANG"),
                "{path} round {round}: {out:?}"
            );
            r.close();
        }
    }
}

/// Once a receive fails for a reason of the comm's (here a truncated message), the data
/// streams are shut down: a reader that held a claim lets go, and bytes the peer sends
/// after the failure never land in the buffer.
#[test]
fn no_byte_lands_after_a_reported_failure() {
    for (i, path) in paths().into_iter().enumerate() {
        let (r, mut raw) = raw_peer(path, 0x5e73_0000 + 0x10 * i as u64);
        // Message 0, whole, starts the data streams' readers.
        let mut first = vec![0u8; 100_000];
        let q0 = r.irecv(buf(&mut first)).unwrap().unwrap();
        raw[0].write_all(&100_000u64.to_le_bytes()).unwrap();
        planned(&mut raw[1], 0, 100_000, 0, 0x11);
        planned(&mut raw[1], 0, 100_000, 1, 0x11);
        assert_eq!(outcome(&r, q0), Ok(100_000), "{path}");
        // Message 1: half a chunk, then a control header that says more than was posted.
        let mut into = vec![0u8; 300_000];
        let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
        raw[2].write_all(&chunk(1, 200_000, 0, 65536)).unwrap();
        raw[2].write_all(&[0xaa; 30_000]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        raw[0].write_all(&400_000u64.to_le_bytes()).unwrap();
        let e = outcome(&r, rq).unwrap_err();
        assert!(e.contains("truncated"), "{path}: {e}");
        // The peer goes on; nothing more lands.
        let _ = raw[2].write_all(&[0xbb; 35_536]);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            into[30_000..].iter().all(|&b| b == 0),
            "{path}: written after the failure"
        );
        // The reader lets go of its claim once it sees the shutdown; NCCL's next test of the
        // failed request then releases its slot.
        let deadline = Instant::now() + Duration::from_secs(5);
        while lock(&r.state).free.len() < SLOTS {
            assert!(r.test(rq.idx as usize).is_err(), "{path}");
            assert!(
                Instant::now() < deadline,
                "{path}: the slot is never released"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(raw);
        r.close();
    }
}

/// A receive whose every byte has landed completes even if the comm has failed since for
/// a later one (here the sender closed after its last message while one more receive was
/// posted), on every path.
#[test]
fn a_complete_receive_completes_after_a_later_error() {
    for (i, path) in paths().into_iter().enumerate() {
        let id = 0x5e75_0000 + 0x10 * i as u64;
        let (s, r) = pair_on(path, id, id + 1);
        let mut m: Vec<u8> = (0..BIG).map(|b| b as u8).collect();
        let mut into = vec![0u8; BIG];
        let rq = r.irecv(buf(&mut into)).unwrap().unwrap();
        let sq = s.isend(buf(&mut m)).unwrap().unwrap();
        assert_eq!(wait(&s, sq).unwrap(), BIG);
        s.close();
        let deadline = Instant::now() + Duration::from_secs(5);
        while r.slots[rq.idx as usize].received.load(Ordering::SeqCst) < BIG as u64 {
            assert!(Instant::now() < deadline, "{path}");
            // Progresses the control stream (reads the header; starts the readers).
            let _ = r.take_frames();
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut more = vec![0u8; 16];
        let next = r.irecv(buf(&mut more)).unwrap().unwrap();
        assert!(outcome(&r, next).is_err(), "{path}: the sender is gone");
        assert_eq!(outcome(&r, rq), Ok(BIG), "{path}");
        assert!(into == m, "{path}");
        r.close();
    }
}

/// Each chunk goes to the stream with the fewest bytes queued, ties going round from the
/// stream after the last one used.
#[test]
fn chunks_go_to_the_least_loaded_stream() {
    let q = |v: &[u64]| -> Vec<Arc<AtomicU64>> {
        v.iter().map(|&b| Arc::new(AtomicU64::new(b))).collect()
    };
    assert_eq!(least_queued(&q(&[0, 0, 0, 0]), 0), 0);
    assert_eq!(least_queued(&q(&[0, 0, 0, 0]), 2), 2);
    assert_eq!(least_queued(&q(&[5, 0, 7, 0]), 2), 3);
    assert_eq!(least_queued(&q(&[5, 9, 7, 8]), 1), 0);
    assert_eq!(least_queued(&q(&[1 << 40, 3, 3, 3]), 0), 1);
}

/// A peer that puts each planned chunk on any stream it likes (in message order per stream, as
/// the protocol asks), inline and chunked messages mixed, while the receiver posts its receives
/// a few at a time and late: every message arrives whole and in order, on every path. Seeded,
/// bounded (a few seconds), each seed printed on failure.
#[test]
fn chunks_on_any_stream_in_any_interleaving_arrive_whole() {
    for (i, path) in paths().into_iter().enumerate() {
        for seed in 1..=6u64 {
            let mut rng =
                fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15 ^ (seed * 0x1000 + i as u64));
            let id = 0xa11c_0000 + 0x100 * i as u64 + 2 * seed;
            let (r, mut raw) = raw_peer(path, id);
            let count = 10;
            let sizes: Vec<usize> = (0..count)
                .map(|_| match rng.u64(..4) {
                    0 => rng.u64(..65_537) as usize,
                    1 => 65_537 + rng.u64(..200_000) as usize,
                    _ => 300_000 + rng.u64(..3 << 20) as usize,
                })
                .collect();
            let msgs: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(m, &n)| {
                    (0..n)
                        .map(|b| (b * 7 + m * 13 + seed as usize) as u8)
                        .collect()
                })
                .collect();
            // What each stream carries, in order: the control stream, then the data streams.
            let mut wire: Vec<Vec<u8>> = vec![vec![]; STREAMS as usize + 1];
            for (m, msg) in msgs.iter().enumerate() {
                wire[0].extend_from_slice(&(msg.len() as u64).to_le_bytes());
                if wire::is_inline(&SHAPE, msg.len()) {
                    wire[0].extend_from_slice(msg);
                    continue;
                }
                wire::plan_chunks(&SHAPE, msg.len(), |o, l| {
                    let k = 1 + rng.u64(..u64::from(STREAMS)) as usize;
                    wire[k].extend_from_slice(&chunk(
                        m as u64,
                        msg.len() as u32,
                        o as u32,
                        l as u32,
                    ));
                    wire[k].extend_from_slice(&msg[o..o + l]);
                });
            }
            let writers: Vec<_> = raw
                .drain(..)
                .zip(wire)
                .map(|(mut s, bytes)| {
                    std::thread::spawn(move || {
                        let _ = s.write_all(&bytes);
                        s
                    })
                })
                .collect();
            let mut into: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n.max(1)]).collect();
            let mut posted = Vec::new();
            let mut next = 0;
            for m in 0..count {
                // Keep 1..=3 receives posted ahead, sometimes after a pause.
                let ahead = 1 + rng.u64(..3) as usize;
                while next < count && next < m + ahead {
                    if rng.u64(..3) == 0 {
                        std::thread::sleep(Duration::from_millis(rng.u64(..5)));
                    }
                    let b = buf(&mut into[next]);
                    posted.push(r.irecv(b).unwrap().unwrap());
                    next += 1;
                }
                let got = outcome(&r, posted[m]);
                assert_eq!(got, Ok(sizes[m]), "{path}, seed {seed}, message {m}");
                assert!(
                    into[m][..sizes[m]] == msgs[m][..],
                    "{path}, seed {seed}, message {m}'s bytes"
                );
            }
            for w in writers {
                drop(w.join().unwrap());
            }
            r.close();
        }
    }
}
