//! Abstract scalars: known bits (tnum) plus signed and unsigned 64-bit bounds.
//!
//! Every operation is sound: if concrete inputs lie in the abstract inputs, the concrete result
//! lies in the abstract result (a property test checks this against concrete execution).
//! 32-bit operations work on zero-extended values, as BPF's ALU32 does.

// The operations take their names from BPF, not from std::ops.
#![allow(clippy::should_implement_trait)]

/// Known bits: a bit is unknown where `mask` is 1, else it equals the bit of `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tnum {
    pub value: u64,
    pub mask: u64,
}

impl Tnum {
    pub const UNKNOWN: Tnum = Tnum {
        value: 0,
        mask: u64::MAX,
    };

    pub const fn konst(v: u64) -> Tnum {
        Tnum { value: v, mask: 0 }
    }

    /// The smallest tnum containing every value of `[min, max]`.
    pub fn range(min: u64, max: u64) -> Tnum {
        let chi = min ^ max;
        let bits = 64 - chi.leading_zeros();
        if bits > 63 {
            return Tnum::UNKNOWN;
        }
        let delta = (1u64 << bits) - 1;
        Tnum {
            value: min & !delta,
            mask: delta,
        }
    }

    pub fn add(self, o: Tnum) -> Tnum {
        let sm = self.mask.wrapping_add(o.mask);
        let sv = self.value.wrapping_add(o.value);
        let sigma = sm.wrapping_add(sv);
        let chi = sigma ^ sv;
        let mu = chi | self.mask | o.mask;
        Tnum {
            value: sv & !mu,
            mask: mu,
        }
    }

    pub fn sub(self, o: Tnum) -> Tnum {
        let dv = self.value.wrapping_sub(o.value);
        let alpha = dv.wrapping_add(self.mask);
        let beta = dv.wrapping_sub(o.mask);
        let chi = alpha ^ beta;
        let mu = chi | self.mask | o.mask;
        Tnum {
            value: dv & !mu,
            mask: mu,
        }
    }

    pub fn and(self, o: Tnum) -> Tnum {
        let alpha = self.value | self.mask;
        let beta = o.value | o.mask;
        let v = self.value & o.value;
        Tnum {
            value: v,
            mask: alpha & beta & !v,
        }
    }

    pub fn or(self, o: Tnum) -> Tnum {
        let v = self.value | o.value;
        let mu = self.mask | o.mask;
        Tnum {
            value: v,
            mask: mu & !v,
        }
    }

    pub fn xor(self, o: Tnum) -> Tnum {
        let v = self.value ^ o.value;
        let mu = self.mask | o.mask;
        Tnum {
            value: v & !mu,
            mask: mu,
        }
    }

    pub fn lsh(self, s: u32) -> Tnum {
        Tnum {
            value: self.value << s,
            mask: self.mask << s,
        }
    }

    pub fn rsh(self, s: u32) -> Tnum {
        Tnum {
            value: self.value >> s,
            mask: self.mask >> s,
        }
    }

    pub fn arsh(self, s: u32) -> Tnum {
        Tnum {
            value: ((self.value as i64) >> s) as u64,
            mask: ((self.mask as i64) >> s) as u64,
        }
    }

    pub fn mul(self, o: Tnum) -> Tnum {
        match (self.is_const(), o.is_const()) {
            (true, true) => Tnum::konst(self.value.wrapping_mul(o.value)),
            _ => {
                // Trailing known-zero bits survive multiplication.
                let tz =
                    (self.value | self.mask).trailing_zeros() + (o.value | o.mask).trailing_zeros();
                if tz >= 64 {
                    Tnum::konst(0)
                } else {
                    Tnum {
                        value: 0,
                        mask: u64::MAX << tz,
                    }
                }
            }
        }
    }

    pub fn intersect(self, o: Tnum) -> Tnum {
        let v = self.value | o.value;
        let mu = self.mask & o.mask;
        Tnum {
            value: v & !mu,
            mask: mu,
        }
    }

    pub fn cast32(self) -> Tnum {
        Tnum {
            value: self.value & 0xffff_ffff,
            mask: self.mask & 0xffff_ffff,
        }
    }

    pub fn is_const(self) -> bool {
        self.mask == 0
    }

    /// Whether every value of `o` is a value of `self`.
    pub fn contains(self, o: Tnum) -> bool {
        o.mask & !self.mask == 0 && (o.value & !self.mask) == self.value
    }

    pub fn contains_value(self, v: u64) -> bool {
        v & !self.mask == self.value
    }
}

/// A set of 64-bit values: known bits and signed/unsigned bounds, kept consistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scalar {
    pub tn: Tnum,
    pub umin: u64,
    pub umax: u64,
    pub smin: i64,
    pub smax: i64,
}

