//! Control frames of one comm: the plugin's own bytes between messages on the control stream (the
//! agreement's records; `crate::frames` carries them over the process's comms), queued within
//! bounds, written only between messages, and read into a bounded inbox.

use super::*;

impl Comm {
    /// Queues a control frame for the peer (a send comm only) and writes what it can now; the
    /// rest goes out as the comm progresses, always between messages.
    pub fn send_frame(&self, payload: &[u8]) -> NetResult<()> {
        if self.direction != ConnDirection::Send {
            return Err(NetError::Misuse("control frames go from send comms".into()));
        }
        if payload.len() > wire::MAX_FRAME {
            return Err(NetError::Misuse(format!(
                "control frame of {} bytes, over the {}-byte limit",
                payload.len(),
                wire::MAX_FRAME
            )));
        }
        let mut st = lock(&self.state);
        if let Some(e) = st.report() {
            return Err(e);
        }
        let mut f = wire::frame_header(payload.len()).to_vec();
        f.extend_from_slice(payload);
        // The frame being written (if one is) stays: dropping it would break the stream.
        let started = usize::from(st.frame_cursor > 0);
        while st.frames_out_bytes + f.len() > MAX_OUTBOX_BYTES && st.frames_out.len() > started {
            let Some(old) = st.frames_out.remove(started) else {
                break;
            };
            st.frames_out_bytes -= old.len();
            st.frames_out_dropped += 1;
        }
        st.frames_out_bytes += f.len();
        st.frames_out.push_back(f);
        self.progress_send(&mut st);
        Ok(())
    }

    /// Frames dropped because the peer did not take them, since the comm opened.
    pub fn frames_out_dropped(&self) -> u64 {
        lock(&self.state).frames_out_dropped
    }

    /// Writes the control frames still queued, where the stream is between messages.
    pub fn flush_frames(&self) {
        let mut st = lock(&self.state);
        if self.direction == ConnDirection::Send && !st.frames_out.is_empty() {
            self.progress_send(&mut st);
        }
    }

    /// The control frames received so far (and the count dropped for want of room), oldest
    /// first; progresses a receive comm first.
    pub fn take_frames(&self) -> (Vec<Vec<u8>>, u64) {
        let mut st = lock(&self.state);
        if self.direction == ConnDirection::Recv {
            self.progress_recv(&mut st);
        }
        let dropped = std::mem::take(&mut st.frames_dropped);
        st.inbox_bytes = 0;
        (st.inbox.drain(..).collect(), dropped)
    }

    /// Writes queued frames while no message is half written; `false` if one is still pending
    /// (the socket is full) or the comm failed.
    pub(super) fn send_frames(st: &mut State) -> bool {
        while st.cursor == 0 {
            let State {
                control,
                frames_out,
                frame_cursor,
                frames_out_bytes,
                error,
                ..
            } = &mut *st;
            let Some(f) = frames_out.front() else {
                return true;
            };
            let Some(n) = Self::control_write(control, error, &[IoSlice::new(&f[*frame_cursor..])])
            else {
                return false;
            };
            *frame_cursor += n;
            if *frame_cursor == f.len() {
                let len = f.len();
                frames_out.pop_front();
                *frame_cursor = 0;
                *frames_out_bytes -= len;
            }
        }
        true
    }

    /// Reads the `len` bytes of the control frame whose header was just read; `true` once it
    /// is in the inbox (the header is then consumed), `false` if more must come first or the
    /// comm failed.
    pub(super) fn receive_frame(st: &mut State, len: usize) -> bool {
        let (_, buf) = st
            .frame_in
            .get_or_insert_with(|| (len, Vec::with_capacity(len)));
        while buf.len() < len {
            let mut chunk = [0u8; 4096];
            let want = (len - buf.len()).min(chunk.len());
            match st.rx.read(&mut st.control, &mut chunk[..want]) {
                Ok(0) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) => {
                    st.error = Some(e);
                    return false;
                }
            }
        }
        let (_, frame) = st.frame_in.take().expect("set above");
        while st.inbox.len() >= MAX_INBOX || st.inbox_bytes + frame.len() > MAX_INBOX_BYTES {
            let Some(old) = st.inbox.pop_front() else {
                break;
            };
            st.inbox_bytes -= old.len();
            st.frames_dropped += 1;
        }
        st.inbox_bytes += frame.len();
        st.inbox.push_back(frame);
        st.cursor = 0;
        ncclbpf_agreement::nudge();
        true
    }
}
