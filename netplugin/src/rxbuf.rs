//! The control stream's receive buffer.
//!
//! Everything on the control stream is small: 8-byte message headers, inline payloads (up to
//! `NCCL_BPF_INLINE_BYTES`) and the agreement's frames. Read straight into its destination, an
//! inline message costs two `recv`s, one for the header and one for the payload, although the
//! sender wrote both with one `writev` (a profile of the 8-byte ping-pong put about 1 µs of
//! its 1.7 µs gap to busy-polling TCP there, bench/results/perf-loopback-2026-12-01.md). This
//! buffer reads up to [`RX_CAP`] bytes at once and hands them out in order, so one `recv`
//! brings a header with its payload, and often the next message's too.
//!
//! Bytes read ahead stay here, never in a user's buffer: a message shorter than the receive
//! NCCL posted for it cannot pull the next header into that buffer. A destination of at least
//! [`DIRECT_MIN`] bytes, with nothing staged, is read into directly (one copy, as before).

use crate::error::{NetError, NetResult};
use std::io::{self, Read};

/// Bytes read at once into the buffer.
pub const RX_CAP: usize = 16 * 1024;
/// A destination at least this large is read into directly when nothing is staged.
pub const DIRECT_MIN: usize = 4096;

/// Bytes read from a stream and not yet handed out (allocated at the first read).
#[derive(Default)]
pub struct RxBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RxBuf {
    /// Bytes staged, not yet handed out.
    pub fn staged(&self) -> usize {
        self.end - self.start
    }

    /// Fills `dst` with what is staged, else with one non-blocking read. `Ok(0)`: nothing now.
    /// The end of the stream is an error, reported once every staged byte is handed out.
    pub fn read(&mut self, s: &mut impl Read, dst: &mut [u8]) -> NetResult<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        if self.start == self.end {
            if dst.len() >= DIRECT_MIN {
                return read_some(s, dst);
            }
            if self.buf.is_empty() {
                self.buf = vec![0; RX_CAP];
            }
            let n = read_some(s, &mut self.buf)?;
            (self.start, self.end) = (0, n);
        }
        let n = dst.len().min(self.end - self.start);
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

/// Non-blocking read: `Ok(0)` means "nothing now"; end of stream is an error.
fn read_some(s: &mut impl Read, buf: &mut [u8]) -> NetResult<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A stream that yields its bytes in the given pieces (one per read), `WouldBlock` between
    /// bursts (an empty piece), then end of stream; it counts its reads.
    struct Pieces {
        pieces: VecDeque<Vec<u8>>,
        reads: usize,
    }

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            let Some(mut p) = self.pieces.pop_front() else {
                return Ok(0);
            };
            if p.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = p.len().min(buf.len());
            buf[..n].copy_from_slice(&p[..n]);
            if n < p.len() {
                self.pieces.push_front(p.split_off(n));
            }
            Ok(n)
        }
    }

    fn pieces(p: &[&[u8]]) -> Pieces {
        Pieces {
            pieces: p.iter().map(|x| x.to_vec()).collect(),
            reads: 0,
        }
    }

    #[test]
    fn one_read_brings_a_header_with_its_payload() {
        let mut msg = 5u64.to_le_bytes().to_vec();
        msg.extend_from_slice(b"hello");
        msg.extend_from_slice(&3u64.to_le_bytes());
        msg.extend_from_slice(b"abc");
        let mut s = pieces(&[&msg, b""]);
        let mut rx = RxBuf::default();
        let (mut h, mut p) = ([0u8; 8], [0u8; 64]);
        assert_eq!(rx.read(&mut s, &mut h).unwrap(), 8);
        assert_eq!(u64::from_le_bytes(h), 5);
        // A receive posted larger than the message: only the message's bytes land in it.
        assert_eq!(rx.read(&mut s, &mut p[..5]).unwrap(), 5);
        assert_eq!(&p[..5], b"hello");
        assert_eq!(p[5..], [0u8; 59][..], "nothing beyond the message");
        assert_eq!(rx.read(&mut s, &mut h).unwrap(), 8);
        assert_eq!(rx.read(&mut s, &mut p[..3]).unwrap(), 3);
        assert_eq!(&p[..3], b"abc");
        assert_eq!(s.reads, 1, "four pieces from one read");
        assert_eq!(rx.read(&mut s, &mut h).unwrap(), 0, "nothing now");
    }

    #[test]
    fn a_header_split_across_reads_is_put_together() {
        let h = 7u64.to_le_bytes();
        let mut s = pieces(&[&h[..3], b"", &h[3..]]);
        let mut rx = RxBuf::default();
        let mut got = [0u8; 8];
        let mut at = 0;
        for _ in 0..4 {
            at += rx.read(&mut s, &mut got[at..]).unwrap();
        }
        assert_eq!((at, u64::from_le_bytes(got)), (8, 7));
    }

    #[test]
    fn the_end_of_the_stream_comes_after_every_staged_byte() {
        let mut s = pieces(&[b"0123456789"]);
        let mut rx = RxBuf::default();
        let mut b = [0u8; 4];
        assert_eq!(rx.read(&mut s, &mut b).unwrap(), 4);
        assert_eq!(rx.read(&mut s, &mut b).unwrap(), 4);
        assert_eq!(rx.read(&mut s, &mut b).unwrap(), 2);
        assert_eq!(&b[..2], b"89");
        assert!(matches!(
            rx.read(&mut s, &mut b),
            Err(NetError::PeerClosed { .. })
        ));
    }

    #[test]
    fn large_destinations_are_read_into_directly_once_nothing_is_staged() {
        let big = vec![7u8; 3 * DIRECT_MIN];
        let mut s = pieces(&[&[1, 2], &big]);
        let mut rx = RxBuf::default();
        let mut dst = vec![0u8; 2 + big.len()];
        // Nothing staged and a large destination: read straight into it, piece by piece.
        assert_eq!(rx.read(&mut s, &mut dst).unwrap(), 2);
        let n = rx.read(&mut s, &mut dst[2..]).unwrap();
        assert_eq!(n, big.len());
        assert_eq!(rx.staged(), 0);
        assert_eq!(dst[..2], [1, 2]);
        assert!(dst[2..].iter().all(|&b| b == 7));
    }
}
