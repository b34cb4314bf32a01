//! One rank's record of one epoch, and its bytes on the wire.
//!
//! A record travels as the payload of a control frame (the net plugin's `Comm::send_frame`).
//! Layout, little-endian, 96 bytes of header then the words:
//!
//! ```text
//!  0 magic "NBAR"   4 version u16 (2)   6 host length u16
//!  8 comm_id u64   16 origin u64   24 epoch u64
//! 32 nranks u32    36 colls u32    40 pid u32     44 words u32
//! 48 config digest u64   56 decision digest u64   64 duration_ns u64   72 bytes u64
//! 80 members digest u64   88 net_busy_ns u64
//! 96 words[words] u64, then the host name (host length bytes, UTF-8)
//! ```
//!
//! Version 1 (88 bytes, no `net_busy_ns`) is refused like any other version: every rank of a
//! communicator runs the same library.
//!
//! Decoding checks every length against the frame, so a frame from a broken or hostile peer is
//! an error, never a panic or an oversized allocation.

use std::fmt;

const MAGIC: [u8; 4] = *b"NBAR";
const VERSION: u16 = 2;
const HEADER: usize = 96;
/// The most words a record carries (8 KiB: far below a control frame's 64 KiB).
pub const MAX_WORDS: usize = 1024;
/// The most bytes of host name a record carries.
pub const MAX_HOST: usize = 64;

/// One rank's record of one epoch of one communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The communicator (NCCL's comm hash, as the tuner context has it).
    pub comm_id: u64,
    /// Who made it: random per tuner context, so two ranks in one process differ.
    pub origin: u64,
    pub epoch: u64,
    /// Ranks of the communicator, as the maker's context has it.
    pub nranks: u32,
    /// Collectives per epoch (K) on the maker.
    pub colls: u32,
    /// The maker's process and host, for log lines.
    pub pid: u32,
    pub host: String,
    /// Digest of the maker's tuner programs, their maps' shapes, config maps and agreement
    /// settings: equal on every rank, or the ranks do not run the same configuration.
    pub config: u64,
    /// The maker's running digest of its decisions up to the epoch's end: equal on every rank,
    /// or the ranks' collective sequences (or decisions) diverged.
    pub decisions: u64,
    /// The maker's wall time for the epoch.
    pub duration_ns: u64,
    /// The time the maker's net connections of the communicator had a request in flight
    /// during the epoch (`ncclbpf_agreement::net_busy`); 0 where it has none (net v7–v10, or a
    /// communicator without net connections in this process).
    pub net_busy_ns: u64,
    /// The digest of the origins the maker combines this communicator's epochs with (fixed by
    /// its first combination; 0 before): equal on every rank, or the ranks do not combine the
    /// same records.
    pub members: u64,
    /// Bytes of the epoch's collectives (the same on every rank).
    pub bytes: u64,
    /// The change of the maker's epoch-source maps over the epoch, source by source.
    pub words: Vec<u64>,
}

