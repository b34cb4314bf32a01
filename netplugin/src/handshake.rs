//! Admission: a TCP stream joins a connection only if the process behind it proves that it
//! holds the listener's secret. The secret is drawn at `listen`, travels to the connecting
//! rank inside the handle (through NCCL's bootstrap, as the handle always did) and never
//! appears on the wire.
//!
//! Each stream opens with three fixed-size messages:
//!
//! 1. connector → acceptor, the [`Hello`](crate::wire::Hello) (48 bytes): listener id,
//!    connection id, stream index, data streams, and a fresh 16-byte challenge of the connector;
//! 2. acceptor → connector, the reply (48 bytes): a fresh 16-byte challenge of the acceptor and
//!    its proof, `MAC(secret, ACCEPTOR_LABEL, hello ‖ acceptor challenge)`;
//! 3. connector → acceptor, the proof (32 bytes): `MAC(secret, CONNECTOR_LABEL, hello ‖ acceptor
//!    challenge)`.
//!
//! The MAC is BLAKE3 in keyed mode with the 32-byte secret as key, over the role's label
//! ([`ACCEPTOR_LABEL`], [`CONNECTOR_LABEL`]), the 48 hello bytes and the 16 challenge bytes,
//! all 32 bytes of output sent. The two roles hash different labels, so one side's proof never answers for the other. Both proofs cover the whole hello
//! (connection id, index and shape cannot be changed in flight, and the connector's challenge
//! makes the acceptor's proof fresh) and the acceptor's challenge (a recorded proof does not
//! answer a new challenge: replaying a sniffed stream gets nowhere). Proofs are compared in
//! constant time. The connector checks the acceptor's proof before it counts a stream as
//! connected, so a process that took over the listener's port never receives NCCL's data.

use crate::wire::HELLO_SIZE;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;

pub const SECRET_SIZE: usize = 32;
pub const CHALLENGE_SIZE: usize = 16;
pub const MAC_SIZE: usize = 32;
/// The acceptor's reply: its challenge, then its proof.
pub const REPLY_SIZE: usize = CHALLENGE_SIZE + MAC_SIZE;
/// The connector's proof.
pub const PROOF_SIZE: usize = MAC_SIZE;

/// What each role hashes before the hello and the challenge (whose sizes are fixed, so the
/// input never reads two ways).
pub const ACCEPTOR_LABEL: &[u8] = b"ncclbpf admission v2: acceptor";
pub const CONNECTOR_LABEL: &[u8] = b"ncclbpf admission v2: connector";

/// Fills `buf` from the kernel's random source (`getrandom`, blocking only until the pool is
/// initialised at boot). Never falls back to anything weaker: without randomness there is no
/// secret, and `listen` fails.
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: getrandom writes at most rest.len() bytes into rest.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// A fresh challenge.
pub fn challenge() -> io::Result<[u8; CHALLENGE_SIZE]> {
    let mut c = [0u8; CHALLENGE_SIZE];
    fill_random(&mut c)?;
    Ok(c)
}

/// A listener's secret. Its `Debug` never shows the bytes (handles end up in logs).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub [u8; SECRET_SIZE]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn random() -> io::Result<Secret> {
        let mut s = [0u8; SECRET_SIZE];
        fill_random(&mut s)?;
        Ok(Secret(s))
    }

    fn mac(
        &self,
        label: &[u8],
        hello: &[u8; HELLO_SIZE],
        challenge: &[u8; CHALLENGE_SIZE],
    ) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(label);
        h.update(hello);
        h.update(challenge);
        h.finalize()
    }

    /// Acceptor: the reply to `hello`, answering the connector's challenge with a proof and
    /// posing `challenge` (fresh for this stream).
    pub fn reply(
        &self,
        hello: &[u8; HELLO_SIZE],
        challenge: &[u8; CHALLENGE_SIZE],
    ) -> [u8; REPLY_SIZE] {
        let mut r = [0u8; REPLY_SIZE];
        r[..CHALLENGE_SIZE].copy_from_slice(challenge);
        r[CHALLENGE_SIZE..].copy_from_slice(self.mac(ACCEPTOR_LABEL, hello, challenge).as_bytes());
        r
    }

    /// Connector: checks the acceptor's proof in `reply` and returns the proof to send back;
    /// `None` when the acceptor does not hold this secret.
    pub fn answer(
        &self,
        hello: &[u8; HELLO_SIZE],
        reply: &[u8; REPLY_SIZE],
    ) -> Option<[u8; PROOF_SIZE]> {
        let challenge: &[u8; CHALLENGE_SIZE] =
            reply[..CHALLENGE_SIZE].try_into().expect("16 bytes");
        let theirs: [u8; MAC_SIZE] = reply[CHALLENGE_SIZE..].try_into().expect("32 bytes");
        // blake3::Hash compares in constant time.
        (self.mac(ACCEPTOR_LABEL, hello, challenge) == blake3::Hash::from(theirs))
            .then(|| *self.mac(CONNECTOR_LABEL, hello, challenge).as_bytes())
    }

    /// Acceptor: whether `proof` answers `challenge` for this `hello`.
    pub fn verify(
        &self,
        hello: &[u8; HELLO_SIZE],
        challenge: &[u8; CHALLENGE_SIZE],
        proof: &[u8; PROOF_SIZE],
    ) -> bool {
        self.mac(CONNECTOR_LABEL, hello, challenge) == blake3::Hash::from(*proof)
    }
}

