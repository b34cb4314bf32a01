//! What travels between the two ends: the 128-byte handle NCCL ships out of band, the hello
//! each TCP stream opens with, the per-message header on the control stream and the per-chunk
//! header on the data streams.
//!
//! Handle layout (little endian):
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `HANDLE_MAGIC` |
//! | 8 | 8 | listener id (random per listen; streams name it in their hello) |
//! | 16 | 1 | address family: 4 or 6 |
//! | 18 | 2 | port |
//! | 20 | 16 | IP address (IPv4 in the first 4 bytes) |
//! | 36 | 4 | data streams per connection |
//! | 40 | 4 | inline limit in bytes |
//! | 44 | 4 | minimum chunk in bytes |
//! | 48 | 8 | connect-progress key, written by `connect` (NCCL reuses the buffer on retries) |
//! | 56 | 32 | listener secret (random per listen; never sent on a stream, see [`handshake`]) |
//!
//! The last 40 bytes stay free: as another copy's inner plugin ([`crate::inner`]), this
//! transport leaves the wrapper room for its side channel's trailer over IPv4.
//!
//! [`handshake`]: crate::handshake

use crate::error::{NetError, NetResult};
use crate::handshake::{CHALLENGE_SIZE, SECRET_SIZE, Secret};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub const HANDLE_SIZE: usize = ncclnet_headers::net::NET_HANDLE_MAXSIZE;
pub const HANDLE_MAGIC: u64 = 0x3446_5042_4c43_434e; // "NCCLBPF4"
/// The handle of ncclbpf before admission by secret (no secret in it).
const HANDLE_MAGIC_V1: u64 = 0x3146_5042_4c43_434e; // "NCCLBPF1"
/// The handle of ncclbpf before chunk headers (chunks placed by a rotation both ends ran).
const HANDLE_MAGIC_V2: u64 = 0x3246_5042_4c43_434e; // "NCCLBPF2"
/// The handle of ncclbpf with the secret at offset 72 (no room for a side channel's trailer).
const HANDLE_MAGIC_V3: u64 = 0x3346_5042_4c43_434e; // "NCCLBPF3"
pub const HELLO_MAGIC: u64 = 0x324f_4c45_4846_5042; // "BPFHELO2"
pub const HELLO_SIZE: usize = 48;
const KEY_OFFSET: usize = 48;
const SECRET_OFFSET: usize = 56;

