//! The side channel: one TCP stream of our own beside each connection of the inner plugin,
//! for what the inner plugin cannot carry for us: the agreement's records between nodes
//! (`net_autotune`'s closed loop), one connection id for both ends, and each end's address for
//! the stall finder.
//!
//! It is a connection of our socket transport with no data streams (control stream only),
//! admitted with the same keyed handshake (`crate::handshake`), and observed by nobody (its
//! wrapped connection is). It is introduced in the tail of NCCL's 128-byte handle, next to the
//! inner plugin's own handle, only where that tail was free: before the inner plugin's
//! `listen`, the tail is filled with a known pattern; after it, the bytes the trailer needs
//! must still hold that pattern, or zeros (a plugin that clears the whole handle), else
//! nothing is written. The connecting end takes the trailer out and puts back exactly what was
//! there before the inner plugin's `connect` sees the handle.
//!
//! Trailer layout, from the end of the handle (little endian):
//!
//! | off | size | field |
//! |---|---|---|
//! | 120 | 8 | magic `NCCLBPFS` |
//! | 119 | 1 | what the tail held: 1 the pattern, 0 zeros |
//! | 118 | 1 | address family: 4 or 6 |
//! | 116 | 2 | port |
//! | 108 | 8 | listener id |
//! | 92 | 16 | seed of the listener's secret (see [`secret_of`]) |
//! | 88 or 76 | 4 or 16 | IP address |
//!
//! So an inner handle of up to 88 bytes leaves room over IPv4 (ncclbpf's own uses 88), 76
//! over IPv6.

use crate::handshake::Secret;
use crate::wire::{HANDLE_SIZE, Handle, Shape};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The side channel's shape: its control stream only.
pub const SHAPE: Shape = Shape {
    nstreams: 0,
    inline_bytes: 64 * 1024,
    min_chunk: 64 * 1024,
};

const MAGIC: u64 = 0x5346_5042_4c43_434e; // "NCCLBPFS"
const MAGIC_AT: usize = 120;
const TAIL_AT: usize = 119;
const FAMILY_AT: usize = 118;
const PORT_AT: usize = 116;
const NONCE_AT: usize = 108;
const SEED_AT: usize = 92;
const SEED_SIZE: usize = 16;
/// The earliest byte a trailer may use (over IPv6).
pub const START: usize = 76;

/// A side channel's listener secret, from the 16-byte seed the trailer carries (128 bits of
/// randomness, stretched to the 32-byte key the handshake's MAC takes).
pub fn secret_of(seed: &[u8; SEED_SIZE]) -> Secret {
    Secret(blake3::derive_key(
        "ncclbpf 2026-12-07 side channel listener secret",
        seed,
    ))
}

/// A fresh seed and its secret.
pub fn fresh_secret() -> std::io::Result<([u8; SEED_SIZE], Secret)> {
    let mut seed = [0u8; SEED_SIZE];
    crate::handshake::fill_random(&mut seed)?;
    Ok((seed, secret_of(&seed)))
}

/// Bytes of the handle's tail a trailer for `addr` takes.
pub fn len(addr: &SocketAddr) -> usize {
    HANDLE_SIZE - ip_at(addr.ip().is_ipv4())
}

fn ip_at(v4: bool) -> usize {
    if v4 { SEED_AT - 4 } else { SEED_AT - 16 }
}

fn pattern(i: usize) -> u8 {
    0x5a ^ (i as u8).wrapping_mul(31)
}

/// Before the inner plugin's `listen`: the pattern in the tail.
pub fn prepare(h: &mut [u8; HANDLE_SIZE]) {
    for (i, b) in h.iter_mut().enumerate().skip(START) {
        *b = pattern(i);
    }
}

/// After the inner plugin's `listen`: whether the last `len` bytes are free (`Some(true)`:
/// they hold the pattern, `Some(false)`: zeros), else `None`.
pub fn room(h: &[u8; HANDLE_SIZE], len: usize) -> Option<bool> {
    let from = HANDLE_SIZE - len;
    if (from..HANDLE_SIZE).all(|i| h[i] == pattern(i)) {
        Some(true)
    } else if h[from..].iter().all(|&b| b == 0) {
        Some(false)
    } else {
        None
    }
}

