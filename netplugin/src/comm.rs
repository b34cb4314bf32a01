//! The data path of one connection end: `isend`, `irecv`, `test` and close.
//!
//! A connection is one control stream plus `nstreams` data streams (TCP). For each message the
//! sender writes an 8-byte size on the control stream; a message of at most `inline_bytes`
//! follows on the control stream itself, a larger one is cut into chunks over the data streams
//! (see [`wire::plan_chunks`]), each served by its own helper thread with blocking I/O. The
//! control stream is non-blocking and progressed by NCCL's proxy thread inside `isend`, `irecv`
//! and `test`, so small messages never wait for a thread hand-off.
//!
//! Messages match in posting order. A receive smaller than the incoming message fails the
//! request with [`NetError::Truncated`] and the connection with it (its byte stream is then out
//! of step). A peer that closes or dies fails every pending request as soon as its socket
//! reports it; later calls on the comm return the first error.

use crate::buf::Buf;
use crate::error::{NetError, NetResult};
use crate::hooks::{ConnHooks, ConnInfo};
use crate::setup::Endpoint;
use crate::wire::{self, MSG_HEADER_SIZE, Shape};
use crossbeam_channel::{Receiver, Sender};
use shared_maps::ConnDirection;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// Request slots per comm: NCCL needs 32 (x maxRecvs = 1) in flight.
pub const SLOTS: usize = 64;
const SLOT_MAGIC: u64 = 0x5145_5246_5042_4e43;

/// What NCCL holds as a request: a slot of its comm. Helper threads count its chunks down.
pub struct ReqSlot {
    magic: u64,
    comm: AtomicPtr<Comm>,
    idx: u32,
    pending_chunks: AtomicU32,
    failed: AtomicBool,
}

impl ReqSlot {
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
}

const IDLE: Req = Req {
    in_use: false,
    buf: Buf::EMPTY,
    size: 0,
    inline: true,
    header_done: false,
    ctrl_done: false,
    posted: None,
};

struct Task {
    idx: u32,
    buf: Buf,
}

struct Workers {
    txs: Vec<Sender<Task>>,
    joins: Vec<JoinHandle<()>>,
}

struct State {
    control: TcpStream,
    data: Vec<Arc<TcpStream>>,
    workers: Option<Workers>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    /// Posted requests whose control-stream part is not finished, oldest first.
    fifo: VecDeque<u32>,
    /// Bytes of the fifo head's control part (header + inline payload) done so far.
    cursor: usize,
    header: [u8; MSG_HEADER_SIZE],
    next_stream: u32,
    error: Option<NetError>,
}

impl State {
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
    shape: Shape,
    slots: Arc<[ReqSlot]>,
    worker_error: Arc<Mutex<Option<String>>>,
    state: Mutex<State>,
    hooks: ConnHooks,
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
        control
            .set_nonblocking(true)
            .map_err(|e| NetError::io("set_nonblocking", e))?;
        let peer_port = control.peer_addr().map(|a| a.port()).unwrap_or(0);
        for s in &data {
            s.set_nonblocking(false)
                .map_err(|e| NetError::io("set_nonblocking", e))?;
        }
        let slots: Arc<[ReqSlot]> = (0..SLOTS as u32)
            .map(|idx| ReqSlot {
                magic: SLOT_MAGIC,
                comm: AtomicPtr::new(std::ptr::null_mut()),
                idx,
                pending_chunks: AtomicU32::new(0),
                failed: AtomicBool::new(false),
            })
            .collect();
        let comm = Box::new(Comm {
            direction,
            conn_id,
            shape,
            slots,
            worker_error: Arc::new(Mutex::new(None)),
            state: Mutex::new(State {
                control,
                data: data.into_iter().map(Arc::new).collect(),
                workers: None,
                reqs: vec![IDLE; SLOTS],
                free: (0..SLOTS as u32).rev().collect(),
                fifo: VecDeque::with_capacity(SLOTS),
                cursor: 0,
                header: [0; MSG_HEADER_SIZE],
                next_stream: 0,
                error: None,
            }),
            hooks: ConnHooks::on_open(ConnInfo {
                direction,
                conn_id,
                peer_port,
                dev: endpoint.dev,
                comm_id: endpoint.comm_id,
                nstreams: shape.nstreams,
            }),
        });
        let ptr = &*comm as *const Comm as *mut Comm;
        for s in comm.slots.iter() {
            s.comm.store(ptr, Ordering::Release);
        }
        Ok(comm)
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Posts a send. `Ok(None)` means every slot is busy: NCCL retries later.
    pub fn isend(&self, buf: Buf) -> NetResult<Option<&ReqSlot>> {
        let mut st = lock(&self.state);
        if let Some(e) = &st.error {
            return Err(e.as_broken());
        }
        let Some(idx) = st.free.pop() else {
            return Ok(None);
        };
        let size = buf.len();
        let inline = wire::is_inline(&self.shape, size);
        st.reqs[idx as usize] = Req {
            in_use: true,
            buf,
            size,
            inline,
            header_done: true,
            ctrl_done: false,
            posted: self.hooks.wants_time().then(Instant::now),
        };
        if !inline {
            self.dispatch(&mut st, idx, buf)?;
        }
        st.fifo.push_back(idx);
        self.hooks.on_post(size);
        self.progress_send(&mut st);
        Ok(Some(&self.slots[idx as usize]))
    }