/// A fixed-size message moving over a non-blocking stream, as far as it has got.
pub struct Xfer<const N: usize> {
    pub buf: [u8; N],
    done: usize,
}

impl<const N: usize> Xfer<N> {
    /// A message to receive.
    pub fn incoming() -> Self {
        Xfer {
            buf: [0; N],
            done: 0,
        }
    }

    /// A message to send.
    pub fn outgoing(buf: [u8; N]) -> Self {
        Xfer { buf, done: 0 }
    }

    /// Whether any byte has moved.
    pub fn started(&self) -> bool {
        self.done > 0
    }

    /// Reads what has arrived: `Ok(true)` once the message is whole, `Ok(false)` to call
    /// again later; the end of the stream is `UnexpectedEof`.
    pub fn read_from(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        while self.done < N {
            match s.read(&mut self.buf[self.done..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Writes what the socket takes: `Ok(true)` once the message is all sent.
    pub fn write_to(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        while self.done < N {
            match s.write(&self.buf[self.done..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(b: u8) -> [u8; HELLO_SIZE] {
        [b; HELLO_SIZE]
    }

    #[test]
    fn both_proofs_check_with_the_secret() {
        let s = Secret::random().unwrap();
        let h = hello(7);
        let ch = challenge().unwrap();
        let reply = s.reply(&h, &ch);
        let proof = s.answer(&h, &reply).expect("the acceptor's proof checks");
        assert!(s.verify(&h, &ch, &proof));
    }

    #[test]
    fn anything_else_fails() {
        let s = Secret::random().unwrap();
        let other = Secret::random().unwrap();
        assert_ne!(s, other, "two secrets are never the same");
        let h = hello(7);
        let ch = challenge().unwrap();
        let reply = s.reply(&h, &ch);
        let proof = s.answer(&h, &reply).unwrap();
        // Another secret, on either side.
        assert!(other.answer(&h, &reply).is_none());
        assert!(!other.verify(&h, &ch, &proof));
        // A recorded proof does not answer a fresh challenge (replay).
        let fresh = challenge().unwrap();
        assert_ne!(ch, fresh);
        assert!(!s.verify(&h, &fresh, &proof));
        // Any changed byte of the hello (connection id, index, shape, challenge) fails both.
        for i in 0..HELLO_SIZE {
            let mut h2 = h;
            h2[i] ^= 0x40;
            assert!(!s.verify(&h2, &ch, &proof), "hello byte {i}");
            assert!(s.answer(&h2, &reply).is_none(), "hello byte {i}");
        }
        // The acceptor's proof is not a connector's proof (the labels differ).
        let acc: [u8; PROOF_SIZE] = reply[CHALLENGE_SIZE..].try_into().unwrap();
        assert!(!s.verify(&h, &ch, &acc));
        let mut bad = reply;
        bad[REPLY_SIZE - 1] ^= 1;
        assert!(s.answer(&h, &bad).is_none());
    }

    #[test]
    fn secret_debug_hides_the_bytes() {
        let s = Secret([0xab; SECRET_SIZE]);
        assert_eq!(format!("{s:?}"), "Secret(..)");
    }
}
