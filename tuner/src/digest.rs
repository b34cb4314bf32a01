//! The decision digest: one 64-bit number that sums up, in order, every decision a tuner
//! context made, so that ranks of one communicator can show from outside that they decided
//! alike (`ncclbpf decisions --compare`).
//!
//! # Definition
//!
//! Decisions are numbered from 1 (`seq`) in the order the context made them. The digest before
//! the first is 0; decision `seq` turns digest `h` into `fold(h, seq, decision)`:
//!
//! ```text
//! K            = 0x9e3779b97f4a7c15
//! absorb(h, w) = x ^ (x >> 32)        where x = (h ^ w) * K   (mod 2^64)
//!
//! w1 = nBytes ^ rotl(seq, 40)          nBytes as NCCL passed it (size_t, zero-extended)
//! w2 = u32(nchannels)                  the policy's channel count
//!    | u8(algo)      << 32             algo, proto: the policy's answer, as 8-bit two's
//!    | u8(proto)     << 40             complement (-1, NCCL's choice: 0xff)
//!    | u8(collType)  << 48             NCCL's ncclFunc_t
//!    | applied       << 56             1 if the answer was written into NCCL's table
//! fold(h, seq, d) = absorb(absorb(h, w1), w2)
//! ```
//!
//! Every field has bits of its own in `w2` (NCCL's algorithms are -1..6, protocols -1..2,
//! functions 0..9: an 8-bit field holds each; a policy's out-of-range values are taken mod
//! 256), so a decision that differs in one field differs in `w2`; `w1` is a bijection of
//! `nBytes` for a given `seq`. Two multiplications per decision (four, one word per field,
//! measured about 1 ns a call more).
//!
//! `>>` is a logical shift. A tool holding a rank's decisions (the TRACE lines `seq N: coll C B
//! B: algo A proto P channels N (applied), digest 0x…`) can recompute its digest.
//!
//! The fields are packed from the values in registers (the decision's two 4-byte fields as
//! they lie in memory, reloaded as one 8-byte word right after two 4-byte stores, cost a
//! store-forwarding stall of 4-5 ns a call in a first version).
//!
//! # What it proves
//!
//! `absorb` is a bijection of `h` for a fixed `w` and of `w` for a fixed `h` (xor, then a
//! multiplication by an odd constant, then an invertible xor-shift). Hence:
//!
//! * two ranks whose decisions differ in exactly one field of one decision (another size,
//!   another protocol, the answer applied on one and not the other) have different digests
//!   from that decision on, with certainty;
//! * two digests that differ stay different as long as the later decisions agree: once ranks
//!   diverged, every later checkpoint shows it;
//! * differences in several fields at once, or in several decisions, cancel only when they
//!   match exactly in a way that depends on the digest before them (about 2^-64 for unrelated
//!   values). It is a checksum, not a cryptographic hash: it guards against accidents, not
//!   against a rank forging its history.
//!
//! It costs two multiplications and a few xors and shifts per decision, no memory but the
//! digest itself (with publishing, about 2 ns a call: docs/design/history.md "Decision digest").

use crate::decide::Decision;

/// The odd multiplier (2^64 / golden ratio, rounded to odd).
pub const K: u64 = 0x9e37_79b9_7f4a_7c15;

#[inline(always)]
fn absorb(h: u64, w: u64) -> u64 {
    let x = (h ^ w).wrapping_mul(K);
    x ^ (x >> 32)
}

