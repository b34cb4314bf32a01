//! Memory: `lddw`, loads, stores and atomics on the context, the stack and map values.
//!
//! The stack model: every byte is written or not; an aligned 8-byte store through `r10`
//! spills the register whole (kept with its type and value), and a pointer may be stored
//! only so (aligned, 8 bytes, a constant offset). A spilled pointer is never overwritten in
//! part, never read in part, never modified by an atomic and never handed to a helper as
//! bytes. A scalar stored through `r10` in 1, 2 or 4 naturally aligned bytes is a narrow spill
//! (its bytes' bounds, [`crate::state::Narrow`]): a fill of those bytes from where they start,
//! as wide or narrower, gets them back, as does a narrower fill of an 8-byte spilled scalar's
//! low bytes. Every other write leaves plain bytes whose value is unknown when read back.

use super::{Checker, R};
use crate::error::Reject;
use crate::platform::{MapInfo, Perm, STACK_SIZE};
use crate::scalar::Scalar;
use crate::state::{Narrow, Reg, RegType, State};
use policy_object::insn::{self as op, Insn};

#[derive(Clone, Copy)]
enum Access {
    Read { sext: bool },
    Write(Reg),
}

/// A stack byte range `[lo, hi + size)` as slot indices and byte offsets from the frame's
/// bottom.
fn slot_of(byte: i64) -> (usize, u32) {
    let b = byte + STACK_SIZE;
    ((b / 8) as usize, (b % 8) as u32)
}

