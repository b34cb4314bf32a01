//! The data path of one connection end: `isend`, `irecv`, `test` and close.
//!
//! A connection is one control stream plus `nstreams` data streams (TCP). For each message the
//! sender writes an 8-byte size on the control stream; a message of at most `inline_bytes`
//! follows on the control stream itself, a larger one is cut into chunks (see
//! [`wire::plan_chunks`]), each with a header naming its message and offset, and each put on the
//! data stream with the fewest bytes queued, so a slow stream takes fewer. The process's I/O
//! engine moves them ([`crate::engine`]: a few process-wide io_uring or epoll workers, or a
//! helper thread per stream); on the receive side it reads the headers itself and copies each
//! chunk into the receive it names as soon as it arrives ([`engine::posts`]). The control
//! stream is non-blocking and progressed by NCCL's proxy thread inside `isend`, `irecv` and
//! `test`, so small messages never wait for a thread hand-off.
//!
//! The control stream also carries *control frames* between messages ([`Comm::send_frame`],
//! [`Comm::take_frames`]; [`wire::FRAME_FLAG`]): the plugin's own bytes, for the agreement
//! between ranks, which never consume a posted receive. A frame is written only between
//! messages, and read between messages whenever the receiver progresses: inside NCCL's
//! `irecv`/`test`, and from the plugin's own thread while the agreement runs
//! ([`crate::frames`]), also when no receive is posted (a frame that follows a message whose
//! receive is not yet posted waits behind it).
//!
//! A request is reported (done or failed) by `test` only once no server of the data path holds
//! any part of its buffer, and a closed comm's servers hold none: see docs/io-engine.md, "When
//! a request's buffer is ours", and the one place that keeps it, at the end of
//! [`Comm::test`].
//!
//! Messages match in posting order. A receive smaller than the incoming message fails the
//! request with [`NetError::Truncated`] and the connection with it (its byte stream is then out
//! of step). A peer that closes or dies fails every pending request as soon as its socket
//! reports it; a peer that breaks the chunk protocol fails the connection before a byte lands
//! outside a posted receive; later calls on the comm return the first error.
//!
//! Here: the comm, its request slots, `isend`/`irecv`/`test` and close; `send.rs` the send side
//! (control-stream writes, chunk dispatch), `recv.rs` the receive side (headers, inline
//! messages, when a chunked receive is done), `frames.rs` the control frames.
//!
//! A comm's data streams join the engine when it first carries a large message. If the OS
//! refuses the threads that needs (EAGAIN under a pid or thread limit), no request slot is
//! kept and the comm fails with `ncclSystemError` and a message naming the limit. A panic in a
//! stream's I/O is caught there: its request fails (`ncclInternalError`, the panic's message),
//! the comm with it, and the host process carries on.

use crate::buf::Buf;
use crate::engine::posts::Posts;
use crate::engine::{self, DataPath, StreamCtx, Task};
use crate::error::{NetError, NetResult};
use crate::hooks::{ConnHooks, ConnInfo, Ends};
use crate::rxbuf::RxBuf;
use crate::setup::Endpoint;
use crate::wire::{self, MSG_HEADER_SIZE, Shape};
use ncclnet_headers::NcclResult;
use shared_maps::{ConnDirection, ProgressMark};
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

mod frames;
mod recv;
mod send;

/// Request slots per comm: NCCL needs 32 (x maxRecvs = 1) in flight.
pub const SLOTS: usize = 64;
/// Queued messages whose control parts one write carries at most.
const SEND_BATCH: usize = 16;
const SLOT_MAGIC: u64 = 0x5145_5246_5042_4e43;

/// What NCCL holds as a request: a slot of its comm. The I/O engine counts a send's chunks
/// down, and a receive's bytes up.
pub struct ReqSlot {
    magic: u64,
    comm: AtomicPtr<Comm>,
    idx: u32,
    /// Send: chunks not yet sent.
    pub(crate) pending_chunks: AtomicU32,
    /// Receive: chunk bytes landed in the buffer.
    pub(crate) received: AtomicU64,
    /// Receive: readers holding a claim on the buffer ([`engine::posts`]).
    pub(crate) busy: AtomicU32,
    pub(crate) failed: AtomicBool,
}

