//! ALU instructions: scalar arithmetic over abstract values (64- and 32-bit, ISA v4's signed
//! division, sign-extending moves and byte swaps), and the few kinds of arithmetic a pointer
//! allows: `± scalar`, `scalar +`, the distance between two pointers into one object, and
//! `|` of an 8-aligned stack pointer with a scalar in [0, 7] (an add there).

use super::{Checker, R, op_name};
use crate::error::Reject;
use crate::scalar::Scalar;
use crate::state::{Reg, RegType, State};
use policy_object::insn::{self as op, Insn};

/// How far a pointer's offset may move before the verifier gives up on it.
const MAX_OFF: i64 = 1 << 29;

impl Checker<'_> {
    pub(super) fn alu(&mut self, st: &mut State, i: &Insn) -> R<()> {
        let is64 = i.class() == op::ALU64;
        let o = i.op();
        let x = i.is_reg_src();
        if o == op::END {
            let dst = self.reg(st, i.dst)?;
            if dst.ty.is_pointer() {
                return Err(Reject::PointerArithmetic {
                    reg: i.dst,
                    what: format!("byte swap of {}", dst.type_name()),
                });
            }
            let bits = i.imm as u32;
            // ALU64 END is an unconditional swap; ALU END swaps to big endian (X) or
            // truncates to little endian (K) on this little-endian machine.
            let v = if is64 || x {
                dst.v.bswap(bits)
            } else {
                dst.v.zext(bits)
            };
            Self::set(st, i.dst, Reg::scalar(v));
            return Ok(());
        }
        let src = if x && o != op::NEG {
            self.reg(st, i.src)?
        } else if is64 {
            Reg::konst(i.imm as i64 as u64)
        } else {
            Reg::konst(u64::from(i.imm as u32))
        };
        if o == op::MOV {
            return self.mov(st, i, src, is64);
        }
        let dst = self.reg(st, i.dst)?;
        if dst.ty.is_pointer() || src.ty.is_pointer() {
            let r = self.pointer_alu(i, dst, src, is64)?;
            Self::set(st, i.dst, r);
            return Ok(());
        }
        let (a, b) = if is64 {
            (dst.v, src.v)
        } else {
            (dst.v.trunc32(), src.v.trunc32())
        };
        let bits = if is64 { 64 } else { 32 };
        let shift = |b: &Scalar| b.const_value().map(|s| (s % bits) as u32);
        let signed = i.off == 1;
        let r = match o {
            op::ADD => a.add(&b),
            op::SUB => a.sub(&b),
            op::MUL => a.mul(&b),
            op::AND => a.and(&b),
            op::OR => a.or(&b),
            op::XOR => a.xor(&b),
            op::DIV | op::MOD => {
                if b.may_be_zero() {
                    return Err(Reject::DivByZero {
                        reg: x.then_some(i.src),
                    });
                }
                match (signed, o == op::DIV) {
                    (false, true) => a.udiv(&b),
                    (false, false) => a.umod(&b),
                    (true, div) => signed_div(&a, &b, is64, div),
                }
            }
            op::LSH => shift(&b).map_or(Scalar::UNKNOWN, |s| a.lsh(s)),
            op::RSH => shift(&b).map_or(Scalar::UNKNOWN, |s| a.rsh(s)),
            op::ARSH if is64 => shift(&b).map_or(Scalar::UNKNOWN, |s| a.arsh(s)),
            op::ARSH => shift(&b).map_or(Scalar::unknown32(), |s| a.sext(32).arsh(s)),
            op::NEG => Scalar::konst(0).sub(&a),
            _ => {
                return Err(Reject::BadInsn {
                    what: "unknown ALU operation".into(),
                });
            }
        };
        let r = if is64 { r } else { r.trunc32() };
        Self::set(st, i.dst, Reg::scalar(r));
        Ok(())
    }

    fn mov(&mut self, st: &mut State, i: &Insn, src: Reg, is64: bool) -> R<()> {
        let mut v = src;
        if v.ty.is_pointer() && (!is64 || i.off != 0) {
            return Err(Reject::PointerLeak {
                reg: i.src,
                what: if is64 {
                    "sign-extending move of a pointer".into()
                } else {
                    "32-bit move of a pointer".into()
                },
            });
        }
        if i.off != 0 {
            // movsx: the low 8, 16 or 32 bits, sign-extended (then zero-extended for ALU32).
            let s = src.v.sext(i.off as u32);
            v = Reg::scalar(if is64 { s } else { s.trunc32() });
        } else if !is64 {
            v = Reg::scalar(v.v.trunc32());
        } else if i.is_reg_src() && v.ty == RegType::Scalar && v.v.const_value().is_none() {
            // Link the copies so that bounds learnt on one apply to the other.
            if v.id == 0 {
                v.id = self.fresh_id();
                Self::set(st, i.src, v);
            }
        }
        Self::set(st, i.dst, v);
        Ok(())
    }

    fn pointer_alu(&self, i: &Insn, dst: Reg, src: Reg, is64: bool) -> R<Reg> {
        let o = i.op();
        let name = |r: &Reg| r.type_name();
        let preg = if dst.ty.is_pointer() { i.dst } else { i.src };
        if !is64 {
            return Err(Reject::PointerArithmetic {
                reg: preg,
                what: "32-bit arithmetic on a pointer".into(),
            });
        }
        match (dst.ty.is_pointer(), src.ty.is_pointer()) {
            (true, true) => {
                if o == op::SUB && dst.ty == src.ty && self.same_object(dst.ty) {
                    // Distance between two pointers into one object: a scalar.
                    let d = Scalar::konst((dst.off - src.off) as u64)
                        .add(&dst.v)
                        .sub(&src.v);
                    return Ok(Reg::scalar(d));
                }
                let why = if o == op::SUB && dst.ty == src.ty {
                    " (the two may point into different elements: only pointers into one \
                     stack frame or one global-data map may be subtracted)"
                } else {
                    ""
                };
                Err(Reject::PointerArithmetic {
                    reg: i.dst,
                    what: format!("{} {} {}{why}", name(&dst), op_name(o), name(&src)),
                })
            }
            (false, true) if o == op::ADD => {
                // scalar + pointer: the pointer moved by the scalar.
                self.offset(i.src, src, dst, true)
            }
            (false, true) if o == op::OR && or_is_add(src, dst) => {
                self.offset(i.src, src, dst, true)
            }
            (false, true) => Err(Reject::PointerArithmetic {
                reg: i.src,
                what: format!(
                    "scalar {} {} (only pointer ± scalar and scalar + pointer are allowed)",
                    op_name(o),
                    name(&src)
                ),
            }),
            (true, false) if o == op::OR && or_is_add(dst, src) => {
                self.offset(i.dst, dst, src, true)
            }
            (true, false) => {
                if o != op::ADD && o != op::SUB {
                    return Err(Reject::PointerArithmetic {
                        reg: i.dst,
                        what: format!("{} on {}", op_name(o), name(&dst)),
                    });
                }
                self.offset(i.dst, dst, src, o == op::ADD)
            }
            (false, false) => unreachable!("checked by the caller"),
        }
    }

    /// Whether two pointers of type `ty` always point into the same object.
    pub(super) fn same_object(&self, ty: RegType) -> bool {
        match ty {
            RegType::Stack { .. } => true,
            RegType::MapValue { map } => self.maps[map as usize].global_data,
            _ => false,
        }
    }

    /// `ptr ± k`, where `ptr` is held in `preg`.
    fn offset(&self, preg: u8, ptr: Reg, k: Reg, add: bool) -> R<Reg> {
        match ptr.ty {
            RegType::MapValueOrNull { .. } => {
                return Err(Reject::PointerArithmetic {
                    reg: preg,
                    what: "on map_value_or_null: null-check it first".into(),
                });
            }
            RegType::MapPtr { .. } => {
                return Err(Reject::PointerArithmetic {
                    reg: preg,
                    what: "on a map pointer".into(),
                });
            }
            _ => {}
        }
        let mut r = ptr;
        if let Some(c) = k.v.const_value() {
            let c = c as i64;
            r.off = if add {
                ptr.off.checked_add(c)
            } else {
                ptr.off.checked_sub(c)
            }
            .filter(|v| v.abs() < MAX_OFF)
            .ok_or(Reject::PointerArithmetic {
                reg: preg,
                what: "offset out of range".into(),
            })?;
        } else {
            if k.v.smin < -MAX_OFF || k.v.smax > MAX_OFF {
                // An index with no proven bound: the access it feeds cannot be checked.
                return Err(Reject::UnboundedAccess { reg: preg });
            }
            r.v = if add {
                ptr.v.add(&k.v)
            } else {
                ptr.v.sub(&k.v)
            };
            if r.v.smin < -MAX_OFF || r.v.smax > MAX_OFF {
                return Err(Reject::UnboundedAccess { reg: preg });
            }
        }
        Ok(r)
    }
}

