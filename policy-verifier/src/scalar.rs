//! Abstract scalars: known bits (tnum), signed and unsigned 64-bit bounds, and signed and
//! unsigned bounds of the low 32 bits.
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

/// A set of 64-bit values: known bits, signed and unsigned 64-bit bounds, and signed and
/// unsigned bounds of the low 32 bits (what `w` registers and JMP32 compare), kept consistent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scalar {
    pub tn: Tnum,
    pub umin: u64,
    pub umax: u64,
    pub smin: i64,
    pub smax: i64,
    pub u32min: u32,
    pub u32max: u32,
    pub s32min: i32,
    pub s32max: i32,
}

impl Scalar {
    pub const UNKNOWN: Scalar = Scalar {
        tn: Tnum::UNKNOWN,
        umin: 0,
        umax: u64::MAX,
        smin: i64::MIN,
        smax: i64::MAX,
        u32min: 0,
        u32max: u32::MAX,
        s32min: i32::MIN,
        s32max: i32::MAX,
    };

    /// The empty set (an infeasible branch).
    pub const EMPTY: Scalar = Scalar {
        umin: 1,
        umax: 0,
        ..Scalar::UNKNOWN
    };

    pub fn konst(v: u64) -> Scalar {
        Scalar {
            tn: Tnum::konst(v),
            umin: v,
            umax: v,
            smin: v as i64,
            smax: v as i64,
            u32min: v as u32,
            u32max: v as u32,
            s32min: v as i32,
            s32max: v as i32,
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

    /// Any value of `[lo, hi]` (signed).
    pub fn srange(lo: i64, hi: i64) -> Scalar {
        Scalar {
            smin: lo,
            smax: hi,
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

    /// The low 32 bits when they are known.
    pub fn const32(&self) -> Option<u32> {
        (self.tn.mask as u32 == 0).then_some(self.tn.value as u32)
    }

    /// False when the set is empty (an infeasible branch).
    pub fn is_valid(&self) -> bool {
        self.umin <= self.umax
            && self.smin <= self.smax
            && self.u32min <= self.u32max
            && self.s32min <= self.s32max
            && self.tn.value & self.tn.mask == 0
    }

    pub fn contains_value(&self, v: u64) -> bool {
        self.tn.contains_value(v)
            && (self.umin..=self.umax).contains(&v)
            && (self.smin..=self.smax).contains(&(v as i64))
            && (self.u32min..=self.u32max).contains(&(v as u32))
            && (self.s32min..=self.s32max).contains(&(v as i32))
    }

    /// Whether every value of `o` is in `self`.
    pub fn contains(&self, o: &Scalar) -> bool {
        self.tn.contains(o.tn)
            && self.umin <= o.umin
            && o.umax <= self.umax
            && self.smin <= o.smin
            && o.smax <= self.smax
            && self.u32min <= o.u32min
            && o.u32max <= self.u32max
            && self.s32min <= o.s32min
            && o.s32max <= self.s32max
    }

    /// The values in both sets.
    pub fn intersect(&self, o: &Scalar) -> Scalar {
        if (self.tn.value ^ o.tn.value) & !(self.tn.mask | o.tn.mask) != 0 {
            return Scalar::EMPTY;
        }
        Scalar {
            tn: self.tn.intersect(o.tn),
            umin: self.umin.max(o.umin),
            umax: self.umax.min(o.umax),
            smin: self.smin.max(o.smin),
            smax: self.smax.min(o.smax),
            u32min: self.u32min.max(o.u32min),
            u32max: self.u32max.min(o.u32max),
            s32min: self.s32min.max(o.s32min),
            s32max: self.s32max.min(o.s32max),
        }
        .synced()
    }

    /// Tightens the bounds and known bits against each other (the kernel's
    /// `reg_bounds_sync`): known bits against every range, signed against unsigned of each
    /// width, the low-32-bit ranges against the 64-bit ones where the upper half is fixed.
    pub fn synced(mut self) -> Scalar {
        for _ in 0..3 {
            if !self.is_valid() {
                return Scalar::EMPTY;
            }
            let (v, m) = (self.tn.value, self.tn.mask);
            // Known bits bound every range.
            self.umin = self.umin.max(v);
            self.umax = self.umax.min(v | m);
            self.smin = self.smin.max((v | (m & (1 << 63))) as i64);
            self.smax = self.smax.min((v | (m & !(1u64 << 63))) as i64);
            self.u32min = self.u32min.max(v as u32);
            self.u32max = self.u32max.min((v | m) as u32);
            self.s32min = self.s32min.max((v as u32 | (m as u32 & (1 << 31))) as i32);
            self.s32max = self
                .s32max
                .min((v as u32 | (m as u32 & !(1u32 << 31))) as i32);
            // Signed and unsigned orders agree when the sign is known.
            if self.smin >= 0 || self.smax < 0 {
                self.umin = self.umin.max(self.smin as u64);
                self.umax = self.umax.min(self.smax as u64);
            }
            if (self.umax as i64) >= 0 || (self.umin as i64) < 0 {
                self.smin = self.smin.max(self.umin as i64);
                self.smax = self.smax.min(self.umax as i64);
            }
            if self.s32min >= 0 || self.s32max < 0 {
                self.u32min = self.u32min.max(self.s32min as u32);
                self.u32max = self.u32max.min(self.s32max as u32);
            }
            if (self.u32max as i32) >= 0 || (self.u32min as i32) < 0 {
                self.s32min = self.s32min.max(self.u32min as i32);
                self.s32max = self.s32max.min(self.u32max as i32);
            }
            // Where every value has the same upper 32 bits, the low halves of the 64-bit
            // bounds bound the low 32 bits, and the other way round.
            if self.umin >> 32 == self.umax >> 32 {
                let hi = self.umin & !0xffff_ffff;
                self.u32min = self.u32min.max(self.umin as u32);
                self.u32max = self.u32max.min(self.umax as u32);
                if self.u32min <= self.u32max {
                    self.umin = self.umin.max(hi | u64::from(self.u32min));
                    self.umax = self.umax.min(hi | u64::from(self.u32max));
                }
                if (self.umin as i32) <= (self.umax as i32) {
                    self.s32min = self.s32min.max(self.umin as i32);
                    self.s32max = self.s32max.min(self.umax as i32);
                }
            }
            if self.smin >> 32 == self.smax >> 32 {
                let hi = (self.smin as u64) & !0xffff_ffff;
                self.u32min = self.u32min.max(self.smin as u32);
                self.u32max = self.u32max.min(self.smax as u32);
                if self.u32min <= self.u32max {
                    self.smin = self.smin.max((hi | u64::from(self.u32min)) as i64);
                    self.smax = self.smax.min((hi | u64::from(self.u32max)) as i64);
                }
                if (self.smin as i32) <= (self.smax as i32) {
                    self.s32min = self.s32min.max(self.smin as i32);
                    self.s32max = self.s32max.min(self.smax as i32);
                }
            }
            if !self.is_valid() {
                return Scalar::EMPTY;
            }
            // Ranges bound the known bits.
            let hi = Tnum::range(self.umin, self.umax);
            let lo = Tnum::range(u64::from(self.u32min), u64::from(self.u32max));
            let lo = Tnum {
                value: lo.value | (self.tn.value & !0xffff_ffff),
                mask: lo.mask | (self.tn.mask & !0xffff_ffff),
            };
            if (self.tn.value ^ hi.value) & !(self.tn.mask | hi.mask) != 0
                || (self.tn.value ^ lo.value) & !(self.tn.mask | lo.mask) != 0
            {
                return Scalar::EMPTY;
            }
            self.tn = self.tn.intersect(hi).intersect(lo);
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

    /// `self` with its low 32 bits also in `low` (a zero-extended 32-bit value): for 64-bit
    /// operations whose low half depends only on the operands' low halves.
    fn meet_low(self, low: Scalar) -> Scalar {
        let tn = Tnum {
            value: (self.tn.value & !0xffff_ffff) | (low.tn.value & 0xffff_ffff),
            mask: (self.tn.mask & !0xffff_ffff) | (low.tn.mask & 0xffff_ffff),
        };
        let t = self.tn.intersect(tn);
        Scalar {
            tn: t,
            u32min: self.u32min.max(low.u32min),
            u32max: self.u32max.min(low.u32max),
            s32min: self.s32min.max(low.s32min),
            s32max: self.s32max.min(low.s32max),
            ..self
        }
        .synced()
    }

    fn add64(&self, o: &Scalar) -> Scalar {
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

    fn sub64(&self, o: &Scalar) -> Scalar {
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

    fn mul64(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.mul(o.tn));
        if let (Some(lo), Some(hi)) = (self.umin.checked_mul(o.umin), self.umax.checked_mul(o.umax))
        {
            r.umin = r.umin.max(lo);
            r.umax = r.umax.min(hi);
        }
        r.synced()
    }

    fn and64(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.and(o.tn));
        r.umax = r.umax.min(self.umax).min(o.umax);
        r.synced()
    }

    fn or64(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar::from_tnum(self.tn.or(o.tn));
        r.umin = r.umin.max(self.umin).max(o.umin);
        r.synced()
    }

    fn lsh64(&self, s: u32) -> Scalar {
        if s == 0 {
            return *self;
        }
        let mut r = Scalar::from_tnum(self.tn.lsh(s));
        if self.umax.leading_zeros() >= s {
            r.umin = r.umin.max(self.umin << s);
            r.umax = r.umax.min(self.umax << s);
        }
        r.synced()
    }

    /// A 64-bit operation whose low 32 bits are the same operation on the low 32 bits (add,
    /// sub, mul, and, or, xor, lsh): the 32-bit bounds come from the 32-bit operation.
    fn with_low(&self, o: &Scalar, r: Scalar, f: impl Fn(&Scalar, &Scalar) -> Scalar) -> Scalar {
        r.meet_low(f(&self.trunc32(), &o.trunc32()).trunc32())
    }

    pub fn add(&self, o: &Scalar) -> Scalar {
        self.with_low(o, self.add64(o), |a, b| a.add64(b))
    }

    pub fn sub(&self, o: &Scalar) -> Scalar {
        self.with_low(o, self.sub64(o), |a, b| a.sub64(b))
    }

    pub fn mul(&self, o: &Scalar) -> Scalar {
        self.with_low(o, self.mul64(o), |a, b| a.mul64(b))
    }

    pub fn and(&self, o: &Scalar) -> Scalar {
        self.with_low(o, self.and64(o), |a, b| a.and64(b))
    }

    pub fn or(&self, o: &Scalar) -> Scalar {
        self.with_low(o, self.or64(o), |a, b| a.or64(b))
    }

    pub fn xor(&self, o: &Scalar) -> Scalar {
        Scalar::from_tnum(self.tn.xor(o.tn))
    }

    /// Shift by a known amount (already masked to 0..64).
    pub fn lsh(&self, s: u32) -> Scalar {
        let r = self.lsh64(s);
        if s >= 32 {
            return r;
        }
        r.meet_low(self.trunc32().lsh64(s).trunc32())
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
        if !self.is_valid() {
            return Scalar::EMPTY;
        }
        Scalar {
            tn: self.tn.cast32(),
            umin: u64::from(self.u32min),
            umax: u64::from(self.u32max),
            smin: i64::from(self.u32min),
            smax: i64::from(self.u32max),
            u32min: self.u32min,
            u32max: self.u32max,
            s32min: self.s32min,
            s32max: self.s32max,
        }
        .synced()
    }

    /// The low `bits` bits (8, 16 or 32), sign-extended to 64 bits (`movsx`, sign-extending
    /// loads, the signed view of a 32-bit value).
    pub fn sext(&self, bits: u32) -> Scalar {
        if !self.is_valid() {
            return Scalar::EMPTY;
        }
        let shift = 64 - bits;
        if let Some(c) = self.const_value() {
            return Scalar::konst((((c << shift) as i64) >> shift) as u64);
        }
        let low = if bits == 32 {
            self.trunc32()
        } else {
            self.and(&Scalar::konst((1u64 << bits) - 1))
        };
        let half = 1u64 << (bits - 1);
        if low.umax < half {
            return low; // the sign bit is known to be 0: the value is unchanged
        }
        let tn = Tnum {
            value: (((low.tn.value << shift) as i64) >> shift) as u64,
            mask: (((low.tn.mask << shift) as i64) >> shift) as u64,
        };
        let mut r = Scalar::from_tnum(tn);
        r.smin = r.smin.max(-(half as i64));
        r.smax = r.smax.min(half as i64 - 1);
        if bits == 32 {
            r.smin = r.smin.max(i64::from(self.s32min));
            r.smax = r.smax.min(i64::from(self.s32max));
        }
        r.synced()
    }

    /// Byte swap of the low `bits` bits (16, 32, 64); the rest becomes zero.
    pub fn bswap(&self, bits: u32) -> Scalar {
        let swap = |x: u64| match bits {
            16 => u64::from((x as u16).swap_bytes()),
            32 => u64::from((x as u32).swap_bytes()),
            _ => x.swap_bytes(),
        };
        Scalar::from_tnum(Tnum {
            value: swap(self.tn.value),
            mask: swap(self.tn.mask),
        })
    }

    /// The low `bits` bits (16, 32, 64), zero-extended.
    pub fn zext(&self, bits: u32) -> Scalar {
        match bits {
            64 => *self,
            32 => self.trunc32(),
            _ => self.and(&Scalar::konst((1u64 << bits) - 1)),
        }
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
        (any::<u64>(), 0u32..68, any::<u64>(), any::<bool>()).prop_map(
            |(v, width, noise, mask_bits)| {
                let s = match width {
                    0 => Scalar::konst(v),
                    64 => Scalar::UNKNOWN,
                    65 => {
                        // Bounds on the low 32 bits only (the upper half unknown).
                        let lo = v as u32;
                        let hi = lo.saturating_add((noise >> 40) as u32);
                        Scalar {
                            u32min: lo,
                            u32max: hi,
                            ..Scalar::UNKNOWN
                        }
                        .synced()
                    }
                    66 => {
                        // Signed 32-bit bounds around the sign change.
                        let lo = (v as i32).min(0);
                        let hi = lo.saturating_add((noise >> 33) as i32);
                        Scalar {
                            s32min: lo,
                            s32max: hi,
                            ..Scalar::UNKNOWN
                        }
                        .synced()
                    }
                    67 => {
                        let lo = (v as i64).min(0);
                        Scalar::srange(lo, lo.saturating_add((noise >> 20) as i64))
                    }
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
                // Pick a concrete member: value within the unknown bits, moved into the
                // ranges (the property skips the rare pick that is still outside).
                let mut c = s.tn.value | (noise & s.tn.mask);
                if !s.contains_value(c) {
                    let low = (c as u32).clamp(s.u32min, s.u32max);
                    c = (c & !0xffff_ffff) | u64::from(low);
                }
                if !s.contains_value(c) {
                    c = c.clamp(s.umin, s.umax);
                }
                if !s.contains_value(c) {
                    c = (c as i64).clamp(s.smin, s.smax) as u64;
                }
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
            prop_assert!(a.intersect(&a).contains_value(x));
            if b.contains_value(x) {
                prop_assert!(a.intersect(&b).contains_value(x));
            }
            prop_assert!(a.sext(8).contains_value(x as u8 as i8 as i64 as u64));
            prop_assert!(a.sext(16).contains_value(x as u16 as i16 as i64 as u64));
            prop_assert!(a.sext(32).contains_value(x as u32 as i32 as i64 as u64));
            prop_assert!(a.bswap(16).contains_value(u64::from((x as u16).swap_bytes())));
            prop_assert!(a.bswap(32).contains_value(u64::from((x as u32).swap_bytes())));
            prop_assert!(a.bswap(64).contains_value(x.swap_bytes()));
            prop_assert!(a.zext(16).contains_value(x & 0xffff));
            // ALU32: the operation on the low halves, zero-extended.
            let (a32, b32, x32, y32) = (a.trunc32(), b.trunc32(), x as u32, y as u32);
            let s32 = s % 32;
            prop_assert!(a32.add(&b32).trunc32().contains_value(u64::from(x32.wrapping_add(y32))));
            prop_assert!(a32.sub(&b32).trunc32().contains_value(u64::from(x32.wrapping_sub(y32))));
            prop_assert!(a32.mul(&b32).trunc32().contains_value(u64::from(x32.wrapping_mul(y32))));
            prop_assert!(a32.lsh(s32).trunc32().contains_value(u64::from(x32 << s32)));
            prop_assert!(a32.rsh(s32).trunc32().contains_value(u64::from(x32 >> s32)));
            prop_assert!(
                a.sext(32).arsh(s32).trunc32().contains_value(u64::from(((x32 as i32) >> s32) as u32))
            );
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

    #[test]
    fn low_32_bit_bounds() {
        // After `w1 = w1` (u64 -> u32) and `if w1 > 7` failing: the 64-bit value is 0..7.
        let w = Scalar::UNKNOWN.trunc32();
        let r = Scalar { u32max: 7, ..w }.synced();
        assert_eq!((r.umin, r.umax), (0, 7));
        // Low 32 bits bounded but the upper half unknown: only the known bits bound it.
        let r = Scalar {
            u32max: 7,
            ..Scalar::UNKNOWN
        }
        .synced();
        assert_eq!(r.umax, 0xffff_ffff_0000_0007);
        assert_eq!(r.trunc32().umax, 7);
        // A negative 32-bit value seen as signed.
        let r = Scalar::konst(0xffff_fffe).sext(32);
        assert_eq!(r.const_value(), Some(-2i64 as u64));
        assert_eq!(Scalar::urange(0, 0x7f).sext(8).umax, 0x7f);
        let b = Scalar::urange(0, 0xff).bswap(16);
        assert_eq!((b.umin, b.umax), (0, 0xff00));
    }
}