impl ReqSlot {
    /// `n` free slots, not yet tied to a comm.
    pub(crate) fn fresh(n: usize) -> Arc<[ReqSlot]> {
        (0..n as u32)
            .map(|idx| ReqSlot {
                magic: SLOT_MAGIC,
                comm: AtomicPtr::new(std::ptr::null_mut()),
                idx,
                pending_chunks: AtomicU32::new(0),
                received: AtomicU64::new(0),
                busy: AtomicU32::new(0),
                failed: AtomicBool::new(false),
            })
            .collect()
    }

    /// The comm this request belongs to, if `self` really is one of our request slots.
    pub fn comm(&self) -> NetResult<(&Comm, usize)> {
        let comm = self.comm.load(Ordering::Acquire);
        if self.magic != SLOT_MAGIC || comm.is_null() {
            return Err(NetError::Misuse(
                "test() called with a pointer that is not a request".into(),
            ));
        }
        // SAFETY: the pointer was set from the live Box<Comm> that owns this slot; NCCL only
        // tests requests of comms it has not closed.
        Ok((unsafe { &*comm }, self.idx as usize))
    }
}

#[derive(Clone, Copy)]
struct Req {
    in_use: bool,
    buf: Buf,
    /// Send: the message size. Recv: the incoming size once its header is read.
    size: usize,
    inline: bool,
    header_done: bool,
    ctrl_done: bool,
    /// When it was posted, if a policy wants latencies.
    posted: Option<Instant>,
    /// Its message's number on the connection (a receive: the chunks' headers name it).
    seq: u64,
}

const IDLE: Req = Req {
    in_use: false,
    buf: Buf::EMPTY,
    size: 0,
    inline: true,
    header_done: false,
    ctrl_done: false,
    posted: None,
    seq: 0,
};

struct State {
    control: TcpStream,
    /// What was read from `control` and not yet handed out (headers, inline payloads, frames).
    rx: RxBuf,
    data: Arc<[Arc<TcpStream>]>,
    /// Who moves the data streams' chunks, once the first large message needs them.
    workers: Option<DataPath>,
    /// Per data stream: bytes queued with `workers` and not yet sent (a send comm).
    queued: Vec<Arc<AtomicU64>>,
    /// The posted receives, as the data streams' readers see them (a receive comm).
    posts: Arc<Posts>,
    /// Messages posted so far (a send comm): the next one's number in its chunk headers.
    sent: u64,
    /// The data streams were shut down (the comm failed).
    data_shut: bool,
    reqs: Vec<Req>,
    free: Vec<u32>,
    /// Posted requests whose control-stream part is not finished, oldest first.
    fifo: VecDeque<u32>,
    /// Bytes of the fifo head's control part (header + inline payload) done so far.
    cursor: usize,
    header: [u8; MSG_HEADER_SIZE],
    next_stream: u32,
    error: Option<NetError>,
    /// Whether `error` has been returned to NCCL once (later reports say "failed earlier").
    reported: bool,
    /// Writes that carried the control parts of more than one queued message.
    batched_writes: u64,
    /// The connection's hooks: here, so that every hook call runs under this lock.
    hooks: ConnHooks,
    /// Control frames to send (header included), oldest first; `frame_cursor` bytes of the
    /// first are written.
    frames_out: VecDeque<Vec<u8>>,
    frames_out_bytes: usize,
    /// Frames dropped because the peer did not take them.
    frames_out_dropped: u64,
    frame_cursor: usize,
    /// The frame being received (its length once its header is read) and those received.
    frame_in: Option<(usize, Vec<u8>)>,
    inbox: VecDeque<Vec<u8>>,
    inbox_bytes: usize,
    /// Frames dropped because the inbox was full.
    frames_dropped: u64,
    /// The peer closed the control stream at a message boundary, seen while no receive needed
    /// it: not an error until one does (the last message's chunks may still be arriving on
    /// the data streams).
    closed: bool,
}