/// Writes the trailer for the side channel's listener `l`, whose secret came from `seed` (the
/// tail checked free by [`room`], which said what it held).
pub fn write(h: &mut [u8; HANDLE_SIZE], l: &Handle, seed: &[u8; SEED_SIZE], held_pattern: bool) {
    let v4 = l.addr.ip().is_ipv4();
    match l.addr.ip() {
        IpAddr::V4(a) => h[ip_at(true)..SEED_AT].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => h[ip_at(false)..SEED_AT].copy_from_slice(&a.octets()),
    }
    h[SEED_AT..SEED_AT + SEED_SIZE].copy_from_slice(seed);
    h[NONCE_AT..NONCE_AT + 8].copy_from_slice(&l.nonce.to_le_bytes());
    h[PORT_AT..PORT_AT + 2].copy_from_slice(&l.addr.port().to_le_bytes());
    h[FAMILY_AT] = if v4 { 4 } else { 6 };
    h[TAIL_AT] = u8::from(held_pattern);
    h[MAGIC_AT..].copy_from_slice(&MAGIC.to_le_bytes());
}

/// At the connecting end: the side channel's listener, if the handle carries a trailer, which
/// is taken out (the tail gets back what the listening end's inner plugin left there).
pub fn take(h: &mut [u8; HANDLE_SIZE]) -> Option<Handle> {
    if h[MAGIC_AT..] != MAGIC.to_le_bytes() {
        return None;
    }
    let v4 = match h[FAMILY_AT] {
        4 => true,
        6 => false,
        _ => return None,
    };
    let from = ip_at(v4);
    let ip = if v4 {
        IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&h[from..SEED_AT]).ok()?))
    } else {
        IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(&h[from..SEED_AT]).ok()?,
        ))
    };
    let port = u16::from_le_bytes([h[PORT_AT], h[PORT_AT + 1]]);
    let nonce = u64::from_le_bytes(h[NONCE_AT..NONCE_AT + 8].try_into().ok()?);
    let mut seed = [0u8; SEED_SIZE];
    seed.copy_from_slice(&h[SEED_AT..SEED_AT + SEED_SIZE]);
    let held_pattern = h[TAIL_AT] == 1;
    for (i, b) in h.iter_mut().enumerate().skip(from) {
        *b = if held_pattern { pattern(i) } else { 0 };
    }
    Some(Handle {
        nonce,
        addr: SocketAddr::new(ip, port),
        shape: SHAPE,
        secret: secret_of(&seed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: [u8; SEED_SIZE] = [7; SEED_SIZE];

    fn listener(addr: &str) -> Handle {
        Handle {
            nonce: 0x0102_0304_0506_0708,
            addr: addr.parse().unwrap(),
            shape: SHAPE,
            secret: secret_of(&SEED),
        }
    }

    /// An inner plugin that writes `used` bytes and leaves the rest as it found it (or clears
    /// the whole handle first): the trailer fits where it should, and the connecting end gets
    /// back byte for byte what the inner plugin wrote.
    #[test]
    fn the_trailer_round_trips_and_the_inner_handle_is_restored_exactly() {
        for (addr, fits_up_to) in [("10.1.2.3:4567", 88usize), ("[fe80::1]:9", 76)] {
            let l = listener(addr);
            for clears in [false, true] {
                for used in [0usize, 16, 64, 76, 77, 88, 89, 104, 128] {
                    let mut h = [0xeeu8; HANDLE_SIZE];
                    prepare(&mut h);
                    if clears {
                        h.fill(0);
                    }
                    for (i, b) in h.iter_mut().enumerate().take(used) {
                        *b = (i as u8) | 0x80;
                    }
                    let inner_wrote = h;
                    match room(&h, len(&l.addr)) {
                        Some(p) => {
                            assert!(used <= fits_up_to, "{addr} used {used}");
                            write(&mut h, &l, &SEED, p);
                            assert_ne!(h, inner_wrote);
                            let got = take(&mut h).expect("a trailer");
                            assert_eq!(got, l);
                            assert_eq!(h, inner_wrote, "{addr} used {used} clears {clears}");
                        }
                        None => assert!(used > fits_up_to, "{addr}: {used} bytes leave room"),
                    }
                }
            }
        }
    }

    #[test]
    fn a_handle_without_a_trailer_is_left_alone() {
        let mut h = [0x42u8; HANDLE_SIZE];
        let before = h;
        assert!(take(&mut h).is_none());
        assert_eq!(h, before);
    }
}
