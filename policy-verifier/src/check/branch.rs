//! Conditional jumps: whether the abstract values decide the edge, and what each feasible
//! edge learns about its operands (64-bit compares refine the 64-bit bounds, JMP32 compares
//! the low-32-bit ones; both then tighten each other). Pointer compares: NULL checks of
//! lookup results, and equality with a pointer known to be valid.

use super::{Checker, Next, R};
use crate::error::Reject;
use crate::scalar::{Scalar, Tnum};
use crate::state::{Reg, RegType, Slot, State};
use policy_object::insn::{self as op, Insn};

/// A scalar seen at one width: the 64-bit bounds, or the low-32-bit ones.
#[derive(Clone, Copy, Debug)]
struct View {
    tn: Tnum,
    umin: u64,
    umax: u64,
    smin: i64,
    smax: i64,
    is32: bool,
}

impl View {
    fn of(s: &Scalar, is32: bool) -> View {
        if is32 {
            View {
                tn: s.tn.cast32(),
                umin: u64::from(s.u32min),
                umax: u64::from(s.u32max),
                smin: i64::from(s.s32min),
                smax: i64::from(s.s32max),
                is32,
            }
        } else {
            View {
                tn: s.tn,
                umin: s.umin,
                umax: s.umax,
                smin: s.smin,
                smax: s.smax,
                is32,
            }
        }
    }

    fn umax_lim(&self) -> u64 {
        if self.is32 { u32::MAX as u64 } else { u64::MAX }
    }
    fn smin_lim(&self) -> i64 {
        if self.is32 {
            i64::from(i32::MIN)
        } else {
            i64::MIN
        }
    }
    fn smax_lim(&self) -> i64 {
        if self.is32 {
            i64::from(i32::MAX)
        } else {
            i64::MAX
        }
    }

    fn konst(&self) -> Option<u64> {
        self.tn.is_const().then_some(self.tn.value)
    }

    fn empty(&mut self) {
        self.umin = 1;
        self.umax = 0;
    }

    /// `s` with this view's knowledge written back into its width.
    fn apply(&self, s: &Scalar) -> Scalar {
        if self.umin > self.umax || self.smin > self.smax {
            return Scalar::EMPTY;
        }
        let r = if self.is32 {
            Scalar {
                tn: Tnum {
                    value: (s.tn.value & !0xffff_ffff) | self.tn.value,
                    mask: (s.tn.mask & !0xffff_ffff) | self.tn.mask,
                },
                u32min: self.umin as u32,
                u32max: self.umax as u32,
                s32min: self.smin as i32,
                s32max: self.smax as i32,
                ..*s
            }
        } else {
            Scalar {
                tn: self.tn,
                umin: self.umin,
                umax: self.umax,
                smin: self.smin,
                smax: self.smax,
                ..*s
            }
        };
        r.synced()
    }
}