/// Received frames kept until [`Comm::take_frames`], in number and in bytes; beyond either the
/// oldest are dropped (and counted). A process that runs no agreement never takes them, so this
/// is all a peer's frames can cost it per connection.
pub const MAX_INBOX: usize = 1024;
pub const MAX_INBOX_BYTES: usize = 1 << 20;
/// Control frames queued for a peer that does not read them (stalled, or not reading its control
/// stream) are kept up to this many bytes; beyond, the oldest not yet started are dropped (the
/// agreement's records stay on its board, and reach a connection that opens later).
pub const MAX_OUTBOX_BYTES: usize = 4 << 20;

impl State {
    /// The comm's error as the next call reports it: the error itself the first time, then
    /// "connection failed earlier: …" with the same code.
    fn report(&mut self) -> Option<NetError> {
        let e = self.error.as_ref()?;
        let out = if self.reported {
            e.as_broken()
        } else {
            e.same()
        };
        self.reported = true;
        Some(out)
    }

    /// The fifo head's control-stream part (header and inline payload) is complete.
    fn control_done(&mut self, idx: u32) {
        self.reqs[idx as usize].ctrl_done = true;
        self.fifo.pop_front();
        self.cursor = 0;
    }
}

/// One end (send or recv) of a connection.
pub struct Comm {
    pub direction: ConnDirection,
    pub conn_id: u64,
    /// Where the control stream's ends are (the peer's address, this end's port).
    pub ends: Ends,
    /// The peer's port of the control stream.
    pub peer_port: u16,
    shape: Shape,
    /// Who serves the data streams (the process's choice; tests pick one).
    path: engine::Path,
    slots: Arc<[ReqSlot]>,
    /// The first failure of a data stream (I/O error, caught panic, broken chunk protocol);
    /// `test` moves it into `State.error` once `stream_failed` says it is there.
    worker_error: Arc<Mutex<Option<NetError>>>,
    stream_failed: Arc<AtomicBool>,
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Comm {
    pub fn new(
        direction: ConnDirection,
        conn_id: u64,
        endpoint: Endpoint,
        shape: Shape,
        control: TcpStream,
        data: Vec<TcpStream>,
    ) -> NetResult<Box<Comm>> {
        let path = if data.is_empty() {
            // Nothing for an engine to serve: do not start one.
            engine::Path::Threads
        } else {
            engine::process_path()
        };
        Comm::on_path(direction, conn_id, endpoint, shape, control, data, path)
    }

    /// [`Comm::new`] with its data streams served by `path`.
    pub fn on_path(
        direction: ConnDirection,
        conn_id: u64,
        endpoint: Endpoint,
        shape: Shape,
        control: TcpStream,
        data: Vec<TcpStream>,
        path: engine::Path,
    ) -> NetResult<Box<Comm>> {
        control
            .set_nonblocking(true)
            .map_err(|e| NetError::io("set_nonblocking", e))?;
        let peer = control.peer_addr().ok();
        let ends = Ends {
            peer_ip: peer.map(|a| a.ip().to_canonical()),
            local_port: control.local_addr().map_or(0, |a| a.port()),
        };
        let peer_port = peer.map_or(0, |a| a.port());
        for s in &data {
            s.set_nonblocking(false)
                .map_err(|e| NetError::io("set_nonblocking", e))?;
        }
        let slots = ReqSlot::fresh(SLOTS);
        let comm = Box::new(Comm {
            direction,
            conn_id,
            ends,
            peer_port,
            shape,
            path,
            slots,
            worker_error: Arc::new(Mutex::new(None)),
            stream_failed: Arc::new(AtomicBool::new(false)),
            state: Mutex::new(State {
                control,
                rx: RxBuf::default(),
                queued: data.iter().map(|_| Arc::new(AtomicU64::new(0))).collect(),
                posts: Arc::new(Posts::new(SLOTS, shape)),
                sent: 0,
                data_shut: false,
                data: data.into_iter().map(Arc::new).collect(),
                workers: None,
                reqs: vec![IDLE; SLOTS],
                free: (0..SLOTS as u32).rev().collect(),
                fifo: VecDeque::with_capacity(SLOTS),
                batched_writes: 0,
                cursor: 0,
                header: [0; MSG_HEADER_SIZE],
                next_stream: 0,
                error: None,
                reported: false,
                frames_out: VecDeque::new(),
                frames_out_bytes: 0,
                frames_out_dropped: 0,
                frame_cursor: 0,
                frame_in: None,
                inbox: VecDeque::new(),
                inbox_bytes: 0,
                frames_dropped: 0,
                closed: false,
                hooks: {
                    let info = ConnInfo {
                        direction,
                        conn_id,
                        peer_port,
                        dev: endpoint.dev,
                        comm_id: endpoint.comm_id,
                        nstreams: shape.nstreams,
                    };
                    if endpoint.quiet {
                        ConnHooks::quiet(info)
                    } else {
                        ConnHooks::on_open_at(info, ends)
                    }
                },
            }),
        });
        let ptr = &*comm as *const Comm as *mut Comm;
        for s in comm.slots.iter() {
            s.comm.store(ptr, Ordering::Release);
        }
        crate::frames::register(&comm);
        Ok(comm)
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Posts a send. `Ok(None)` means every slot is busy: NCCL retries later.
    pub fn isend(&self, buf: Buf) -> NetResult<Option<&ReqSlot>> {
        let mut st = lock(&self.state);
        if let Some(e) = st.report() {
            return Err(e);
        }
        let size = buf.len();
        let inline = wire::is_inline(&self.shape, size);
        // The data path starts before a slot is taken: once one is, nothing below can fail.
        if !inline {
            self.ensure_workers(&mut st)?;
        }
        let Some(idx) = st.free.pop() else {
            return Ok(None);
        };
        let seq = st.sent;
        st.sent += 1;
        let posted = st.hooks.wants_time().then(Instant::now);
        st.reqs[idx as usize] = Req {
            in_use: true,
            buf,
            size,
            inline,
            header_done: true,
            ctrl_done: false,
            posted,
            seq,
        };
        if !inline {
            self.dispatch(&mut st, idx, seq, buf);
        }
        st.fifo.push_back(idx);
        st.hooks.on_post(size);
        self.progress_send(&mut st);
        Ok(Some(&self.slots[idx as usize]))
    }

    /// Posts a receive into `buf`. `Ok(None)` means every slot is busy.
    pub fn irecv(&self, buf: Buf) -> NetResult<Option<&ReqSlot>> {
        let mut st = lock(&self.state);
        if let Some(e) = st.report() {
            return Err(e);
        }
        let Some(idx) = st.free.pop() else {
            return Ok(None);
        };
        let posted = st.hooks.wants_time().then(Instant::now);
        let slot = &self.slots[idx as usize];
        slot.received.store(0, Ordering::Relaxed);
        slot.failed.store(false, Ordering::Relaxed);
        let (seq, waiting) = st.posts.post(idx, buf);
        st.reqs[idx as usize] = Req {
            in_use: true,
            buf,
            size: 0,
            inline: true,
            header_done: false,
            ctrl_done: false,
            posted,
            seq,
        };
        if let Some(w) = &st.workers {
            for k in (0..self.shape.nstreams as usize).filter(|k| waiting & (1 << k) != 0) {
                w.poke(k);
            }
        }
        st.fifo.push_back(idx);
        st.hooks.on_post(buf.len());
        self.progress_recv(&mut st);
        Ok(Some(&self.slots[idx as usize]))
    }

    /// Progresses the comm and reports whether request `idx` is done, with its size.
    pub fn test(&self, idx: usize) -> NetResult<Option<usize>> {
        let mut st = lock(&self.state);
        if !st.reqs.get(idx).is_some_and(|r| r.in_use) {
            return Err(NetError::Misuse(format!(
                "test() on request {idx} that is not posted"
            )));
        }
        match self.direction {
            ConnDirection::Send => self.progress_send(&mut st),
            ConnDirection::Recv => self.progress_recv(&mut st),
        }
        let slot = &self.slots[idx];
        if st.error.is_none()
            && (slot.failed.load(Ordering::Acquire) || self.stream_failed.load(Ordering::Acquire))
        {
            // The engine records its error before it marks the slot or the comm (both under
            // orderings that make the record visible here); the fallback is for safety only.
            let e = lock(&self.worker_error)
                .take()
                .unwrap_or_else(|| NetError::Broken {
                    msg: "a data stream failed".into(),
                    code: NcclResult::REMOTE_ERROR,
                });
            st.error = Some(e);
        }
        let r = st.reqs[idx];
        // A request whose every byte has moved completes, even after the comm failed for a
        // later one (the peer closing with one more receive posted, say).
        let mut done = false;
        if r.ctrl_done && !slot.failed.load(Ordering::Acquire) {
            done = match self.direction {
                ConnDirection::Send => slot.pending_chunks.load(Ordering::Acquire) == 0,
                ConnDirection::Recv => r.inline || self.received_all(&mut st, idx, r.size, r.seq),
            };
        }
        if !done && st.error.is_some() {
            // The connection is over: the peer fails too, rather than sending into a comm that
            // reads no more, and our servers' I/O on it ends (after the bytes already queued).
            self.shut_data_streams(&mut st);
        }
        if !done && st.error.is_none() {
            return Ok(None);
        }
        // THE request-buffer invariant (docs/io-engine.md, "When a request's buffer is ours"):
        // this is the one place a request is reported, done or failed, and it is reported only
        // once nothing of the data path holds its buffer. Until then it stays pending: NCCL
        // frees a failed request's buffers, and a server that still held one (a reader between
        // its claim and its copy, an io_uring request in flight) would write into freed memory.
        if !self.settled(&st, idx) {
            return Ok(None);
        }
        st.fifo.retain(|&i| i as usize != idx);
        self.release(&mut st, idx);
        if done {
            st.hooks.on_complete(r.size, r.posted);
            return Ok(Some(r.size));
        }
        let err = match &st.error {
            Some(NetError::Truncated { .. }) if r.header_done && r.size > r.buf.len() => {
                st.reported = true;
                NetError::Truncated {
                    incoming: r.size as u64,
                    posted: r.buf.len(),
                }
            }
            _ => st.report().expect("an error is set"),
        };
        st.hooks.on_error(err.code().0);
        Err(err)
    }

    /// Shuts every data stream of the comm down (once): the peer's streams end, writes fail, and
    /// a reader holding a claim reads only what the kernel had queued (to the end of its chunk)
    /// or the stream's end, then lets go.
    fn shut_data_streams(&self, st: &mut State) {
        if !st.data_shut {
            st.data_shut = true;
            for s in st.data.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Whether no thread of the data path (nor the kernel, for an io_uring request) holds any
    /// part of request `idx`: a request is reported, done or failed, only then (NCCL may free
    /// its buffer as soon as it is). A receive's post is retired first, so no reader claims it
    /// from then on.
    fn settled(&self, st: &State, idx: usize) -> bool {
        let slot = &self.slots[idx];
        match self.direction {
            ConnDirection::Send => slot.pending_chunks.load(Ordering::Acquire) == 0,
            ConnDirection::Recv => st.posts.retire(idx as u32, slot),
        }
    }

    fn release(&self, st: &mut State, idx: usize) {
        st.reqs[idx] = IDLE;
        self.slots[idx].failed.store(false, Ordering::Relaxed);
        st.free.push(idx as u32);
    }

    /// Starts the data path on the comm's first message that needs it.
    ///
    /// A refusal fails the comm for good rather than asking NCCL to retry (a NULL request).
    /// NCCL retries a NULL request without limit and without a word in its log, so a limit
    /// that stays exhausted (the usual case: a container's pids.max or `ulimit -u` shared by
    /// every rank and thread of the job) would become a silent hang of the whole job; NCCL
    /// itself treats a failed pthread_create as fatal (ncclSystemError). A failed comm instead
    /// says at once which limit to raise, and NCCL tears the communicator down.
    fn ensure_workers(&self, st: &mut State) -> NetResult<()> {
        if st.workers.is_some() {
            return Ok(());
        }
        let ctxs = self.stream_ctxs(&st.data, &st.posts, st.hooks.progress_mark());
        match DataPath::start(self.path, ctxs) {
            Ok(w) => {
                st.workers = Some(w);
                Ok(())
            }
            Err(msg) => {
                st.error = Some(NetError::Spawn(msg.clone()));
                Err(NetError::Spawn(msg))
            }
        }
    }

    fn stream_ctxs(
        &self,
        data: &Arc<[Arc<TcpStream>]>,
        posts: &Arc<Posts>,
        progress: Option<ProgressMark<'static>>,
    ) -> Vec<StreamCtx> {
        let tag = match self.direction {
            ConnDirection::Send => 'S',
            ConnDirection::Recv => 'R',
        };
        data.iter()
            .enumerate()
            .map(|(k, stream)| StreamCtx {
                direction: self.direction,
                name: format!("ncclbpf {tag}{k}"),
                conn_id: self.conn_id,
                index: k,
                stream: Arc::clone(stream),
                siblings: Arc::clone(data),
                slots: Arc::clone(&self.slots),
                error: Arc::clone(&self.worker_error),
                failed: Arc::clone(&self.stream_failed),
                progress,
                posts: (self.direction == ConnDirection::Recv).then(|| Arc::clone(posts)),
            })
            .collect()
    }

    /// Stops the data path and closes every stream (see `Drop`). Pending requests are
    /// abandoned.
    pub fn close(mut self: Box<Self>) {
        self.state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .hooks
            .on_close();
        drop(self);
    }
}

impl Drop for Comm {
    /// Whether closed by NCCL or dropped on an error path: shut every stream (so I/O in
    /// progress ends at once), then stop the data path, which returns once nothing touches the
    /// comm's buffers or sockets. A comm whose data path failed to start has none.
    fn drop(&mut self) {
        // First out of the frame mover's list (it may be using this comm until then).
        crate::frames::unregister(self);
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for s in st.data.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let _ = st.control.shutdown(Shutdown::Both);
        if let Some(w) = st.workers.take() {
            w.stop();
        }
    }
}

/// Test-only faults, keyed by connection id so tests running in parallel do not meet: the
/// shipped library has no such switch.
#[cfg(test)]
pub(crate) mod inject {
    use std::sync::Mutex;

    /// (connection id, helper index) whose thread "the OS refuses" (EAGAIN).
    static SPAWN_FAILS: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());
    /// (connection id, helper index) whose helper panics on every chunk.
    static HELPER_PANICS: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());

    fn has(list: &Mutex<Vec<(u64, usize)>>, conn: u64, k: usize) -> bool {
        super::lock(list).contains(&(conn, k))
    }

    pub fn spawn_fails(conn: u64, k: usize) -> bool {
        has(&SPAWN_FAILS, conn, k)
    }

    pub fn helper_panics(conn: u64, k: usize) -> bool {
        has(&HELPER_PANICS, conn, k)
    }

    pub fn fail_spawn(conn: u64, k: usize) {
        super::lock(&SPAWN_FAILS).push((conn, k));
    }

    pub fn panic_in_helper(conn: u64, k: usize) {
        super::lock(&HELPER_PANICS).push((conn, k));
    }
}

#[cfg(test)]
mod buffer_tests;
#[cfg(test)]
mod tests;