/// Whether `ptr | k` is `ptr + k`: `ptr` points into a stack frame at a constant offset that
/// is a multiple of 8 (no variable part) and `k` is within [0, 7]. Both engines keep every
/// frame pointer 8-aligned (the interpreter's frames are `u64` arrays, the JIT's `rbp` is
/// 16-aligned), so the pointer's low three bits are 0. clang emits this for `&buf[i]` into an
/// 8-aligned stack buffer when it knows `i < 8`.
fn or_is_add(ptr: Reg, k: Reg) -> bool {
    matches!(ptr.ty, RegType::Stack { .. })
        && ptr.v.const_value() == Some(0)
        && ptr.off.rem_euclid(8) == 0
        && k.ty == RegType::Scalar
        && k.v.umax <= 7
}

/// `sdiv`/`smod` (ISA v4) by a divisor proven non-zero; `INT_MIN / -1` is `INT_MIN` and
/// `INT_MIN % -1` is 0, as RFC 9669 defines them.
fn signed_div(a: &Scalar, b: &Scalar, is64: bool, div: bool) -> Scalar {
    if let (Some(x), Some(y)) = (a.const_value(), b.const_value()) {
        return Scalar::konst(if is64 {
            let (x, y) = (x as i64, y as i64);
            (if div {
                x.wrapping_div(y)
            } else {
                x.wrapping_rem(y)
            }) as u64
        } else {
            let (x, y) = (x as u32 as i32, y as u32 as i32);
            u64::from(
                (if div {
                    x.wrapping_div(y)
                } else {
                    x.wrapping_rem(y)
                }) as u32,
            )
        });
    }
    if is64 {
        Scalar::UNKNOWN
    } else {
        Scalar::unknown32()
    }
}