impl Checker<'_> {
    pub(super) fn cond_jump(&mut self, pc: usize, st: &mut State, i: &Insn) -> R<Next> {
        let is32 = i.class() == op::JMP32;
        let target = (pc as i64 + 1 + i64::from(i.off)) as usize;
        let a = self.reg(st, i.dst)?;
        let b = if i.is_reg_src() {
            self.reg(st, i.src)?
        } else if is32 {
            Reg::konst(u64::from(i.imm as u32))
        } else {
            Reg::konst(i.imm as i64 as u64)
        };
        let o = i.op();
        if a.ty.is_pointer() || b.ty.is_pointer() {
            return self.pointer_jump(pc, st, i, a, b, target);
        }
        let (av, bv) = (View::of(&a.v, is32), View::of(&b.v, is32));
        if let Some(t) = decide(o, &av, &bv) {
            return Ok(self.decided(pc, st, target, t));
        }
        let src_reg = i.is_reg_src().then_some(i.src);
        let edge = |taken: bool| -> (Scalar, Scalar) {
            if !is32 && matches!((o, taken), (op::JEQ, true) | (op::JNE, false)) {
                let m = a.v.intersect(&b.v);
                return (m, m);
            }
            let (x, y) = refine(o, av, bv, taken);
            (x.apply(&a.v), y.apply(&b.v))
        };
        let (ta, tb) = edge(true);
        let (fa, fb) = edge(false);
        let mut taken = st.clone();
        let mut fall = st.clone();
        let t_ok = set_refined(&mut taken, i.dst, a, ta, src_reg, b, tb);
        let f_ok = set_refined(&mut fall, i.dst, a, fa, src_reg, b, fb);
        Ok(match (t_ok, f_ok) {
            (true, true) => self.both_or_merged(pc, target, taken, fall),
            (true, false) => self.decided_with(pc, taken, target, true),
            (false, true) => self.decided_with(pc, fall, target, false),
            (false, false) => Next::Done,
        })
    }

    fn pointer_jump(
        &mut self,
        pc: usize,
        st: &mut State,
        i: &Insn,
        a: Reg,
        b: Reg,
        target: usize,
    ) -> R<Next> {
        let o = i.op();
        let zero = |r: &Reg| r.ty == RegType::Scalar && r.v.const_value() == Some(0);
        let (ptr, preg) = if a.ty.is_pointer() {
            (a, i.dst)
        } else {
            (b, i.src)
        };
        let other = if a.ty.is_pointer() { b } else { a };
        if i.class() == op::JMP32 {
            return Err(Reject::PointerArithmetic {
                reg: preg,
                what: "32-bit comparison of a pointer".into(),
            });
        }
        // `jset` tests bits of the address itself (where the stack or a map lies), never just
        // where two pointers are relative to each other.
        if o == op::JSET {
            return Err(Reject::PointerArithmetic {
                reg: preg,
                what: format!(
                    "bit test (jset) on {}: it reads the address",
                    ptr.type_name()
                ),
            });
        }
        let eq_ne = matches!(o, op::JEQ | op::JNE);
        if zero(&other) && eq_ne {
            if let RegType::MapValueOrNull { map } = ptr.ty {
                let mut null = st.clone();
                let mut nonnull = st.clone();
                mark_ptr(&mut null, ptr.id, None);
                mark_ptr(&mut nonnull, ptr.id, Some(map));
                let (taken, fall) = if o == op::JEQ {
                    (null, nonnull)
                } else {
                    (nonnull, null)
                };
                return Ok(self.both(pc, target, taken, fall));
            }
            // A pointer that is never NULL.
            return Ok(self.decided(pc, st, target, o == op::JNE));
        }
        if a.ty.is_pointer() && b.ty.is_pointer() {
            let nullable = |r: &Reg| matches!(r.ty, RegType::MapValueOrNull { .. });
            if eq_ne && nullable(&a) != nullable(&b) {
                // Equal to a pointer that is valid: not NULL either.
                let (maybe, _) = if nullable(&a) { (a, b) } else { (b, a) };
                let RegType::MapValueOrNull { map } = maybe.ty else {
                    unreachable!()
                };
                let mut equal = st.clone();
                mark_ptr(&mut equal, maybe.id, Some(map));
                let (taken, fall) = if o == op::JEQ {
                    (equal, st.clone())
                } else {
                    (st.clone(), equal)
                };
                return Ok(self.both(pc, target, taken, fall));
            }
            // Equality says nothing about where objects are; an order does, unless both
            // point into one object.
            if a.ty == b.ty && (eq_ne || self.same_object(a.ty)) {
                return Ok(self.both(pc, target, st.clone(), st.clone()));
            }
        }
        Err(Reject::PointerArithmetic {
            reg: preg,
            what: format!("comparison of {} with {}", a.type_name(), b.type_name()),
        })
    }

    /// Both edges of a forward jump over straight-line code (`if (n > 64) n = 64;`): run the
    /// fall-through to the target now, and when the two states then differ only in one value
    /// whose union is exact, go on with one state instead of two.
    fn both_or_merged(&mut self, pc: usize, target: usize, taken: State, fall: State) -> Next {
        let straight = target > pc + 1
            && target - pc <= 16
            && self.insns[pc + 1..target].iter().enumerate().all(|(k, i)| {
                !matches!(i.class(), op::JMP | op::JMP32) || self.layout.second_half[pc + 1 + k]
            });
        // In a hook that decides, every instruction goes through the locality rule (`flow`),
        // which this shortcut would skip: there both edges are explored as they are.
        if !straight || self.hook.decides {
            return self.both(pc, target, taken, fall);
        }
        let mut f = fall.clone();
        let mut at = pc + 1;
        while at < target {
            match self.step(at, &mut f) {
                Ok(Next::Go(n)) => at = n,
                // An error there is reported by the ordinary exploration of the edge.
                _ => return self.both(pc, target, taken, fall),
            }
        }
        self.stats.processed += target - pc - 1;
        match taken.merge_exact(&f) {
            Some(mut m) => {
                m.note_branch(pc, target);
                Next::GoWith(target, m)
            }
            None => self.both(pc, target, taken, fall),
        }
    }

    fn decided(&self, pc: usize, st: &mut State, target: usize, taken: bool) -> Next {
        if taken {
            st.note_branch(pc, target);
            Next::Go(target)
        } else {
            Next::Go(pc + 1)
        }
    }

    fn decided_with(&self, pc: usize, mut st: State, target: usize, taken: bool) -> Next {
        if taken {
            st.note_branch(pc, target);
            Next::GoWith(target, st)
        } else {
            Next::GoWith(pc + 1, st)
        }
    }

    /// Both edges are feasible: follow the fall-through now, the jump later.
    fn both(&self, pc: usize, target: usize, mut taken: State, fall: State) -> Next {
        taken.note_branch(pc, target);
        Next::Branch {
            cont: (pc + 1, fall),
            other: (target, taken),
        }
    }
}

