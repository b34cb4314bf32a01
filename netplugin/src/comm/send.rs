//! The send side of a comm: a message's header (and an inline message's bytes) on the control
//! stream, written by NCCL's proxy thread in `isend` and `test`, queued messages gathered into
//! one `writev`; a large message cut into chunks, each queued on the data stream with the fewest
//! bytes waiting, for the engine to send.

use super::*;

impl Comm {
    /// Cuts message `seq` (request `idx`, bytes `buf`) into chunks and queues each, header
    /// first, on the data stream with the fewest bytes queued (ties go round from the stream
    /// after the last one used), so a slow stream takes fewer chunks. The data path is started
    /// ([`Self::ensure_workers`]). Never fails: a chunk nothing can take fails its request.
    pub(super) fn dispatch(&self, st: &mut State, idx: u32, seq: u64, buf: Buf) {
        // Messages are at most `ffi::MAX_MESSAGE` (< 2^31 bytes, checked at the ABI), so every
        // offset and length fits the header's 32 bits.
        debug_assert!(buf.len() <= u32::MAX as usize);
        let mut pieces = Vec::new();
        wire::plan_chunks(&self.shape, buf.len(), |off, len| pieces.push((off, len)));
        self.slots[idx as usize]
            .pending_chunks
            .store(pieces.len() as u32, Ordering::Release);
        let n = st.queued.len();
        for (off, len) in pieces {
            let k = least_queued(&st.queued, st.next_stream as usize);
            st.next_stream = ((k + 1) % n) as u32;
            let hdr = wire::ChunkHeader {
                seq,
                size: buf.len() as u32,
                offset: off as u32,
                len: len as u32,
            }
            .encode();
            let task = Task::new(
                idx,
                Box::new(hdr),
                buf.sub(off, len),
                &self.slots,
                &st.queued[k],
            );
            self.submit(st, k, task);
        }
    }

    /// Queues `task` with the data path on stream `k`; if nothing takes it, its request fails.
    pub(super) fn submit(&self, st: &mut State, k: usize, task: Task) {
        st.queued[k].fetch_add(task.wire_len() as u64, Ordering::AcqRel);
        let refused = match st.workers.as_ref() {
            Some(w) => w.submit(k, task).err(),
            None => Some(task),
        };
        if let Some(task) = refused {
            // Nothing serves this stream (a helper cannot exit while its sender lives, a
            // worker runs until the process ends, and both catch their panics, so this is a
            // bug): the message cannot be carried. The error is recorded first, so `test`
            // reports it; dropping the task fails the request and takes its bytes off the
            // stream's count.
            lock(&self.worker_error).get_or_insert_with(|| NetError::Broken {
                msg: format!("nothing serves data stream {k}"),
                code: NcclResult::INTERNAL_ERROR,
            });
            drop(task);
        }
    }

    /// One write on the control stream: `Some(n)` when n > 0 bytes went out; `None` when the
    /// caller must stop, because the stream would block or because it failed (`error` set).
    /// An interrupted write is tried again.
    pub(super) fn control_write(
        control: &mut TcpStream,
        error: &mut Option<NetError>,
        iov: &[IoSlice<'_>],
    ) -> Option<usize> {
        loop {
            match control.write_vectored(iov) {
                Ok(0) => {
                    *error = Some(NetError::io("send", io::ErrorKind::WriteZero.into()));
                    return None;
                }
                Ok(n) => return Some(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    *error = Some(NetError::io("send on control stream", e));
                    return None;
                }
            }
        }
    }

    /// Writes what the control stream takes now (frames, headers, inline messages).
    pub(super) fn progress_send(&self, st: &mut State) {
        if st.error.is_some() {
            return;
        }
        loop {
            // Frames go out first, and only between messages (`send_frames` writes while
            // `cursor == 0`); a frame half written holds the messages behind it.
            if !st.frames_out.is_empty() && !Self::send_frames(st) {
                return;
            }
            // Messages that queued up behind a full socket go out together.
            if st.cursor == 0 && st.fifo.len() > 1 {
                if !Self::send_batch(st) {
                    return;
                }
                continue;
            }
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
            let payload: &[u8] = if r.inline {
                // SAFETY: NCCL keeps the send buffer alive and unmodified until the request is
                // done.
                unsafe { r.buf.bytes() }
            } else {
                &[]
            };
            let total = MSG_HEADER_SIZE + payload.len();
            while *cursor < total {
                let written = if *cursor < MSG_HEADER_SIZE {
                    let iov = [IoSlice::new(&header[*cursor..]), IoSlice::new(payload)];
                    Self::control_write(control, error, &iov)
                } else {
                    let iov = [IoSlice::new(&payload[*cursor - MSG_HEADER_SIZE..])];
                    Self::control_write(control, error, &iov)
                };
                let Some(n) = written else { return };
                *cursor += n;
            }
            st.control_done(idx);
        }
    }

    /// Writes the control parts (header and inline payload) of up to [`SEND_BATCH`] queued
    /// messages, from the fifo's head (whose cursor is 0), with one `writev`. The messages
    /// written whole are done; the first one that is not becomes the head with its cursor where
    /// the write ended. Returns false when the stream would block or failed (`error` is set).
    pub(super) fn send_batch(st: &mut State) -> bool {
        let n = st.fifo.len().min(SEND_BATCH);
        let mut headers = [[0u8; MSG_HEADER_SIZE]; SEND_BATCH];
        let mut payloads: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
        for (k, &idx) in st.fifo.iter().take(n).enumerate() {
            let r = &st.reqs[idx as usize];
            headers[k] = (r.size as u64).to_le_bytes();
            if r.inline {
                // SAFETY: NCCL keeps the send buffer alive and unmodified until the request is
                // done, and it is not done before this write has taken its bytes.
                payloads[k] = unsafe { r.buf.bytes() };
            }
        }
        let mut iov = [IoSlice::new(&[]); 2 * SEND_BATCH];
        for k in 0..n {
            iov[2 * k] = IoSlice::new(&headers[k]);
            iov[2 * k + 1] = IoSlice::new(payloads[k]);
        }
        let Some(written) = Self::control_write(&mut st.control, &mut st.error, &iov[..2 * n])
        else {
            return false;
        };
        let mut left = written;
        let mut whole = 0;
        for p in &payloads[..n] {
            let total = MSG_HEADER_SIZE + p.len();
            if left < total {
                break;
            }
            left -= total;
            whole += 1;
        }
        if whole > 1 {
            st.batched_writes += 1;
        }
        for _ in 0..whole {
            let idx = st.fifo[0];
            st.control_done(idx);
        }
        st.cursor = left;
        true
    }
}

/// The stream with the fewest bytes queued; among equals the first from `start` on.
pub(super) fn least_queued(queued: &[Arc<AtomicU64>], start: usize) -> usize {
    let n = queued.len().max(1);
    (0..n)
        .map(|i| (start + i) % n)
        .min_by_key(|&k| queued.get(k).map_or(0, |q| q.load(Ordering::Acquire)))
        .unwrap_or(0)
}