/// The digest after decision `seq` (from 1) on collective `coll_type` of `n_bytes`, given the
/// digest `h` before it (0 before the first).
#[inline(always)]
pub fn fold(h: u64, seq: u64, coll_type: i32, n_bytes: u64, d: &Decision) -> u64 {
    let w1 = n_bytes ^ seq.rotate_left(40);
    let w2 = u64::from(d.nchannels)
        | (u64::from(d.algo as u8) << 32)
        | (u64::from(d.proto as u8) << 40)
        | (u64::from(coll_type as u8) << 48)
        | (u64::from(d.applied) << 56);
    absorb(absorb(h, w1), w2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(algo: i32, proto: i32, nchannels: u32, applied: bool) -> Decision {
        Decision {
            algo,
            proto,
            nchannels,
            applied,
        }
    }

    /// One step of the definition, written out with 128-bit arithmetic.
    fn step(h: u64, w: u64) -> u64 {
        let x = (u128::from(h ^ w) * 0x9e37_79b9_7f4a_7c15u128) as u64;
        x ^ (x >> 32)
    }

    #[test]
    fn known_vector() {
        // Decision 1: all-reduce (4) of 1 MiB, Ring (1) / Simple (2), 8 channels, applied.
        let h1 = fold(0, 1, 4, 1 << 20, &d(1, 2, 8, true));
        let w2 = 8 | (1 << 32) | (2 << 40) | (4 << 48) | (1 << 56);
        assert_eq!(h1, step(step(0, (1 << 20) ^ (1 << 40)), w2));
        // Pinned (computed with Python's integers from the definition in the module docs), so
        // the definition itself cannot drift: readers in other tools recompute it.
        assert_eq!(h1, 0x24cf_4095_ee14_cfce);
        // Decision 2: broadcast (0) of 8 B, NCCL's algorithm (-1) / LL (0), not applied.
        let h2 = fold(h1, 2, 0, 8, &d(-1, 0, 0, false));
        assert_eq!(h2, step(step(h1, 8 ^ (2 << 40)), 0xff << 32));
        assert_eq!(h2, 0x5685_75c6_3838_5cdf);
    }

    #[test]
    fn order_matters() {
        let a = (4, 1024u64, d(0, 2, 0, true));
        let b = (4, 1 << 20, d(1, 2, 0, true));
        let ab = fold(fold(0, 1, a.0, a.1, &a.2), 2, b.0, b.1, &b.2);
        let ba = fold(fold(0, 1, b.0, b.1, &b.2), 2, a.0, a.1, &a.2);
        assert_ne!(ab, ba);
        // The same decision at another position differs too.
        assert_ne!(fold(0, 1, a.0, a.1, &a.2), fold(0, 2, a.0, a.1, &a.2));
    }

    /// Every field, changed alone in one decision of a sequence, changes every later digest
    /// (by the bijection argument of the module docs); checked over many random values.
    #[test]
    fn every_field_counts_and_a_difference_persists() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        type Rec = (i32, u64, Decision);
        let changes: [fn(&mut Rec, u64); 6] = [
            |r, v| r.0 ^= (v as i32) | 1,
            |r, v| r.1 ^= v | 1,
            |r, v| r.2.algo ^= (v as i32) | 1,
            |r, v| r.2.proto ^= (v as i32) | 1,
            |r, v| r.2.nchannels ^= (v as u32) | 1,
            |r, _| r.2.applied ^= true,
        ];
        for _ in 0..2000 {
            let recs: Vec<Rec> = (0..6)
                .map(|_| {
                    let v = next();
                    (
                        (v % 5) as i32,
                        next() >> (v % 64),
                        d(
                            (v >> 8) as i32 % 8 - 1,
                            (v >> 16) as i32 % 4 - 1,
                            (v >> 24) as u32 % 33,
                            v & 1 == 0,
                        ),
                    )
                })
                .collect();
            let run = |recs: &[Rec]| {
                let mut h = 0;
                recs.iter()
                    .enumerate()
                    .map(|(i, r)| {
                        h = fold(h, i as u64 + 1, r.0, r.1, &r.2);
                        h
                    })
                    .collect::<Vec<u64>>()
            };
            let base = run(&recs);
            let at = (next() % 6) as usize;
            for change in changes {
                let mut other = recs.clone();
                change(&mut other[at], next());
                let o = run(&other);
                assert_eq!(o[..at], base[..at], "the same before the change");
                for i in at..6 {
                    assert_ne!(o[i], base[i], "decision {at} changed, digest {i} the same");
                }
            }
        }
    }
}