/// Turns every copy of lookup result `id` into a map value (`Some(map)`) or the scalar 0.
fn mark_ptr(st: &mut State, id: u32, map: Option<u16>) {
    let conv = |r: &mut Reg| {
        if matches!(r.ty, RegType::MapValueOrNull { .. }) && r.id == id {
            *r = match map {
                Some(m) => Reg {
                    ty: RegType::MapValue { map: m },
                    off: r.off,
                    v: r.v,
                    id: 0,
                    taint: r.taint,
                },
                None => Reg {
                    taint: r.taint,
                    ..Reg::konst(0)
                },
            };
        }
    };
    let hit = |r: &Reg| matches!(r.ty, RegType::MapValueOrNull { .. }) && r.id == id;
    let slot_hit = |s: &Slot| s.spill.as_ref().is_some_and(hit);
    st.frames.update_where(
        |_, f| f.regs.iter().any(hit) || f.stack.iter().any(slot_hit),
        |_, f| {
            f.regs.iter_mut().for_each(conv);
            f.stack.update_where(
                |_, s| slot_hit(s),
                |s| {
                    if let Some(r) = s.spill.as_mut() {
                        conv(r);
                    }
                },
            );
        },
    );
}

/// Whether a comparison is decided by the abstract values: `Some(taken)`.
fn decide(o: u8, a: &View, b: &View) -> Option<bool> {
    match o {
        op::JEQ | op::JNE => {
            let eq = if let (Some(x), Some(y)) = (a.konst(), b.konst()) {
                Some(x == y)
            } else if a.umax < b.umin
                || b.umax < a.umin
                || a.smax < b.smin
                || b.smax < a.smin
                || (a.tn.value ^ b.tn.value) & !(a.tn.mask | b.tn.mask) != 0
            {
                // Disjoint ranges, or a known bit that differs.
                Some(false)
            } else {
                None
            };
            eq.map(|e| if o == op::JEQ { e } else { !e })
        }
        op::JGT => cmp(a.umin > b.umax, a.umax <= b.umin),
        op::JGE => cmp(a.umin >= b.umax, a.umax < b.umin),
        op::JLT => cmp(a.umax < b.umin, a.umin >= b.umax),
        op::JLE => cmp(a.umax <= b.umin, a.umin > b.umax),
        op::JSGT => cmp(a.smin > b.smax, a.smax <= b.smin),
        op::JSGE => cmp(a.smin >= b.smax, a.smax < b.smin),
        op::JSLT => cmp(a.smax < b.smin, a.smin >= b.smax),
        op::JSLE => cmp(a.smax <= b.smin, a.smin > b.smax),
        op::JSET => {
            let b = b.konst()?;
            if a.tn.value & b != 0 {
                Some(true)
            } else if (a.tn.value | a.tn.mask) & b == 0 {
                Some(false)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn cmp(always: bool, never: bool) -> Option<bool> {
    if always {
        Some(true)
    } else if never {
        Some(false)
    } else {
        None
    }
}

/// The operands' views on one edge of a comparison (`taken` or not).
fn refine(o: u8, a: View, b: View, taken: bool) -> (View, View) {
    let (mut a, mut b) = (a, b);
    // Normalize to one of: eq, ne, ugt, uge, sgt, sge, set, nset, with swapped operands.
    let (kind, swap) = match (o, taken) {
        (op::JEQ, true) | (op::JNE, false) => ("eq", false),
        (op::JEQ, false) | (op::JNE, true) => ("ne", false),
        (op::JGT, true) | (op::JLE, false) => ("ugt", false),
        (op::JGE, true) | (op::JLT, false) => ("uge", false),
        (op::JLT, true) | (op::JGE, false) => ("ugt", true),
        (op::JLE, true) | (op::JGT, false) => ("uge", true),
        (op::JSGT, true) | (op::JSLE, false) => ("sgt", false),
        (op::JSGE, true) | (op::JSLT, false) => ("sge", false),
        (op::JSLT, true) | (op::JSGE, false) => ("sgt", true),
        (op::JSLE, true) | (op::JSGT, false) => ("sge", true),
        (op::JSET, true) => ("set", false),
        (op::JSET, false) => ("nset", false),
        _ => return (a, b),
    };
    let (x, y) = if swap {
        (&mut b, &mut a)
    } else {
        (&mut a, &mut b)
    };
    match kind {
        "eq" => {
            if (x.tn.value ^ y.tn.value) & !(x.tn.mask | y.tn.mask) != 0 {
                x.empty();
                y.empty();
            } else {
                let m = View {
                    tn: x.tn.intersect(y.tn),
                    umin: x.umin.max(y.umin),
                    umax: x.umax.min(y.umax),
                    smin: x.smin.max(y.smin),
                    smax: x.smax.min(y.smax),
                    is32: x.is32,
                };
                *x = m;
                *y = m;
            }
        }
        "ne" => {
            let (xv, yv) = (*x, *y);
            if let Some(c) = yv.konst() {
                exclude(x, c);
            }
            if let Some(c) = xv.konst() {
                exclude(y, c);
            }
        }
        "ugt" => {
            // x > y
            if y.umin == x.umax_lim() {
                x.empty();
            } else {
                x.umin = x.umin.max(y.umin + 1);
            }
            if x.umax == 0 {
                y.empty();
            } else {
                y.umax = y.umax.min(x.umax - 1);
            }
        }
        "uge" => {
            x.umin = x.umin.max(y.umin);
            y.umax = y.umax.min(x.umax);
        }
        "sgt" => {
            if y.smin == x.smax_lim() {
                x.empty();
            } else {
                x.smin = x.smin.max(y.smin + 1);
            }
            if x.smax == x.smin_lim() {
                y.empty();
            } else {
                y.smax = y.smax.min(x.smax - 1);
            }
        }
        "sge" => {
            x.smin = x.smin.max(y.smin);
            y.smax = y.smax.min(x.smax);
        }
        "set" => {
            if let Some(c) = y.konst()
                && c.is_power_of_two()
            {
                x.tn.value |= c;
                x.tn.mask &= !c;
            }
        }
        "nset" => {
            if let Some(c) = y.konst() {
                x.tn.value &= !c;
                x.tn.mask &= !c;
            }
        }
        _ => {}
    }
    (a, b)
}

/// `p` without the value `c` (only its ends can move).
fn exclude(p: &mut View, c: u64) {
    if p.konst() == Some(c) {
        p.empty();
        return;
    }
    let sc = if p.is32 {
        i64::from(c as u32 as i32)
    } else {
        c as i64
    };
    let (umax_lim, smin_lim, smax_lim) = (p.umax_lim(), p.smin_lim(), p.smax_lim());
    if p.umin == c && c < umax_lim {
        p.umin += 1;
    }
    if p.umax == c && c > 0 {
        p.umax -= 1;
    }
    if p.smin == sc && sc < smax_lim {
        p.smin += 1;
    }
    if p.smax == sc && sc > smin_lim {
        p.smax -= 1;
    }
}

/// Writes refined values into the state (and into every linked copy). False if infeasible.
fn set_refined(
    st: &mut State,
    dreg: u8,
    a: Reg,
    av: Scalar,
    sreg: Option<u8>,
    b: Reg,
    bv: Scalar,
) -> bool {
    if !av.is_valid() || !bv.is_valid() {
        return false;
    }
    let mut set = |reg: u8, old: Reg, v: Scalar| {
        let f = st.cur_mut();
        f.regs[reg as usize] = Reg { v, ..old };
        if old.id != 0 {
            let hit = |r: &Reg| r.ty == RegType::Scalar && r.id == old.id;
            let slot_hit = |s: &Slot| s.spill.as_ref().is_some_and(hit);
            st.frames.update_where(
                |_, fr| fr.regs.iter().any(hit) || fr.stack.iter().any(slot_hit),
                |_, fr| {
                    for r in fr.regs.iter_mut() {
                        if hit(r) {
                            r.v = v;
                        }
                    }
                    fr.stack.update_where(
                        |_, s| slot_hit(s),
                        |s| {
                            if let Some(r) = s.spill.as_mut() {
                                r.v = v;
                            }
                        },
                    );
                },
            );
        }
    };
    set(dreg, a, av);
    if let Some(s) = sreg {
        set(s, b, bv);
    }
    true
}