/// How a connection carries messages; chosen by the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub nstreams: u32,
    pub inline_bytes: u32,
    pub min_chunk: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handle {
    /// The listener's id, public: a hello names it, so that a stream meant for another
    /// listener (an earlier job's, say) is told apart from one that fails its proof.
    pub nonce: u64,
    pub addr: SocketAddr,
    pub shape: Shape,
    pub secret: Secret,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

impl Handle {
    pub fn encode(&self, out: &mut [u8; HANDLE_SIZE]) {
        out.fill(0);
        out[0..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(v4) => {
                out[16] = 4;
                out[20..24].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out[16] = 6;
                out[20..36].copy_from_slice(&v6.octets());
            }
        }
        out[18..20].copy_from_slice(&self.addr.port().to_le_bytes());
        out[36..40].copy_from_slice(&self.shape.nstreams.to_le_bytes());
        out[40..44].copy_from_slice(&self.shape.inline_bytes.to_le_bytes());
        out[44..48].copy_from_slice(&self.shape.min_chunk.to_le_bytes());
        out[SECRET_OFFSET..SECRET_OFFSET + SECRET_SIZE].copy_from_slice(&self.secret.0);
    }

    pub fn decode(b: &[u8; HANDLE_SIZE]) -> NetResult<Handle> {
        for (old, what) in [
            (HANDLE_MAGIC_V1, "handle format 1, no admission secret"),
            (HANDLE_MAGIC_V2, "handle format 2, chunks without headers"),
            (HANDLE_MAGIC_V3, "handle format 3"),
        ] {
            if u64_at(b, 0) == old {
                return Err(NetError::BadHandle(format!(
                    "the peer runs an older ncclbpf ({what}): every rank must load the same plugin version"
                )));
            }
        }
        if u64_at(b, 0) != HANDLE_MAGIC {
            return Err(NetError::BadHandle(format!(
                "magic {:#018x} is not ncclbpf's (is NCCL_NET set to another plugin on the peer?)",
                u64_at(b, 0)
            )));
        }
        let port = u16::from_le_bytes([b[18], b[19]]);
        let ip = match b[16] {
            4 => IpAddr::V4(Ipv4Addr::new(b[20], b[21], b[22], b[23])),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[20..36]).expect("16 bytes"),
            )),
            f => {
                return Err(NetError::BadHandle(format!(
                    "unknown address family tag {f}"
                )));
            }
        };
        if port == 0 || ip.is_unspecified() {
            return Err(NetError::BadHandle(format!(
                "no listening address ({ip}:{port})"
            )));
        }
        let shape = Shape {
            nstreams: u32_at(b, 36),
            inline_bytes: u32_at(b, 40),
            min_chunk: u32_at(b, 44),
        };
        if shape.nstreams > crate::config::MAX_STREAMS || shape.min_chunk == 0 {
            return Err(NetError::BadHandle(format!(
                "impossible transport shape {shape:?}"
            )));
        }
        let secret = Secret(
            b[SECRET_OFFSET..SECRET_OFFSET + SECRET_SIZE]
                .try_into()
                .expect("32 bytes"),
        );
        if secret.0 == [0; SECRET_SIZE] {
            return Err(NetError::BadHandle("no admission secret".into()));
        }
        Ok(Handle {
            nonce: u64_at(b, 8),
            addr: SocketAddr::new(ip, port),
            shape,
            secret,
        })
    }

    pub fn connect_key(b: &[u8; HANDLE_SIZE]) -> u64 {
        u64_at(b, KEY_OFFSET)
    }

    pub fn set_connect_key(b: &mut [u8; HANDLE_SIZE], key: u64) {
        b[KEY_OFFSET..KEY_OFFSET + 8].copy_from_slice(&key.to_le_bytes());
    }
}

/// First bytes on every TCP stream of a connection: which listener it is for, which
/// connection it belongs to, its index (`0..nstreams` data, `nstreams` control) and the
/// connector's challenge for the acceptor (see [`crate::handshake`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub nonce: u64,
    pub conn_id: u64,
    pub index: u32,
    pub nstreams: u32,
    pub challenge: [u8; CHALLENGE_SIZE],
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_SIZE] {
        let mut b = [0u8; HELLO_SIZE];
        b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..24].copy_from_slice(&self.conn_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.index.to_le_bytes());
        b[28..32].copy_from_slice(&self.nstreams.to_le_bytes());
        b[32..48].copy_from_slice(&self.challenge);
        b
    }

    /// `None` for a stream that is not ours (wrong magic, impossible index).
    pub fn decode(b: &[u8; HELLO_SIZE]) -> Option<Hello> {
        let h = Hello {
            nonce: u64_at(b, 8),
            conn_id: u64_at(b, 16),
            index: u32_at(b, 24),
            nstreams: u32_at(b, 28),
            challenge: b[32..48].try_into().expect("16 bytes"),
        };
        (u64_at(b, 0) == HELLO_MAGIC
            && h.nstreams <= crate::config::MAX_STREAMS
            && h.index <= h.nstreams)
            .then_some(h)
    }
}

/// Control-stream header before each message: its size in bytes.
pub const MSG_HEADER_SIZE: usize = 8;

/// A header with this bit set starts a *control frame* instead of a message: the plugin's own
/// bytes (the rank agreement's records), its length in the low 32 bits, the frame right after
/// the header on the control stream. Frames never sit inside a message, never consume a posted
/// receive and are invisible to NCCL. A message is never this large (NCCL's sizes are below
/// 2^31, `maxP2pBytes`).
pub const FRAME_FLAG: u64 = 1 << 63;

