//! Plays a connecting peer on the wire, byte by byte, from the formats documented in
//! `netplugin/src/wire.rs` and `netplugin/src/handshake.rs` (not from their code): an honest
//! peer that holds the secret, and the strangers that do not. Blocking I/O with timeouts, so
//! run it on its own thread while the test thread polls `accept`.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

pub const HELLO_MAGIC: u64 = 0x324f_4c45_4846_5042; // "BPFHELO2"
pub const HELLO_SIZE: usize = 48;
pub const REPLY_SIZE: usize = 48;
pub const PROOF_SIZE: usize = 32;
const ACCEPTOR_LABEL: &[u8] = b"ncclbpf admission v2: acceptor";
const CONNECTOR_LABEL: &[u8] = b"ncclbpf admission v2: connector";

/// What a handle tells a connector.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub listener_id: u64,
    pub nstreams: u32,
    pub secret: [u8; 32],
}

impl Target {
    pub fn from_handle(h: &[u8; 128]) -> Target {
        let port = u16::from_le_bytes([h[18], h[19]]);
        let ip = match h[16] {
            4 => IpAddr::V4(Ipv4Addr::new(h[20], h[21], h[22], h[23])),
            _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&h[20..36]).unwrap())),
        };
        Target {
            addr: SocketAddr::new(ip, port),
            listener_id: u64::from_le_bytes(h[8..16].try_into().unwrap()),
            nstreams: u32::from_le_bytes(h[36..40].try_into().unwrap()),
            secret: h[56..88].try_into().unwrap(),
        }
    }

    /// The hello of stream `index` of connection `conn_id`.
    pub fn hello(&self, conn_id: u64, index: u32, challenge: [u8; 16]) -> [u8; HELLO_SIZE] {
        let mut b = [0u8; HELLO_SIZE];
        b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.listener_id.to_le_bytes());
        b[16..24].copy_from_slice(&conn_id.to_le_bytes());
        b[24..28].copy_from_slice(&index.to_le_bytes());
        b[28..32].copy_from_slice(&self.nstreams.to_le_bytes());
        b[32..48].copy_from_slice(&challenge);
        b
    }
}

pub fn mac(key: &[u8; 32], label: &[u8], hello: &[u8], challenge: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(label);
    h.update(hello);
    h.update(challenge);
    *h.finalize().as_bytes()
}

/// A stream the peer opened, with every byte it sent on it.
pub struct Opened {
    pub stream: TcpStream,
    pub sent: Vec<u8>,
    /// The acceptor's proof checked against the key the peer used.
    pub acceptor_proved: bool,
}

/// Opens stream `index` of connection `conn_id` and plays the connector's handshake with
/// `key` as the secret (the real one for an honest peer). Returns once the proof is sent.
pub fn join(t: &Target, conn_id: u64, index: u32, key: &[u8; 32]) -> io::Result<Opened> {
    let mut s = TcpStream::connect_timeout(&t.addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let challenge: [u8; 16] = std::array::from_fn(|i| (conn_id as u8) ^ (index as u8) ^ i as u8);
    let hello = t.hello(conn_id, index, challenge);
    s.write_all(&hello)?;
    let mut reply = [0u8; REPLY_SIZE];
    s.read_exact(&mut reply)?;
    let acceptor_proved = mac(key, ACCEPTOR_LABEL, &hello, &reply[..16]) == reply[16..];
    let proof = mac(key, CONNECTOR_LABEL, &hello, &reply[..16]);
    s.write_all(&proof)?;
    let mut sent = hello.to_vec();
    sent.extend_from_slice(&proof);
    Ok(Opened {
        stream: s,
        sent,
        acceptor_proved,
    })
}

/// Whether the other end closed `s` (end of stream or reset), looking once without waiting.
/// Bytes that arrive are read and dropped.
pub fn closed_by_peer(s: &TcpStream) -> bool {
    let mut s = s;
    s.set_nonblocking(true).unwrap();
    let closed = loop {
        match s.read(&mut [0u8; 64]) {
            Ok(0) => break true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    closed
}