impl Scalar {
    pub const UNKNOWN: Scalar = Scalar {
        tn: Tnum::UNKNOWN,
        umin: 0,
        umax: u64::MAX,
        smin: i64::MIN,
        smax: i64::MAX,
    };

    pub fn konst(v: u64) -> Scalar {
        Scalar {
            tn: Tnum::konst(v),
            umin: v,
            umax: v,
            smin: v as i64,
            smax: v as i64,
        }
    }

    /// Any value of `[lo, hi]` (unsigned).
    pub fn urange(lo: u64, hi: u64) -> Scalar {
        Scalar {
            umin: lo,
            umax: hi,
            ..Scalar::UNKNOWN
        }
        .synced()
    }

    /// Any zero-extended 32-bit value.
    pub fn unknown32() -> Scalar {
        Scalar::urange(0, u32::MAX as u64)
    }

    pub fn const_value(&self) -> Option<u64> {
        self.tn.is_const().then_some(self.tn.value)
    }

    /// False when the set is empty (an infeasible branch).
    pub fn is_valid(&self) -> bool {
        self.umin <= self.umax
            && self.smin <= self.smax
            && self.tn.value & self.tn.mask == 0
            && self.tn.contains_value(self.tn.value)
    }

    pub fn contains_value(&self, v: u64) -> bool {
        self.tn.contains_value(v)
            && (self.umin..=self.umax).contains(&v)
            && (self.smin..=self.smax).contains(&(v as i64))
    }

    /// Whether every value of `o` is in `self`.
    pub fn contains(&self, o: &Scalar) -> bool {
        self.tn.contains(o.tn)
            && self.umin <= o.umin
            && o.umax <= self.umax
            && self.smin <= o.smin
            && o.smax <= self.smax
    }

    /// Tightens the bounds and known bits against each other.
    pub fn synced(mut self) -> Scalar {
        for _ in 0..2 {
            self.umin = self.umin.max(self.tn.value);
            self.umax = self.umax.min(self.tn.value | self.tn.mask);
            self.smin = self
                .smin
                .max((self.tn.value | (self.tn.mask & (1 << 63))) as i64);
            self.smax = self
                .smax
                .min((self.tn.value | (self.tn.mask & !(1u64 << 63))) as i64);
            if self.smin >= 0 || self.smax < 0 {
                // The sign is known: signed and unsigned orders agree.
                self.umin = self.umin.max(self.smin as u64);
                self.umax = self.umax.min(self.smax as u64);
            }
            if (self.umax as i64) >= 0 || (self.umin as i64) < 0 {
                // All values on one side of the sign bit.
                self.smin = self.smin.max(self.umin as i64);
                self.smax = self.smax.min(self.umax as i64);
            }
            if self.umin <= self.umax {
                self.tn = self.tn.intersect(Tnum::range(self.umin, self.umax));
            }
        }
        self
    }

    fn from_tnum(tn: Tnum) -> Scalar {
        Scalar {
            tn,
            ..Scalar::UNKNOWN
        }
        .synced()
    }