    /// Posts a receive into `buf`. `Ok(None)` means every slot is busy.
    pub fn irecv(&self, buf: Buf) -> NetResult<Option<&ReqSlot>> {
        let mut st = lock(&self.state);
        if let Some(e) = &st.error {
            return Err(e.as_broken());
        }
        let Some(idx) = st.free.pop() else {
            return Ok(None);
        };
        st.reqs[idx as usize] = Req {
            in_use: true,
            buf,
            size: 0,
            inline: true,
            header_done: false,
            ctrl_done: false,
            posted: self.hooks.wants_time().then(Instant::now),
        };
        st.fifo.push_back(idx);
        self.hooks.on_post(buf.len());
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
        if slot.failed.load(Ordering::Acquire) && st.error.is_none() {
            let msg = lock(&self.worker_error)
                .clone()
                .unwrap_or_else(|| "data stream failed".into());
            st.error = Some(NetError::Broken(msg));
        }
        let r = st.reqs[idx];
        let chunks_done = slot.pending_chunks.load(Ordering::Acquire) == 0;
        if r.ctrl_done && chunks_done && !slot.failed.load(Ordering::Acquire) {
            self.release(&mut st, idx);
            self.hooks.on_complete(r.size, r.posted);
            return Ok(Some(r.size));
        }
        match &st.error {
            None => Ok(None),
            Some(e) => {
                let err = if matches!(e, NetError::Truncated { .. })
                    && st.fifo.front() == Some(&(idx as u32))
                {
                    NetError::Truncated {
                        incoming: r.size as u64,
                        posted: r.buf.len(),
                    }
                } else {
                    e.as_broken()
                };
                if chunks_done {
                    st.fifo.retain(|&i| i as usize != idx);
                    self.release(&mut st, idx);
                }
                self.hooks.on_error(err.code().0);
                Err(err)
            }
        }
    }

    fn release(&self, st: &mut State, idx: usize) {
        st.reqs[idx] = IDLE;
        self.slots[idx].failed.store(false, Ordering::Relaxed);
        st.free.push(idx as u32);
    }

    /// Hands the chunks of a large message to the helper threads.
    fn dispatch(&self, st: &mut State, idx: u32, buf: Buf) -> NetResult<()> {
        if st.workers.is_none() {
            st.workers = Some(self.start_workers(&st.data)?);
        }
        let mut pieces = Vec::new();
        wire::plan_chunks(
            &self.shape,
            buf.len(),
            &mut st.next_stream,
            |off, len, stream| pieces.push((buf.sub(off, len), stream)),
        );
        let slot = &self.slots[idx as usize];
        slot.pending_chunks
            .store(pieces.len() as u32, Ordering::Release);
        let workers = st.workers.as_ref().expect("started above");
        for (piece, stream) in pieces {
            if workers.txs[stream as usize]
                .send(Task { idx, buf: piece })
                .is_err()
            {
                // The helper thread is gone: the connection cannot carry this message.
                slot.failed.store(true, Ordering::Release);
                slot.pending_chunks.fetch_sub(1, Ordering::AcqRel);
            }
        }
        Ok(())
    }

    fn start_workers(&self, data: &[Arc<TcpStream>]) -> NetResult<Workers> {
        let mut txs = Vec::with_capacity(data.len());
        let mut joins = Vec::with_capacity(data.len());
        for (k, stream) in data.iter().enumerate() {
            let (tx, rx) = crossbeam_channel::unbounded();
            let ctx = WorkerCtx {
                direction: self.direction,
                stream: Arc::clone(stream),
                slots: Arc::clone(&self.slots),
                error: Arc::clone(&self.worker_error),
            };
            let tag = if self.direction == ConnDirection::Send {
                'S'
            } else {
                'R'
            };
            let join = std::thread::Builder::new()
                .name(format!("ncclbpf {tag}{k}"))
                .spawn(move || ctx.run(rx))
                .map_err(|e| NetError::io("spawning a helper thread", e))?;
            txs.push(tx);
            joins.push(join);
        }
        Ok(Workers { txs, joins })
    }

