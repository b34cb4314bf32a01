//! The receive side of a comm: headers read from the control stream in posting order, inline
//! messages copied out of it by NCCL's proxy thread, frames taken between messages; a chunked
//! message done once the engine's readers have landed all its bytes.

use super::*;

impl Comm {
    /// Whether every byte of chunked receive `idx` (message `seq`, of `size` bytes) has landed
    /// and no reader holds its buffer any more. Sets the comm's error where it cannot come right:
    /// every data stream has read past the message (or ended) with bytes still missing, or its
    /// chunks gave another size than its header.
    pub(super) fn received_all(&self, st: &mut State, idx: usize, size: usize, seq: u64) -> bool {
        let slot = &self.slots[idx];
        let fail = |st: &mut State, e: NetError| {
            st.error.get_or_insert(e);
            false
        };
        if let Some(said) = st.posts.chunk_size_of(idx as u32)
            && said != size as u64
        {
            return fail(
                st,
                NetError::Broken {
                    msg: format!(
                        "the peer broke the chunk protocol: chunks of a {said}-byte message for \
                         a {size}-byte one"
                    ),
                    code: NcclResult::REMOTE_ERROR,
                },
            );
        }
        // The frontiers before the count: a stream moves past a message only after that
        // message's bytes on it are counted.
        let passed = st.posts.passed(seq);
        let got = slot.received.load(Ordering::SeqCst);
        if got < size as u64 {
            if passed {
                return fail(
                    st,
                    NetError::PeerClosed {
                        op: "receive on data streams",
                        detail: format!(
                            "{got} of a {size}-byte message came before every data stream \
                             ended or moved past it"
                        ),
                    },
                );
            }
            return false;
        }
        // Only distinct chunks of the plan land, so the count cannot pass the size (checked all
        // the same); after the retirement (no claim left) it is final.
        if !st.posts.retire(idx as u32, slot) {
            return false;
        }
        let got = slot.received.load(Ordering::SeqCst);
        if got != size as u64 {
            return fail(
                st,
                NetError::Broken {
                    msg: format!(
                        "the peer broke the chunk protocol: {got} bytes of chunks for a \
                         {size}-byte message"
                    ),
                    code: NcclResult::REMOTE_ERROR,
                },
            );
        }
        true
    }

    /// Reads the control frames that arrived while no receive is posted, up to the next
    /// message's header (which waits, read, for the receive NCCL posts for it).
    pub(super) fn idle_frames(st: &mut State) {
        if st.closed {
            return;
        }
        loop {
            while st.cursor < MSG_HEADER_SIZE {
                let at = st.cursor;
                match st.rx.read(&mut st.control, &mut st.header[at..]) {
                    Ok(0) => return,
                    Ok(n) => st.cursor += n,
                    // A clean end between messages: the peer is done sending.
                    Err(NetError::PeerClosed { .. }) if at == 0 => {
                        st.closed = true;
                        return;
                    }
                    Err(e) => {
                        st.error = Some(e);
                        return;
                    }
                }
            }
            match wire::frame_len(u64::from_le_bytes(st.header)) {
                None => return,
                Some(Ok(len)) => {
                    if !Self::receive_frame(st, len) {
                        return;
                    }
                }
                Some(Err(e)) => {
                    st.error = Some(NetError::Broken {
                        msg: format!("the peer broke the framing: {e}"),
                        code: NcclResult::REMOTE_ERROR,
                    });
                    return;
                }
            }
        }
    }

    /// Reads what the control stream has now (frames, headers, inline messages).
    pub(super) fn progress_recv(&self, st: &mut State) {
        if st.error.is_some() {
            return;
        }
        loop {
            if st.fifo.is_empty() {
                Self::idle_frames(st);
                return;
            }
            if st.closed && !st.reqs[st.fifo[0] as usize].header_done && st.cursor == 0 {
                // A receive that needs a message the peer will never send.
                st.error = Some(NetError::PeerClosed {
                    op: "receive on control stream",
                    detail: "end of stream".into(),
                });
                return;
            }
            let State {
                control,
                rx,
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
                match rx.read(control, &mut header[*cursor..]) {
                    Ok(0) => return,
                    Ok(n) => *cursor += n,
                    Err(e) => {
                        *error = Some(e);
                        return;
                    }
                }
            }
            if !r.header_done
                && let Some(len) = wire::frame_len(u64::from_le_bytes(*header))
            {
                match len {
                    Ok(len) => {
                        if !Self::receive_frame(st, len) {
                            return;
                        }
                        continue;
                    }
                    Err(e) => {
                        st.error = Some(NetError::Broken {
                            msg: format!("the peer broke the framing: {e}"),
                            code: NcclResult::REMOTE_ERROR,
                        });
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
                    // Its chunks are the data streams' readers' (started with the first such
                    // message; a refused thread fails the comm, and `test` releases the request
                    // like any other failed one).
                    if self.ensure_workers(st).is_err() {
                        return;
                    }
                    st.control_done(idx);
                    continue;
                }
                // An inline message: no chunk may name it (no reader holds it from here on, and
                // none has put a byte in it).
                let slot = &self.slots[idx as usize];
                if !st.posts.retire(idx, slot) || slot.received.load(Ordering::SeqCst) > 0 {
                    st.error = Some(NetError::Broken {
                        msg: format!(
                            "the peer broke the chunk protocol: chunks for an inline message of {} \
                             bytes",
                            st.reqs[idx as usize].size
                        ),
                        code: NcclResult::REMOTE_ERROR,
                    });
                    return;
                }
            }
            let State {
                control,
                rx,
                reqs,
                cursor,
                error,
                ..
            } = &mut *st;
            let r = &mut reqs[idx as usize];
            // SAFETY: NCCL lent this receive buffer to us until the request completes; only
            // this thread (holding the comm lock) touches its inline part.
            let dst = unsafe { r.buf.sub(0, r.size).bytes_mut() };
            while *cursor - MSG_HEADER_SIZE < r.size {
                match rx.read(control, &mut dst[*cursor - MSG_HEADER_SIZE..]) {
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
}