    pub fn add(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.add(o.tn));
        if let (Some(lo), Some(hi)) = (self.umin.checked_add(o.umin), self.umax.checked_add(o.umax))
        {
            r.umin = r.umin.max(lo);
            r.umax = r.umax.min(hi);
        }
        if let (Some(lo), Some(hi)) = (self.smin.checked_add(o.smin), self.smax.checked_add(o.smax))
        {
            r.smin = r.smin.max(lo);
            r.smax = r.smax.min(hi);
        }
        r.synced()
    }

    pub fn sub(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.sub(o.tn));
        if self.umin >= o.umax {
            r.umin = r.umin.max(self.umin - o.umax);
            r.umax = r.umax.min(self.umax - o.umin);
        }
        if let (Some(lo), Some(hi)) = (self.smin.checked_sub(o.smax), self.smax.checked_sub(o.smin))
        {
            r.smin = r.smin.max(lo);
            r.smax = r.smax.min(hi);
        }
        r.synced()
    }

    pub fn mul(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.mul(o.tn));
        if let (Some(lo), Some(hi)) = (self.umin.checked_mul(o.umin), self.umax.checked_mul(o.umax))
        {
            r.umin = r.umin.max(lo);
            r.umax = r.umax.min(hi);
        }
        r.synced()
    }

    pub fn and(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.and(o.tn));
        r.umax = r.umax.min(self.umax).min(o.umax);
        r.synced()
    }

    pub fn or(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.or(o.tn));
        r.umin = r.umin.max(self.umin).max(o.umin);
        r.synced()
    }

    pub fn xor(&self, o: &Scalar) -> Scalar {
        Scalar::from_tnum(self.tn.xor(o.tn))
    }

    /// Shift by a known amount (already masked to 0..64).
    pub fn lsh(&self, s: u32) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.lsh(s));
        if s == 0 {
            return *self;
        }
        if self.umax.leading_zeros() >= s {
            r.umin = r.umin.max(self.umin << s);
            r.umax = r.umax.min(self.umax << s);
        }
        r.synced()
    }

    pub fn rsh(&self, s: u32) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.rsh(s));
        r.umin = r.umin.max(self.umin >> s);
        r.umax = r.umax.min(self.umax >> s);
        r.synced()
    }

    pub fn arsh(&self, s: u32) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.arsh(s));
        r.smin = r.smin.max(self.smin >> s);
        r.smax = r.smax.min(self.smax >> s);
        r.synced()
    }

    /// Unsigned division by a divisor the verifier proved non-zero.
    pub fn udiv(&self, o: &Scalar) -> Scalar {
        if let (Some(a), Some(b)) = (self.const_value(), o.const_value())
            && b != 0
        {
            return Scalar::konst(a / b);
        }
        Scalar::urange(self.umin / o.umax.max(1), self.umax / o.umin.max(1))
    }

    /// Unsigned modulo by a divisor the verifier proved non-zero.
    pub fn umod(&self, o: &Scalar) -> Scalar {
        if let (Some(a), Some(b)) = (self.const_value(), o.const_value())
            && b != 0
        {
            return Scalar::konst(a % b);
        }
        Scalar::urange(0, self.umax.min(o.umax.saturating_sub(1)))
    }

    /// The low 32 bits, zero-extended.
    pub fn trunc32(&self) -> Scalar {
        if self.umax <= u32::MAX as u64 {
            return *self;
        }
        Scalar {
            tn: self.tn.cast32(),
            ..Scalar::unknown32()
        }
        .synced()
    }

    /// Whether the value may be zero.
    pub fn may_be_zero(&self) -> bool {
        self.contains_value(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An abstract value and a concrete member of it.
    fn member() -> impl Strategy<Value = (Scalar, u64)> {
        (any::<u64>(), 0u32..65, any::<u64>(), any::<bool>()).prop_map(
            |(v, width, noise, mask_bits)| {
                let s = match width {
                    0 => Scalar::konst(v),
                    64 => Scalar::UNKNOWN,
                    w => {
                        let lo = v & !((1u64 << w) - 1);
                        if mask_bits {
                            Scalar::from_tnum(Tnum {
                                value: lo,
                                mask: (1u64 << w) - 1,
                            })
                        } else {
                            Scalar::urange(lo, lo | ((1u64 << w) - 1))
                        }
                    }
                };
                // Pick a concrete member: value within the unknown bits.
                let c = s.tn.value | (noise & s.tn.mask);
                let c = c.clamp(s.umin, s.umax);
                (s, c)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn operations_are_sound((a, x) in member(), (b, y) in member(), s in 0u32..64) {
            prop_assume!(a.contains_value(x) && b.contains_value(y));
            prop_assert!(a.add(&b).contains_value(x.wrapping_add(y)));
            prop_assert!(a.sub(&b).contains_value(x.wrapping_sub(y)));
            prop_assert!(a.mul(&b).contains_value(x.wrapping_mul(y)));
            prop_assert!(a.and(&b).contains_value(x & y));
            prop_assert!(a.or(&b).contains_value(x | y));
            prop_assert!(a.xor(&b).contains_value(x ^ y));
            prop_assert!(a.lsh(s).contains_value(x << s));
            prop_assert!(a.rsh(s).contains_value(x >> s));
            prop_assert!(a.arsh(s).contains_value(((x as i64) >> s) as u64));
            prop_assert!(a.trunc32().contains_value(x & 0xffff_ffff));
            if y != 0 && !b.may_be_zero() {
                prop_assert!(a.udiv(&b).contains_value(x / y));
                prop_assert!(a.umod(&b).contains_value(x % y));
            }
            prop_assert!(a.synced().contains_value(x));
        }
    }

    #[test]
    fn ranges_and_consts() {
        let a = Scalar::urange(0, 15);
        assert_eq!(a.tn, Tnum { value: 0, mask: 15 });
        assert_eq!(a.add(&Scalar::konst(1)).umax, 16);
        let m = Scalar::UNKNOWN.and(&Scalar::konst(1023));
        assert_eq!((m.umin, m.umax), (0, 1023));
        assert!(
            Scalar::urange(1, 10)
                .udiv(&Scalar::konst(2))
                .contains_value(5)
        );
        assert!(!Scalar::urange(1, 10).may_be_zero());
    }
}