    fn progress_send(&self, st: &mut State) {
        if st.error.is_some() {
            return;
        }
        loop {
            let State {
                control,
                reqs,
                fifo,
                cursor,
                error,
                ..
            } = &mut *st;
            let Some(&idx) = fifo.front() else { return };
            let r = &mut reqs[idx as usize];
            let header = (r.size as u64).to_le_bytes();
            // SAFETY: NCCL keeps the send buffer alive and unmodified until the request is done.
            let payload: &[u8] = if r.inline {
                unsafe { r.buf.bytes() }
            } else {
                &[]
            };
            let total = MSG_HEADER_SIZE + payload.len();
            while *cursor < total {
                let res = if *cursor < MSG_HEADER_SIZE {
                    control
                        .write_vectored(&[IoSlice::new(&header[*cursor..]), IoSlice::new(payload)])
                } else {
                    control.write(&payload[*cursor - MSG_HEADER_SIZE..])
                };
                match res {
                    Ok(0) => {
                        *error = Some(NetError::io("send", io::ErrorKind::WriteZero.into()));
                        return;
                    }
                    Ok(n) => *cursor += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        *error = Some(NetError::io("send on control stream", e));
                        return;
                    }
                }
            }
            st.control_done(idx);
        }
    }

    fn progress_recv(&self, st: &mut State) {
        if st.error.is_some() {
            return;
        }
        loop {
            let State {
                control,
                reqs,
                fifo,
                cursor,
                header,
                error,
                ..
            } = &mut *st;
            let Some(&idx) = fifo.front() else { return };
            let r = &mut reqs[idx as usize];
            while *cursor < MSG_HEADER_SIZE {
                match read_some(control, &mut header[*cursor..]) {
                    Ok(0) => return,
                    Ok(n) => *cursor += n,
                    Err(e) => {
                        *error = Some(e);
                        return;
                    }
                }
            }
            if !r.header_done {
                let incoming = u64::from_le_bytes(*header);
                r.header_done = true;
                if incoming > r.buf.len() as u64 {
                    r.size = incoming.min(usize::MAX as u64) as usize;
                    *error = Some(NetError::Truncated {
                        incoming,
                        posted: r.buf.len(),
                    });
                    return;
                }
                r.size = incoming as usize;
                r.inline = wire::is_inline(&self.shape, r.size);
                if !r.inline {
                    let piece = r.buf.sub(0, r.size);
                    if let Err(e) = self.dispatch(st, idx, piece) {
                        st.error = Some(e);
                        return;
                    }
                    st.control_done(idx);
                    continue;
                }
            }
            let r = &mut reqs[idx as usize];
            // SAFETY: NCCL lent this receive buffer to us until the request completes; only
            // this thread (holding the comm lock) touches its inline part.
            let dst = unsafe { r.buf.sub(0, r.size).bytes_mut() };
            while *cursor - MSG_HEADER_SIZE < r.size {
                match read_some(control, &mut dst[*cursor - MSG_HEADER_SIZE..]) {
                    Ok(0) => return,
                    Ok(n) => *cursor += n,
                    Err(e) => {
                        *error = Some(e);
                        return;
                    }
                }
            }
            st.control_done(idx);
        }
    }

    /// Stops the helper threads and closes every stream. Pending requests are abandoned.
    pub fn close(self: Box<Self>) {
        self.hooks.on_close();
        let mut st = lock(&self.state);
        let workers = st.workers.take();
        for s in &st.data {
            let _ = s.shutdown(Shutdown::Both);
        }
        let _ = st.control.shutdown(Shutdown::Both);
        drop(st);
        if let Some(w) = workers {
            drop(w.txs);
            for j in w.joins {
                let _ = j.join();
            }
        }
    }
}

/// Non-blocking read: `Ok(0)` means "nothing now"; end of stream is an error.
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> NetResult<usize> {
    loop {
        return match s.read(buf) {
            Ok(0) if !buf.is_empty() => Err(NetError::PeerClosed {
                op: "receive on control stream",
                detail: "end of stream".into(),
            }),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(NetError::io("receive on control stream", e)),
        };
    }
}

struct WorkerCtx {
    direction: ConnDirection,
    stream: Arc<TcpStream>,
    slots: Arc<[ReqSlot]>,
    error: Arc<Mutex<Option<String>>>,
}

impl WorkerCtx {
    /// Serves one data stream until its comm closes the channel.
    fn run(self, rx: Receiver<Task>) {
        let mut broken = false;
        for task in rx {
            let slot = &self.slots[task.idx as usize];
            if !broken {
                let mut s = &*self.stream;
                // SAFETY: this chunk of the lent buffer is handed to this thread alone, and the
                // request cannot complete (freeing the buffer) until pending_chunks drops below.
                let res = unsafe {
                    match self.direction {
                        ConnDirection::Send => s.write_all(task.buf.bytes()),
                        ConnDirection::Recv => s.read_exact(task.buf.bytes_mut()),
                    }
                };
                if let Err(e) = res {
                    broken = true;
                    let what = if self.direction == ConnDirection::Send {
                        "send"
                    } else {
                        "receive"
                    };
                    let err = NetError::io("data stream", e);
                    lock(&self.error)
                        .get_or_insert_with(|| format!("{what} on data stream: {err}"));
                }
            }
            if broken {
                slot.failed.store(true, Ordering::Release);
            }
            slot.pending_chunks.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