/// The largest control frame.
pub const MAX_FRAME: usize = 64 * 1024;

/// The header of a control frame of `len` bytes (at most [`MAX_FRAME`]).
pub fn frame_header(len: usize) -> [u8; MSG_HEADER_SIZE] {
    (FRAME_FLAG | len as u64).to_le_bytes()
}

/// The length of the control frame a header starts: `None` for a message header, `Err` for a
/// frame header that no sender of ours writes.
pub fn frame_len(header: u64) -> Option<Result<usize, String>> {
    if header & FRAME_FLAG == 0 {
        return None;
    }
    let len = header & !FRAME_FLAG;
    Some(if len as usize <= MAX_FRAME {
        Ok(len as usize)
    } else {
        Err(format!(
            "control frame header {header:#018x}: {len} bytes, over the {MAX_FRAME}-byte limit"
        ))
    })
}

/// Whether a message of `size` bytes travels whole on the control stream.
pub fn is_inline(shape: &Shape, size: usize) -> bool {
    shape.nstreams == 0 || size <= shape.inline_bytes as usize
}

/// Header before every chunk on a data stream: which message (the sender's count of messages
/// on the connection, inline ones included, which is the receiver's count of posted receives:
/// messages match in posting order), the message's size, where in it, and how many bytes follow.
/// With the size the receiver checks every chunk against the plan both ends share
/// ([`chunk_size`]) before a byte lands: inside the message, on a chunk boundary, whole.
///
/// | off | size | field |
/// |---|---|---|
/// | 0 | 8 | message number |
/// | 8 | 4 | message size |
/// | 12 | 4 | offset in the message |
/// | 16 | 4 | length (> 0) |
/// | 20 | 44 | 0 (reserved) |
///
/// 64 bytes, so that a chunk's bytes keep their alignment to the cache line inside the socket's
/// buffers: with a 24-byte header, both copies (into the sender's socket, out of the receiver's)
/// ran misaligned, and a 1 MiB ping-pong on loopback took about twice as long
/// (`ncclbpf-bench arm --arm off --test lat --size 1048576`, 2-core build machine).
pub const CHUNK_HEADER_SIZE: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub seq: u64,
    pub size: u32,
    pub offset: u32,
    pub len: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_SIZE] {
        let mut b = [0u8; CHUNK_HEADER_SIZE];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b[12..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// `None` when a reserved byte is not 0 (no sender of ours writes that).
    pub fn decode(b: &[u8; CHUNK_HEADER_SIZE]) -> Option<ChunkHeader> {
        b[20..].iter().all(|&x| x == 0).then(|| ChunkHeader {
            seq: u64_at(b, 0),
            size: u32_at(b, 8),
            offset: u32_at(b, 12),
            len: u32_at(b, 16),
        })
    }

    /// Why this header is not a chunk the sender's plan for its message makes (`None`: it is):
    /// not empty, on a chunk boundary, inside the message, and whole.
    pub fn off_plan(&self, shape: &Shape) -> Option<String> {
        let (size, off, len) = (self.size as usize, self.offset as usize, self.len as usize);
        if len == 0 {
            return Some("an empty chunk".into());
        }
        if size > i32::MAX as usize {
            return Some(format!(
                "a chunk of a {size}-byte message, larger than any message"
            ));
        }
        if is_inline(shape, size) {
            return Some(format!(
                "a chunk of a {size}-byte message, which travels inline"
            ));
        }
        let c = chunk_size(shape, size);
        if off >= size || off % c != 0 || len != c.min(size - off) {
            return Some(format!(
                "bytes {off}..{} of a {size}-byte message, not one of its {c}-byte chunks",
                off.saturating_add(len)
            ));
        }
        None
    }
}

/// Chunks of one message at most: `chunk_size` is at least `size / nstreams` up to 1 MiB, so a
/// message under 2^31 bytes has at most max(16, 2^31 / 2^20) of them.
pub const MAX_CHUNKS: usize = 2048;

/// The largest chunk: a larger message is cut into more chunks than streams, so that a slow
/// stream takes fewer of them and the receiver's writes pipeline with the sender's.
pub const MAX_CHUNK: usize = 1 << 20;

/// The chunk size of a message of `size` bytes (over the inline limit): `size / nstreams`,
/// at least `min_chunk`, at most [`MAX_CHUNK`] (or `min_chunk`, if that is larger). NCCL's steps
/// (up to 512 KiB) are cut over the streams as before; larger messages into 1 MiB chunks.
pub fn chunk_size(shape: &Shape, size: usize) -> usize {
    let n = shape.nstreams.max(1) as usize;
    let min = shape.min_chunk as usize;
    size.div_ceil(n).min(MAX_CHUNK.max(min)).max(min)
}

/// Cuts a message of `size` bytes into `(offset, len)` chunks of [`chunk_size`].
pub fn plan_chunks(shape: &Shape, size: usize, mut emit: impl FnMut(usize, usize)) {
    let chunk = chunk_size(shape, size);
    let mut off = 0;
    while off < size {
        let len = chunk.min(size - off);
        emit(off, len);
        off += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> Handle {
        Handle {
            nonce: 0xdead_beef,
            addr: "10.1.2.3:4567".parse().unwrap(),
            shape: Shape {
                nstreams: 4,
                inline_bytes: 16384,
                min_chunk: 65536,
            },
            secret: Secret([0x5e; SECRET_SIZE]),
        }
    }

    #[test]
    fn handle_round_trips_v4_and_v6() {
        let mut b = [0u8; HANDLE_SIZE];
        handle().encode(&mut b);
        assert_eq!(Handle::decode(&b).unwrap(), handle());
        let mut h6 = handle();
        h6.addr = "[2001:db8::7]:9".parse().unwrap();
        h6.encode(&mut b);
        assert_eq!(Handle::decode(&b).unwrap(), h6);
        Handle::set_connect_key(&mut b, 42);
        assert_eq!(Handle::connect_key(&b), 42);
        assert_eq!(
            Handle::decode(&b).unwrap(),
            h6,
            "the key does not disturb the handle"
        );
    }

    #[test]
    fn the_handle_leaves_its_last_40_bytes_to_a_wrapper() {
        for h in [
            handle(),
            Handle {
                addr: "[2001:db8::7]:9".parse().unwrap(),
                ..handle()
            },
        ] {
            let mut b = [0xffu8; HANDLE_SIZE];
            h.encode(&mut b);
            Handle::set_connect_key(&mut b, u64::MAX);
            assert!(b[HANDLE_SIZE - 40..].iter().all(|&x| x == 0), "{b:?}");
        }
    }

    #[test]
    fn garbage_handles_are_rejected() {
        let mut b = [0xa5u8; HANDLE_SIZE];
        assert!(matches!(Handle::decode(&b), Err(NetError::BadHandle(_))));
        handle().encode(&mut b);
        b[16] = 9;
        assert!(
            Handle::decode(&b)
                .unwrap_err()
                .to_string()
                .contains("family")
        );
        handle().encode(&mut b);
        b[36] = 200;
        assert!(
            Handle::decode(&b)
                .unwrap_err()
                .to_string()
                .contains("shape")
        );
        handle().encode(&mut b);
        b[18] = 0;
        b[19] = 0;
        assert!(Handle::decode(&b).is_err());
        handle().encode(&mut b);
        b[SECRET_OFFSET..SECRET_OFFSET + SECRET_SIZE].fill(0);
        assert!(
            Handle::decode(&b)
                .unwrap_err()
                .to_string()
                .contains("secret")
        );
        handle().encode(&mut b);
        for old in [HANDLE_MAGIC_V1, HANDLE_MAGIC_V2, HANDLE_MAGIC_V3] {
            b[0..8].copy_from_slice(&old.to_le_bytes());
            assert!(
                Handle::decode(&b)
                    .unwrap_err()
                    .to_string()
                    .contains("older ncclbpf")
            );
        }
    }

    #[test]
    fn hello_round_trip_and_rejects() {
        let h = Hello {
            nonce: 1,
            conn_id: 2,
            index: 3,
            nstreams: 4,
            challenge: [9; CHALLENGE_SIZE],
        };
        assert_eq!(Hello::decode(&h.encode()), Some(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert_eq!(Hello::decode(&bad), None);
        let over = Hello { index: 5, ..h };
        assert_eq!(Hello::decode(&over.encode()), None);
    }

    #[test]
    fn chunk_plan_covers_message_in_bounded_chunks() {
        let shape = Shape {
            nstreams: 3,
            inline_bytes: 0,
            min_chunk: 100,
        };
        let plan = |size| {
            let mut chunks = vec![];
            plan_chunks(&shape, size, |o, l| chunks.push((o, l)));
            chunks
        };
        assert_eq!(plan(1000), [(0, 334), (334, 334), (668, 332)]);
        assert_eq!(plan(250), [(0, 100), (100, 100), (200, 50)]);
        assert_eq!(plan(50), [(0, 50)]);
        // Past MAX_CHUNK per stream, chunks stay at MAX_CHUNK, the last one short.
        let big = 3 * MAX_CHUNK * 2 + 7;
        let chunks = plan(big);
        assert_eq!(chunks.len(), 7);
        assert!(chunks[..6].iter().all(|&(_, l)| l == MAX_CHUNK));
        assert_eq!(chunks[6], (6 * MAX_CHUNK, 7));
        // A minimum above MAX_CHUNK wins.
        let wide = Shape {
            min_chunk: 4 * MAX_CHUNK as u32,
            ..shape
        };
        assert_eq!(chunk_size(&wide, 100 * MAX_CHUNK), 4 * MAX_CHUNK);
        assert!(is_inline(
            &Shape {
                nstreams: 0,
                ..shape
            },
            1 << 30
        ));
    }

    #[test]
    fn chunk_headers_round_trip() {
        let h = ChunkHeader {
            seq: u64::MAX - 3,
            size: 0x0a0b_0c0d,
            offset: 0x0102_0304,
            len: 65536,
        };
        let b = h.encode();
        assert_eq!(ChunkHeader::decode(&b), Some(h));
        assert_eq!(&b[0..8], &(u64::MAX - 3).to_le_bytes());
        for at in [20, 40, CHUNK_HEADER_SIZE - 1] {
            let mut bad = b;
            bad[at] = 1;
            assert_eq!(ChunkHeader::decode(&bad), None, "reserved byte {at}");
        }
    }

    #[test]
    fn only_planned_chunks_pass() {
        let shape = Shape {
            nstreams: 4,
            inline_bytes: 1000,
            min_chunk: 100,
        };
        let mut planned = vec![];
        plan_chunks(&shape, 1003, |o, l| planned.push((o, l)));
        for &(o, l) in &planned {
            let h = ChunkHeader {
                seq: 0,
                size: 1003,
                offset: o as u32,
                len: l as u32,
            };
            assert_eq!(h.off_plan(&shape), None, "{o}+{l}");
        }
        let h = |size, offset, len| ChunkHeader {
            seq: 0,
            size,
            offset,
            len,
        };
        for bad in [
            h(1003, 0, 0),     // empty
            h(1003, 1, 251),   // off a boundary
            h(1003, 0, 250),   // not whole
            h(1003, 1004, 1),  // past the end
            h(1003, 753, 251), // the last chunk is 250
            h(999, 0, 999),    // an inline message
            h(1003, u32::MAX, u32::MAX),
            // Larger than any message (its chunk index would pass the bitmap's end).
            h(u32::MAX, 4095 << 20, 1 << 20),
        ] {
            assert!(bad.off_plan(&shape).is_some(), "{bad:?}");
        }
        // The largest message has at most MAX_CHUNKS chunks.
        let big = Shape {
            nstreams: 16,
            inline_bytes: 0,
            min_chunk: 1,
        };
        let size = i32::MAX as usize;
        assert!(size.div_ceil(chunk_size(&big, size)) <= MAX_CHUNKS);
    }
}
