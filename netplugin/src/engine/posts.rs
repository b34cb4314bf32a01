//! The receive side of the data streams: posted receives as the engine sees them, and each
//! stream's reader, which matches every chunk header to its posted receive itself.
//!
//! A chunk on a data stream is a [`ChunkHeader`] (message number, size, offset, length) and its
//! bytes.
//! The comm posts each receive in [`Posts`] under the message number it will match (messages
//! match in posting order, so the n-th receive posted takes message n). A stream's server reads
//! a header, claims the receive it names and reads the bytes straight into that buffer, then the
//! next header (in the same call when it can: the tail of one chunk and the next header are one
//! vectored read). No thread hand-off lies between a chunk's arrival and its copy: the proxy
//! thread only reads the control stream's message header (its size) and sees the request done
//! once every byte has landed ([`ReqSlot::received`]).
//!
//! A header for a message whose receive is not posted yet stops the stream where it is (the
//! rest stays in the kernel's buffer, TCP holds the sender back) until the comm posts that
//! receive and pokes the stream's server. A header that is not one of the chunks the sender's
//! plan makes for its message ([`ChunkHeader::off_plan`]), names a receive already retired,
//! goes back in message order, repeats a chunk, or disagrees with the message's other chunks on
//! its size breaks the protocol: the stream fails, and the comm with it, before a byte of that
//! chunk is written. A message larger than its receive fails as truncated. So every chunk that
//! lands is a distinct chunk of the plan, inside the message: once the byte count reaches the
//! size, the whole message is there.
//!
//! Each stream's *frontier* is the last message number it read a header of (`u64::MAX` once it
//! ended or failed). Streams never go back, so a message that every frontier has passed gets no
//! more bytes: the comm fails a receive that is still short then (a dead peer, or one that left
//! a chunk out), rather than wait for ever.
//!
//! Claims and retirements meet in two counters of the request slot: the reader raises
//! [`ReqSlot::busy`] and then checks the post is still there; the comm retires a post and then
//! checks `busy`. Both sequentially consistent, so either the reader backs off or the comm sees
//! it at work and does not hand the buffer back to NCCL yet. A reader counts a chunk's bytes
//! ([`ReqSlot::received`]) before it drops its claim, so once a retired post has no claim, the
//! count is final.

use super::StreamCtx;
use crate::buf::Buf;
use crate::comm::ReqSlot;
use crate::error::NetError;
use crate::wire::{CHUNK_HEADER_SIZE, ChunkHeader, MAX_CHUNKS, Shape};
use ncclnet_headers::NcclResult;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// One request slot's posted receive.
struct Post {
    /// Message number + 1 while posted, 0 when not.
    seq1: AtomicU64,
    ptr: AtomicPtr<u8>,
    len: AtomicUsize,
    /// The message size its chunks gave + 1 (0: no chunk yet).
    size1: AtomicU64,
    /// Which of the message's chunks were claimed (bit i: the chunk at i × chunk size).
    chunks: [AtomicU64; MAX_CHUNKS / 64],
}

/// A receive comm's posted receives, shared with the servers of its data streams.
pub struct Posts {
    shape: Shape,
    /// Indexed by request slot.
    posts: Box<[Post]>,
    /// Receives posted so far: the next one takes this message number.
    posted: AtomicU64,
    /// Streams (bit k) stopped at a header whose receive is not posted yet.
    waiting: AtomicU32,
    /// Per data stream: the last message number it read a header of; `u64::MAX` once it ended
    /// or failed.
    frontier: Box<[AtomicU64]>,
}

/// What a header's message number finds in [`Posts`].
#[derive(Debug)]
pub enum Claim {
    /// Claimed: request slot `idx`, its posted buffer (`busy` raised).
    Found { idx: u32, buf: Buf },
    /// Not posted yet.
    NotYet,
    /// Posted and retired already.
    Gone,
}