impl Checker<'_> {
    pub(super) fn lddw(&self, st: &mut State, pc: usize, i: &Insn) {
        let r = match i.src {
            op::PSEUDO_MAP_FD => Reg::pointer(RegType::MapPtr { map: i.imm as u16 }, 0),
            op::PSEUDO_MAP_VALUE => Reg::pointer(
                RegType::MapValue { map: i.imm as u16 },
                i64::from(self.insns[pc + 1].imm),
            ),
            _ => {
                let v = (u64::from(self.insns[pc + 1].imm as u32) << 32) | u64::from(i.imm as u32);
                Reg::konst(v)
            }
        };
        Self::set(st, i.dst, r);
    }

    pub(super) fn load(&mut self, st: &mut State, i: &Insn) -> R<()> {
        let base = self.reg(st, i.src)?;
        let sext = i.mode() == op::MEMSX;
        let v = self.access(
            st,
            i.src,
            base,
            i64::from(i.off),
            i.access_size() as u32,
            Access::Read { sext },
        )?;
        Self::set(st, i.dst, v);
        Ok(())
    }

    pub(super) fn store(&mut self, st: &mut State, i: &Insn) -> R<()> {
        let base = self.reg(st, i.dst)?;
        let v = if i.class() == op::ST {
            Reg::konst(i.imm as i64 as u64)
        } else {
            self.reg(st, i.src)?
        };
        if v.ty.is_pointer() && i.access_size() != 8 {
            return Err(Reject::PointerLeak {
                reg: i.src,
                what: "partial store of a pointer".into(),
            });
        }
        self.access(
            st,
            i.dst,
            base,
            i64::from(i.off),
            i.access_size() as u32,
            Access::Write(v),
        )?;
        Ok(())
    }

    /// Checks a load or store through `base` (held in `breg`) and returns the loaded value.
    fn access(
        &self,
        st: &mut State,
        breg: u8,
        base: Reg,
        off: i64,
        size: u32,
        acc: Access,
    ) -> R<Reg> {
        let write_val = match acc {
            Access::Write(v) => Some(v),
            Access::Read { .. } => None,
        };
        let sext = matches!(acc, Access::Read { sext: true });
        match base.ty {
            RegType::Ctx => {
                if write_val.is_some_and(|v| v.ty.is_pointer()) {
                    return Err(Reject::PointerLeak {
                        reg: breg,
                        what: "pointer stored into the context".into(),
                    });
                }
                let Some(c) = base.v.const_value() else {
                    return Err(Reject::CtxVariableOffset { reg: breg });
                };
                let start = base.off + off + c as i64;
                let oob = Reject::CtxOutOfBounds {
                    reg: breg,
                    off: start,
                    size,
                    ctx_size: self.hook.ctx_size,
                };
                if start < 0 || start + i64::from(size) > i64::from(self.hook.ctx_size) {
                    return Err(oob);
                }
                // Naturally aligned, and either inside one field (a read may take part of
                // it) or exactly a run of whole adjacent fields (clang merges neighbouring
                // stores and loads); every field written must be writable.
                let end = start as u32 + size;
                let f0 = self.hook.field_at(start as u32).ok_or(oob.clone())?;
                let aligned = start % i64::from(size) == 0;
                let mut fields = vec![f0];
                if end > f0.offset + f0.size {
                    let mut b = f0.offset + f0.size;
                    while b < end {
                        let f = self.hook.field_at(b).ok_or(oob.clone())?;
                        if f.offset != b || f.offset + f.size > end {
                            return Err(oob);
                        }
                        fields.push(f);
                        b = f.offset + f.size;
                    }
                }
                let whole = start as u32 == f0.offset && end >= f0.offset + f0.size;
                if !aligned || (fields.len() > 1 && !whole) || (write_val.is_some() && !whole) {
                    return Err(oob);
                }
                if write_val.is_some()
                    && let Some(f) = fields.iter().find(|f| f.perm == Perm::Read)
                {
                    return Err(Reject::CtxReadOnly {
                        reg: breg,
                        field: f.name,
                        off: start,
                        size,
                    });
                }
                if write_val.is_some() {
                    return Ok(Reg::NOT_INIT);
                }
                let units =
                    (start as u32 / 4..end.div_ceil(4)).fold(0u128, |m, u| m | 1 << u.min(127));
                self.ctx_read.set(self.ctx_read.get() | units);
                Ok(Reg::scalar(loaded(size, sext)))
            }
            RegType::Stack { frame } => {
                let (lo, hi) = self.stack_range(breg, base, off, size)?;
                match write_val {
                    Some(v) => {
                        self.stack_write(st, breg, frame, lo, hi, size, v)?;
                        Ok(Reg::NOT_INIT)
                    }
                    None => self.stack_read(st, breg, frame, lo, hi, size, sext),
                }
            }
            RegType::MapValue { map } => {
                let m = &self.maps[map as usize];
                self.value_bounds(breg, m, base, off, size)?;
                if let Some(v) = write_val {
                    if !m.writable() {
                        return Err(Reject::MapReadOnly {
                            reg: breg,
                            map: m.name.clone(),
                            scope: m.scope,
                        });
                    }
                    if v.ty.is_pointer() {
                        return Err(Reject::PointerLeak {
                            reg: breg,
                            what: format!(
                                "pointer stored into map '{}' (maps are shared with other processes)",
                                m.name
                            ),
                        });
                    }
                    return Ok(Reg::NOT_INIT);
                }
                Ok(Reg::scalar(loaded(size, sext)))
            }
            RegType::MapValueOrNull { .. } => Err(Reject::NullDeref { reg: breg }),
            // A lookup result on the path where it was found to be NULL.
            RegType::Scalar if base.v.const_value() == Some(0) => {
                Err(Reject::NullDeref { reg: breg })
            }
            _ => Err(Reject::InvalidMemAccess {
                reg: breg,
                ty: base.type_name().into(),
            }),
        }
    }

    pub(super) fn value_bounds(
        &self,
        breg: u8,
        m: &MapInfo,
        base: Reg,
        off: i64,
        size: u32,
    ) -> R<()> {
        // The variable part is a signed offset: the access starts at off + [smin, smax].
        if base.v.smin < -(1 << 29) || base.v.smax > 1 << 29 {
            return Err(Reject::UnboundedAccess { reg: breg });
        }
        let lo = base.off + off + base.v.smin;
        let hi = base.off + off + base.v.smax;
        if lo < 0 || hi + i64::from(size) > i64::from(m.value_size) {
            return Err(Reject::MapOutOfBounds {
                reg: breg,
                map: m.name.clone(),
                min_off: lo,
                max_off: hi,
                size,
                value_size: m.value_size,
            });
        }
        Ok(())
    }

    /// The lowest and highest offsets (from the frame pointer) an access may start at.
    fn stack_range(&self, breg: u8, base: Reg, off: i64, size: u32) -> R<(i64, i64)> {
        if base.v.smin < -(1 << 29) || base.v.smax > 1 << 29 {
            return Err(Reject::UnboundedAccess { reg: breg });
        }
        let lo = base.off + off + base.v.smin;
        let hi = base.off + off + base.v.smax;
        if lo < -STACK_SIZE || hi + i64::from(size) > 0 {
            return Err(Reject::StackOutOfBounds {
                reg: breg,
                min_off: lo,
                max_off: hi,
                size,
            });
        }
        Ok((lo, hi))
    }

    #[allow(clippy::too_many_arguments)]
    fn stack_write(
        &self,
        st: &mut State,
        breg: u8,
        frame: u8,
        lo: i64,
        hi: i64,
        size: u32,
        v: Reg,
    ) -> R<()> {
        let aligned = lo == hi && size == 8 && (lo + STACK_SIZE) % 8 == 0;
        let stack = &mut st.frames[frame as usize].stack;
        if v.ty.is_pointer() {
            if !aligned {
                return Err(Reject::PointerLeak {
                    reg: breg,
                    what: format!(
                        "pointer stored at {}: a pointer may only be spilled whole to an \
                         8-byte-aligned constant stack offset",
                        if lo == hi {
                            format!("misaligned stack offset {lo}")
                        } else {
                            format!("variable stack offset {lo}..{hi}")
                        }
                    ),
                });
            }
            if let RegType::Stack { frame: f } = v.ty
                && f > frame
            {
                return Err(Reject::PointerLeak {
                    reg: breg,
                    what: "pointer to a callee's stack stored in a caller's frame".into(),
                });
            }
            stack[slot_of(lo).0].set_spill(v);
            return Ok(());
        }
        if aligned {
            // A whole slot: a spilled pointer there is replaced, not corrupted. Only a spill
            // through r10 keeps the value: pruning's liveness tracks values through the frame
            // pointer alone.
            let slot = &mut stack[slot_of(lo).0];
            if breg == 10 {
                slot.set_spill(v);
            } else {
                slot.init = 0xff;
                slot.clobber(0xff);
            }
            return Ok(());
        }
        // A scalar stored through r10 in 1, 2 or 4 naturally aligned bytes is a narrow spill:
        // its bytes' value is kept (see `Slot`).
        let narrow = breg == 10
            && v.ty == RegType::Scalar
            && lo == hi
            && size < 8
            && lo % i64::from(size) == 0;
        let end = hi + i64::from(size); // one past the last byte that may be written
        let (first, _) = slot_of(lo);
        let (last, _) = slot_of(end - 1);
        for (k, slot) in stack.iter_mut().enumerate().take(last + 1).skip(first) {
            if slot.spill.is_some_and(|r| r.ty.is_pointer()) {
                return Err(Reject::CorruptSpill {
                    off: k as i64 * 8 - STACK_SIZE,
                    what: if lo == hi {
                        format!("{size}-byte store into part of it")
                    } else {
                        "store at a variable offset that may hit it".into()
                    },
                });
            }
            if lo == hi {
                let mut written = 0u8;
                for b in 0..8u32 {
                    let byte = k as i64 * 8 + i64::from(b) - STACK_SIZE;
                    if byte >= lo && byte < end {
                        written |= 1 << b;
                    }
                }
                slot.init |= written;
                // A spill the store does not touch is still there.
                slot.clobber(written);
            } else {
                // A store at a variable offset writes some of these bytes: those already
                // written stay written (now of unknown value), the others may still be
                // unwritten.
                slot.clobber(0xff);
            }
        }
        if narrow {
            let (k, b) = slot_of(lo);
            let bytes = v.v.zext(8 * size);
            stack[k].set_narrow(Narrow {
                at: b as u8,
                size: size as u8,
                min: bytes.umin as u32,
                max: bytes.umax.min(u64::from(u32::MAX)) as u32,
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn stack_read(
        &self,
        st: &State,
        breg: u8,
        frame: u8,
        lo: i64,
        hi: i64,
        size: u32,
        sext: bool,
    ) -> R<Reg> {
        let stack = &st.frames[frame as usize].stack;
        if lo == hi {
            let (k, b) = slot_of(lo);
            let slot = stack[k];
            match slot.spill {
                Some(r) if size == 8 && b == 0 => {
                    // A spilled scalar's value is known only through r10 (see `stack_write`).
                    return Ok(if r.ty.is_pointer() || breg == 10 {
                        r
                    } else {
                        Reg {
                            taint: r.taint,
                            ..Reg::scalar(Scalar::UNKNOWN)
                        }
                    });
                }
                // A fill of a spilled scalar's low bytes (little-endian: from where the spill
                // starts), as wide as the spill or narrower: its value, zero-extended. Not for
                // sign-extending loads (pruning's liveness does not follow their values).
                Some(r) if breg == 10 && !sext && r.ty == RegType::Scalar && b == 0 => {
                    return Ok(Reg {
                        taint: r.taint,
                        ..Reg::scalar(r.v.zext(8 * size))
                    });
                }
                None if breg == 10 && !sext => {
                    if let Some(n) = slot.narrow[(b / 4) as usize & 1]
                        && u32::from(n.at) == b
                        && size <= u32::from(n.size)
                    {
                        return Ok(Reg::scalar(n.value().zext(8 * size)));
                    }
                }
                _ => {}
            }
        }
        self.stack_bytes(st, breg, frame, lo, hi + i64::from(size), size, false)?;
        Ok(Reg::scalar(loaded(size, sext)))
    }

    /// Checks that bytes `[lo, end)` of a frame were all written and (with `whole_ok`
    /// false) that none is part of a spilled pointer.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stack_bytes(
        &self,
        st: &State,
        breg: u8,
        frame: u8,
        lo: i64,
        end: i64,
        size: u32,
        helper: bool,
    ) -> R<()> {
        let stack = &st.frames[frame as usize].stack;
        for byte in lo..end {
            let (k, b) = slot_of(byte);
            let slot = &stack[k];
            if slot.init & (1 << b) == 0 {
                return Err(Reject::UninitStack {
                    reg: breg,
                    off: lo,
                    size,
                });
            }
            if slot.spill.is_some_and(|r| r.ty.is_pointer()) {
                return Err(Reject::PointerLeak {
                    reg: breg,
                    what: if helper {
                        format!(
                            "the buffer at fp{lo} holds a spilled pointer (fp{}): a helper \
                             would copy it into a map",
                            k as i64 * 8 - STACK_SIZE
                        )
                    } else {
                        "partial read of a spilled pointer".into()
                    },
                });
            }
        }
        Ok(())
    }

    /// Checks a helper's read of `need` bytes at a stack pointer.
    pub(super) fn stack_buffer(&self, st: &State, r: u8, ptr: Reg, need: u32) -> R<()> {
        let RegType::Stack { frame } = ptr.ty else {
            unreachable!("called for stack pointers")
        };
        let (lo, hi) = self.stack_range(r, ptr, 0, need)?;
        self.stack_bytes(st, r, frame, lo, hi + i64::from(need), need, true)
    }

    pub(super) fn atomic(&mut self, st: &mut State, i: &Insn) -> R<()> {
        let base = self.reg(st, i.dst)?;
        let src = self.reg(st, i.src)?;
        let size = i.access_size() as u32;
        // Atomics need natural alignment (map values and stack slots are 8-aligned).
        let fixed = base.off + i64::from(i.off);
        let var_bits = base.v.tn.value | base.v.tn.mask;
        if fixed % i64::from(size) != 0 || var_bits & (u64::from(size) - 1) != 0 {
            return Err(Reject::BadInsn {
                what: format!("misaligned {size}-byte atomic access (offset {fixed})"),
            });
        }
        match base.ty {
            RegType::MapValue { map } => {
                let m = &self.maps[map as usize];
                self.value_bounds(i.dst, m, base, i64::from(i.off), size)?;
                if !m.writable() {
                    return Err(Reject::MapReadOnly {
                        reg: i.dst,
                        map: m.name.clone(),
                        scope: m.scope,
                    });
                }
            }
            RegType::Stack { frame } => {
                let (lo, hi) = self.stack_range(i.dst, base, i64::from(i.off), size)?;
                if lo != hi {
                    return Err(Reject::BadInsn {
                        what: "atomic operation at a variable stack offset is not supported".into(),
                    });
                }
                // Read, then written with a value the verifier cannot know.
                let (k, _) = slot_of(lo);
                let slot = st.frames[frame as usize].stack[k];
                if slot.spill.is_some_and(|r| r.ty.is_pointer()) {
                    return Err(Reject::CorruptSpill {
                        off: lo,
                        what: "atomic operation on it".into(),
                    });
                }
                self.stack_bytes(st, i.dst, frame, lo, lo + i64::from(size), size, false)?;
                st.frames[frame as usize].stack[k].clobber(0xff);
            }
            RegType::MapValueOrNull { .. } => return Err(Reject::NullDeref { reg: i.dst }),
            _ => {
                return Err(Reject::InvalidMemAccess {
                    reg: i.dst,
                    ty: format!(
                        "{} (atomics work on map values and the stack)",
                        base.type_name()
                    ),
                });
            }
        }
        if src.ty.is_pointer() {
            return Err(Reject::PointerLeak {
                reg: i.src,
                what: "pointer used in an atomic operation".into(),
            });
        }
        if i.imm == op::ATOMIC_CMPXCHG {
            let r0 = self.reg(st, 0)?;
            if r0.ty.is_pointer() {
                return Err(Reject::PointerLeak {
                    reg: 0,
                    what: "pointer used in cmpxchg".into(),
                });
            }
        }
        let old = Reg::scalar(loaded(size, false));
        if i.imm == op::ATOMIC_CMPXCHG {
            Self::set(st, 0, old);
        } else if i.imm & op::FETCH != 0 {
            Self::set(st, i.src, old);
        }
        Ok(())
    }
}

/// The value a load of `size` bytes produces (sign-extended for `ldxs*`).
fn loaded(size: u32, sext: bool) -> Scalar {
    if sext && size < 8 {
        let half = 1i64 << (size * 8 - 1);
        return Scalar::srange(-half, half - 1);
    }
    match size {
        1 => Scalar::urange(0, 0xff),
        2 => Scalar::urange(0, 0xffff),
        4 => Scalar::unknown32(),
        _ => Scalar::UNKNOWN,
    }
}