/// Why a frame is not a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Not ours at all (another kind of control frame).
    NotARecord,
    /// A record of a version this build does not read.
    Version(u16),
    /// The lengths do not add up.
    Malformed(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::NotARecord => write!(f, "not an agreement record"),
            DecodeError::Version(v) => write!(
                f,
                "agreement record version {v}, this build reads {VERSION}"
            ),
            DecodeError::Malformed(why) => write!(f, "malformed agreement record: {why}"),
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Record {
    /// Whether `frame` claims to be a record (its magic), before decoding it.
    pub fn is_record(frame: &[u8]) -> bool {
        frame.len() >= 4 && frame[..4] == MAGIC
    }

    pub fn encode(&self) -> Vec<u8> {
        let words = &self.words[..self.words.len().min(MAX_WORDS)];
        let host = truncated(&self.host, MAX_HOST);
        let mut out = Vec::with_capacity(HEADER + 8 * words.len() + host.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(host.len() as u16).to_le_bytes());
        for v in [self.comm_id, self.origin, self.epoch] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.nranks, self.colls, self.pid, words.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.config,
            self.decisions,
            self.duration_ns,
            self.bytes,
            self.members,
            self.net_busy_ns,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(host.as_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<Record, DecodeError> {
        if !Record::is_record(b) {
            return Err(DecodeError::NotARecord);
        }
        if b.len() < HEADER {
            return Err(DecodeError::Malformed(format!(
                "{} bytes, the header alone is {HEADER}",
                b.len()
            )));
        }
        let version = u16_at(b, 4);
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let host_len = u16_at(b, 6) as usize;
        let nwords = u32_at(b, 44) as usize;
        if nwords > MAX_WORDS || host_len > MAX_HOST {
            return Err(DecodeError::Malformed(format!(
                "{nwords} words and {host_len} bytes of host name (limits {MAX_WORDS}, {MAX_HOST})"
            )));
        }
        let want = HEADER + 8 * nwords + host_len;
        if b.len() != want {
            return Err(DecodeError::Malformed(format!(
                "{} bytes, its lengths say {want}",
                b.len()
            )));
        }
        let words = (0..nwords).map(|i| u64_at(b, HEADER + 8 * i)).collect();
        let host_at = HEADER + 8 * nwords;
        // Shown in log lines: nothing but printable characters from a peer.
        let host = String::from_utf8_lossy(&b[host_at..host_at + host_len])
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        Ok(Record {
            comm_id: u64_at(b, 8),
            origin: u64_at(b, 16),
            epoch: u64_at(b, 24),
            nranks: u32_at(b, 32),
            colls: u32_at(b, 36),
            pid: u32_at(b, 40),
            host,
            config: u64_at(b, 48),
            decisions: u64_at(b, 56),
            duration_ns: u64_at(b, 64),
            bytes: u64_at(b, 72),
            members: u64_at(b, 80),
            net_busy_ns: u64_at(b, 88),
            words,
        })
    }

    /// `host:pid`, how log lines name the maker.
    pub fn maker(&self) -> String {
        format!("{}:{}", self.host, self.pid)
    }
}

fn truncated(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A record for tests: comm, origin, epoch and communicator size as given, the rest plain.
#[cfg(test)]
pub(crate) fn test_record(comm_id: u64, origin: u64, epoch: u64, nranks: u32) -> Record {
    Record {
        comm_id,
        origin,
        epoch,
        nranks,
        colls: 8,
        pid: 1,
        host: "h".into(),
        config: 0,
        decisions: 0,
        duration_ns: 0,
        net_busy_ns: 0,
        bytes: 0,
        members: 0,
        words: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(origin: u64, epoch: u64) -> Record {
        Record {
            comm_id: 0xc0ffee,
            origin,
            epoch,
            nranks: 4,
            colls: 64,
            pid: 4242,
            host: "node-7".into(),
            config: 0x1111,
            decisions: 0x2222,
            duration_ns: 1_000_000 + origin,
            net_busy_ns: 600_000 + origin,
            bytes: 1 << 20,
            members: 0x3333,
            words: vec![1, 2, u64::MAX, origin],
        }
    }

    #[test]
    fn a_record_survives_its_bytes() {
        let r = sample(7, 3);
        let b = r.encode();
        assert_eq!(b.len(), HEADER + 32 + 6);
        assert_eq!(Record::decode(&b), Ok(r));
    }

    #[test]
    fn every_truncation_and_extension_is_an_error() {
        let b = sample(1, 1).encode();
        for n in 0..b.len() {
            assert!(Record::decode(&b[..n]).is_err(), "{n} bytes");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(matches!(
            Record::decode(&longer),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn hostile_lengths_are_refused_before_any_allocation() {
        let mut b = sample(1, 1).encode();
        b[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Record::decode(&b), Err(DecodeError::Malformed(_))));
        let mut b = sample(1, 1).encode();
        b[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(Record::decode(&b), Err(DecodeError::Malformed(_))));
        let mut b = sample(1, 1).encode();
        b[4] = 9;
        assert_eq!(Record::decode(&b), Err(DecodeError::Version(9)));
        assert_eq!(Record::decode(b"other frame"), Err(DecodeError::NotARecord));
    }

    #[test]
    fn a_peer_cannot_put_control_characters_into_log_lines() {
        let mut r = sample(1, 1);
        r.host = "evil\n3 0x1 fake line\x1b[2J".into();
        let d = Record::decode(&r.encode()).unwrap();
        assert!(!d.host.chars().any(char::is_control), "{:?}", d.host);
    }

    #[test]
    fn long_host_names_are_cut_at_a_character_boundary() {
        let mut r = sample(1, 1);
        r.host = "é".repeat(40);
        let d = Record::decode(&r.encode()).unwrap();
        assert!(d.host.len() <= MAX_HOST && r.host.starts_with(&d.host));
    }
}