impl Posts {
    pub fn new(slots: usize, shape: Shape) -> Posts {
        Posts {
            shape,
            posts: (0..slots)
                .map(|_| Post {
                    seq1: AtomicU64::new(0),
                    ptr: AtomicPtr::new(std::ptr::null_mut()),
                    len: AtomicUsize::new(0),
                    size1: AtomicU64::new(0),
                    chunks: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect(),
            posted: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            frontier: (0..shape.nstreams).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether every data stream has read past message `seq` (or ended): no byte of it can
    /// come any more. Read before the receive's byte count, which is then final.
    pub fn passed(&self, seq: u64) -> bool {
        !self.frontier.is_empty() && self.frontier.iter().all(|f| f.load(SeqCst) > seq)
    }

    /// The message size the chunks of request slot `idx`'s receive gave, if any came.
    pub fn chunk_size_of(&self, idx: u32) -> Option<u64> {
        self.posts[idx as usize].size1.load(SeqCst).checked_sub(1)
    }

    fn set_frontier(&self, k: usize, seq: u64) {
        if let Some(f) = self.frontier.get(k) {
            f.store(seq, SeqCst);
        }
    }

    /// Posts `buf` as request slot `idx`'s receive, for the next message; returns that
    /// message's number and the streams (bits) that were waiting for a post, to be poked. One
    /// poster at a time (the comm lock).
    pub fn post(&self, idx: u32, buf: Buf) -> (u64, u32) {
        let seq = self.posted.load(Relaxed);
        let p = &self.posts[idx as usize];
        let ptr = if buf.is_empty() {
            std::ptr::null_mut()
        } else {
            // SAFETY: only the address is taken here; the bytes are written by a reader that
            // claimed this post, within `len`.
            unsafe { buf.bytes_mut().as_mut_ptr() }
        };
        p.ptr.store(ptr, Relaxed);
        p.len.store(buf.len(), Relaxed);
        p.size1.store(0, Relaxed);
        for w in &p.chunks {
            w.store(0, Relaxed);
        }
        p.seq1.store(seq + 1, SeqCst);
        self.posted.store(seq + 1, SeqCst);
        (seq, self.waiting.swap(0, SeqCst))
    }

    /// Takes request slot `idx`'s post away, so that no reader claims it from now on; whether
    /// no reader holds it either (its buffer may go back to NCCL).
    pub fn retire(&self, idx: u32, slot: &ReqSlot) -> bool {
        self.posts[idx as usize].seq1.store(0, SeqCst);
        slot.busy.load(SeqCst) == 0
    }

    /// Finds and claims the receive of message `seq`.
    fn claim(&self, seq: u64, slots: &[ReqSlot]) -> Claim {
        // `posted` first: a post it counts was published before it (see `post`).
        if seq >= self.posted.load(SeqCst) {
            return Claim::NotYet;
        }
        for (idx, p) in self.posts.iter().enumerate() {
            if p.seq1.load(Acquire) != seq + 1 {
                continue;
            }
            let slot = &slots[idx];
            slot.busy.fetch_add(1, SeqCst);
            if p.seq1.load(SeqCst) != seq + 1 {
                // Retired in between.
                slot.busy.fetch_sub(1, SeqCst);
                return Claim::Gone;
            }
            let (ptr, len) = (p.ptr.load(Relaxed), p.len.load(Relaxed));
            // SAFETY: NCCL lent `ptr` for `len` bytes until the request completes, which it
            // cannot while `busy` is raised (see `retire`).
            let buf = unsafe { Buf::new(ptr, len) };
            return Claim::Found {
                idx: idx as u32,
                buf,
            };
        }
        Claim::Gone
    }

    /// Stream `bit` stops for message `seq`, which is not posted: `true` if it may stop (a
    /// later post pokes it), `false` if the post came meanwhile (claim again).
    fn wait_for(&self, seq: u64, bit: u32) -> bool {
        self.waiting.fetch_or(bit, SeqCst);
        if seq < self.posted.load(SeqCst) {
            self.waiting.fetch_and(!bit, SeqCst);
            return false;
        }
        true
    }
}

/// The chunk a reader is reading into.
struct Cur {
    idx: u32,
    dst: Buf,
    done: usize,
}

/// Up to two pieces of memory for one vectored `send`/`recv`.
#[derive(Clone, Copy, Debug)]
pub struct Iov {
    pub parts: [(*mut u8, usize); 2],
    pub n: usize,
}

impl Iov {
    pub fn one(p: *mut u8, len: usize) -> Iov {
        Iov {
            parts: [(p, len), (std::ptr::null_mut(), 0)],
            n: 1,
        }
    }

    pub fn two(a: (*mut u8, usize), b: (*mut u8, usize)) -> Iov {
        Iov {
            parts: [a, b],
            n: 2,
        }
    }

    /// The pieces as `iovec`s for `sendmsg`/`recvmsg` and io_uring, cut to `max` bytes in all,
    /// and how many lead with bytes in them (0: nothing to move).
    pub fn iovecs(&self, max: usize) -> ([libc::iovec; 2], usize) {
        let mut left = max;
        let mut n = 0;
        let v = self.parts.map(|(p, len)| {
            let len = len.min(left);
            left -= len;
            libc::iovec {
                iov_base: p.cast(),
                iov_len: len,
            }
        });
        for part in v.iter().take(self.n) {
            if part.iov_len == 0 {
                break;
            }
            n += 1;
        }
        (v, n)
    }
}

/// Reads one receive stream's chunks: header, claim, bytes, again.
pub struct Reader {
    index: usize,
    bit: u32,
    /// Boxed: io_uring writes into it while the reader may move.
    hdr: Box<[u8; CHUNK_HEADER_SIZE]>,
    hdr_got: usize,
    cur: Option<Cur>,
    /// The last message number this stream carried (they never go back on one stream).
    last_seq: Option<u64>,
    /// Stopped for a receive not yet posted.
    pub waiting: bool,
    /// The peer closed the stream between chunks, or it failed.
    pub ended: bool,
}

fn protocol(ctx: &StreamCtx, what: String) -> NetError {
    NetError::Broken {
        msg: format!(
            "the peer broke the chunk protocol on data stream {} of connection {:#018x}: {what}",
            ctx.index, ctx.conn_id
        ),
        code: NcclResult::REMOTE_ERROR,
    }
}

impl Reader {
    pub fn new(index: usize) -> Reader {
        Reader {
            index,
            bit: 1 << index,
            hdr: Box::new([0; CHUNK_HEADER_SIZE]),
            hdr_got: 0,
            cur: None,
            last_seq: None,
            waiting: false,
            ended: false,
        }
    }

    /// Whether the reader holds a claimed receive (the next bytes go into its buffer).
    pub fn in_chunk(&self) -> bool {
        self.cur.is_some()
    }

    /// The stream reached its end: `true` if between chunks (the peer closed its comm; the
    /// stream stops, counted in [`Posts::ended`]), `false` inside one (an error).
    pub fn end(&mut self, ctx: &StreamCtx) -> bool {
        if self.cur.is_some() || self.hdr_got > 0 {
            return false;
        }
        self.stop(ctx);
        true
    }

    /// Reads no more: the stream's frontier goes past every message.
    fn stop(&mut self, ctx: &StreamCtx) {
        self.ended = true;
        self.waiting = false;
        if let Some(p) = &ctx.posts {
            p.set_frontier(self.index, u64::MAX);
        }
    }

    /// Where the next bytes of the stream go; `Ok(None)` while the next chunk's receive is not
    /// posted (the stream then waits for a poke); `Err` when the peer broke the protocol.
    pub fn next(&mut self, ctx: &StreamCtx) -> Result<Option<Iov>, NetError> {
        if self.ended {
            return Ok(None);
        }
        loop {
            if let Some(c) = &self.cur {
                // SAFETY: `done < len` (a finished chunk is dropped at once); the claimed
                // buffer is this reader's until it drops the claim.
                let p = unsafe { c.dst.bytes_mut().as_mut_ptr().add(c.done) };
                let hdr = self.hdr.as_mut_ptr();
                return Ok(Some(Iov::two(
                    (p, c.dst.len() - c.done),
                    (hdr, CHUNK_HEADER_SIZE),
                )));
            }
            if self.hdr_got < CHUNK_HEADER_SIZE {
                // SAFETY: inside the boxed header.
                let p = unsafe { self.hdr.as_mut_ptr().add(self.hdr_got) };
                return Ok(Some(Iov::one(p, CHUNK_HEADER_SIZE - self.hdr_got)));
            }
            let Some(h) = ChunkHeader::decode(&self.hdr) else {
                return Err(protocol(ctx, "a header with its reserved word set".into()));
            };
            let posts = ctx.posts.as_ref().expect("a receive stream has posts");
            if let Some(why) = h.off_plan(&posts.shape) {
                return Err(protocol(ctx, format!("{why} (message {})", h.seq)));
            }
            if self.last_seq.is_some_and(|l| h.seq < l) {
                return Err(protocol(
                    ctx,
                    format!(
                        "message {} after message {} on one stream",
                        h.seq,
                        self.last_seq.unwrap_or(0)
                    ),
                ));
            }
            // Everything before `h.seq` on this stream has landed (and been counted).
            self.last_seq = Some(h.seq);
            posts.set_frontier(self.index, h.seq);
            match posts.claim(h.seq, &ctx.slots) {
                Claim::Found { idx, buf } => {
                    let (off, len) = (h.offset as usize, h.len as usize);
                    let p = &posts.posts[idx as usize];
                    let size = u64::from(h.size);
                    let agreed = match p.size1.compare_exchange(0, size + 1, SeqCst, SeqCst) {
                        Ok(_) => true,
                        Err(prev) => prev == size + 1,
                    };
                    let c = crate::wire::chunk_size(&posts.shape, h.size as usize);
                    // Below MAX_CHUNKS for every size `off_plan` lets through.
                    let bit = off / c;
                    let fits = h.size as usize <= buf.len() && bit < MAX_CHUNKS;
                    let first = fits
                        && agreed
                        && p.chunks[bit / 64].fetch_or(1 << (bit % 64), SeqCst) & (1 << (bit % 64))
                            == 0;
                    let why = if !fits {
                        Some(NetError::Truncated {
                            incoming: size,
                            posted: buf.len(),
                        })
                    } else if !agreed {
                        Some(protocol(
                            ctx,
                            format!(
                                "a chunk of message {} says {size} bytes, its others {}",
                                h.seq,
                                p.size1.load(SeqCst).saturating_sub(1)
                            ),
                        ))
                    } else if !first {
                        Some(protocol(
                            ctx,
                            format!("bytes {off}..{} of message {} twice", off + len, h.seq),
                        ))
                    } else {
                        None
                    };
                    if let Some(e) = why {
                        ctx.slots[idx as usize].busy.fetch_sub(1, SeqCst);
                        return Err(e);
                    }
                    self.waiting = false;
                    self.hdr_got = 0;
                    self.cur = Some(Cur {
                        idx,
                        dst: buf.sub(off, len),
                        done: 0,
                    });
                }
                Claim::NotYet => {
                    if posts.wait_for(h.seq, self.bit) {
                        self.waiting = true;
                        return Ok(None);
                    }
                }
                Claim::Gone => {
                    return Err(protocol(
                        ctx,
                        format!("a chunk of message {}, whose receive is over", h.seq),
                    ));
                }
            }
        }
    }

    /// `n` bytes were read into what [`Self::next`] gave.
    pub fn advance(&mut self, ctx: &StreamCtx, mut n: usize) {
        if let Some(c) = &mut self.cur {
            let take = n.min(c.dst.len() - c.done);
            c.done += take;
            n -= take;
            if c.done == c.dst.len() {
                let (idx, len) = (c.idx, c.dst.len());
                self.cur = None;
                let slot = &ctx.slots[idx as usize];
                // Counted first, then let go: whoever finds no claim after retiring the post
                // (`Posts::retire`) sees every byte the claims put in.
                slot.received.fetch_add(len as u64, SeqCst);
                slot.busy.fetch_sub(1, SeqCst);
                if let Some(p) = &ctx.progress {
                    p.stamp();
                }
            }
        }
        self.hdr_got += n;
        debug_assert!(self.hdr_got <= CHUNK_HEADER_SIZE);
    }

    /// The stream failed (or is let go): the chunk being read fails its request, the claim is
    /// dropped, and the stream reads no more.
    pub fn fail(&mut self, ctx: &StreamCtx) {
        if let Some(c) = self.cur.take() {
            let slot = &ctx.slots[c.idx as usize];
            slot.failed.store(true, Release);
            slot.busy.fetch_sub(1, SeqCst);
        }
        self.stop(ctx);
    }
}
