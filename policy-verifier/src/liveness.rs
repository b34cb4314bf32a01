//! Which registers and stack slots can still matter, computed once per program before
//! exploration, so that pruning compares only those.
//!
//! Two backward data-flow facts per instruction, taken *before* it runs:
//!
//! * **live**: the register or slot may be read (by any instruction, for any reason: a
//!   value stored, a pointer's type checked) on some path from here;
//! * **precise**: its *value* may reach a point where the verifier's verdict depends on it:
//!   a conditional jump (which edges are feasible, how bounds are refined), a divisor (the
//!   zero check), the scalar added to a pointer (the bounds of a later access), the return
//!   value of a subprogram whose caller needs it, and everything that flows into those.
//!
//! A state pruned against an explored one must match it on every live register and slot,
//! and on the value of every precise one; a live scalar that is not precise only has to be a
//! scalar. Values stored through a pointer that is not `r10` itself, or read back so, never
//! carry precision (the exploration stores them as plain bytes and loads them as unknown
//! scalars); such accesses make every slot of every frame live instead.

use crate::check::structure::{Layout, jump_target};
use crate::frames::Frames;
use crate::platform;
use policy_object::insn::{self as op, Insn};

/// The facts before one instruction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    pub live: u16,
    pub prec: u16,
    pub slots_live: u64,
    /// Per 4-byte half of a slot (bit `2k + h` for half `h` of slot `k`): a narrow spill
    /// beside a rewritten neighbour keeps its half precise while the other half's old
    /// contents stop mattering.
    pub slots_prec: u128,
    /// A stack read through a pointer other than `r10` may follow: every slot of every
    /// frame is live.
    pub any_live: bool,
}

impl Facts {
    fn join(&mut self, o: &Facts) {
        self.live |= o.live;
        self.prec |= o.prec;
        self.slots_live |= o.slots_live;
        self.slots_prec |= o.slots_prec;
        self.any_live |= o.any_live;
    }
}

/// What must match in one frame of a state being pruned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameMask {
    pub live: u16,
    pub prec: u16,
    pub slots_live: u64,
    /// Per 4-byte half (bit `2k + h` for half `h` of slot `k`).
    pub slots_prec: u128,
}

impl FrameMask {
    /// Everything matters (no liveness information).
    pub const ALL: FrameMask = FrameMask {
        live: 0x7ff,
        prec: 0x7ff,
        slots_live: u64::MAX,
        slots_prec: u128::MAX,
    };
}

const R0_5: u16 = 0x3f;
const R1_5: u16 = 0x3e;
const R6_10: u16 = 0x7c0;

fn bit(r: u8) -> u16 {
    1 << r
}

/// The stack slots bytes `[off, off + size)` below the frame pointer fall in.
fn slots(off: i64, size: usize) -> u64 {
    let lo = off + 512;
    let hi = lo + size as i64 - 1;
    if lo < 0 || hi >= 512 {
        return 0; // out of the stack: the access itself is rejected
    }
    let (a, b) = ((lo / 8) as u32, (hi / 8) as u32);
    let mut m = 0u64;
    for k in a..=b {
        m |= 1 << k;
    }
    m
}

/// The 4-byte halves of slots (bit `2k + h`) bytes `[off, off + size)` below the frame pointer
/// touch, and those they cover whole.
fn halves(off: i64, size: usize) -> (u128, u128) {
    let lo = off + 512;
    let hi = lo + size as i64 - 1;
    if lo < 0 || hi >= 512 {
        return (0, 0);
    }
    let (mut touched, mut covered) = (0u128, 0u128);
    for h in (lo / 4)..=(hi / 4) {
        touched |= 1 << h;
        if 4 * h >= lo && 4 * h + 3 <= hi {
            covered |= 1 << h;
        }
    }
    (touched, covered)
}

/// Whether a direct stack store replaces the slot whole (and so ends what it held).
fn whole_slot(off: i64, size: usize) -> bool {
    size == 8 && (off + 512) % 8 == 0
}

/// Which registers may hold a pointer before each instruction (a forward pass; with it, the
/// sum of two scalars does not make its operands precise the way `pointer + scalar` must).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Ptrs {
    /// May hold any pointer.
    ptr: u16,
    /// May hold a pointer into a stack.
    stk: u16,
    /// Slots (through r10) that may hold a spilled pointer.
    slots: u64,
    reached: bool,
}

impl Ptrs {
    fn join(&mut self, o: &Ptrs) -> bool {
        let before = *self;
        self.ptr |= o.ptr;
        self.stk |= o.stk;
        self.slots |= o.slots;
        self.reached |= o.reached;
        *self != before
    }
    fn clear(&mut self, r: u8) {
        self.ptr &= !bit(r);
        self.stk &= !bit(r);
    }
    fn maybe(&mut self, r: u8) {
        self.ptr |= bit(r);
        self.stk |= bit(r);
    }
}

fn may_be_pointer(insns: &[Insn], layout: &Layout) -> Vec<u16> {
    let n = insns.len();
    let mut at = vec![Ptrs::default(); n + 1];
    at[0] = Ptrs {
        ptr: bit(1) | bit(10),
        stk: bit(10),
        slots: 0,
        reached: true,
    };
    // Pointers stored through a pointer other than r10 can land in any slot of any frame;
    // pointers spilled anywhere can be read back through any stack pointer.
    let (mut wild, mut spilled) = (false, false);
    loop {
        let mut changed = false;
        for pc in 0..n {
            if layout.second_half[pc] || !at[pc].reached {
                continue;
            }
            let i = insns[pc];
            let mut f = at[pc];
            let (d, s) = (i.dst, i.src);
            let mut succ = [(usize::MAX, Ptrs::default()); 2];
            let mut nsucc = 0;
            let mut push = |(t, v): (usize, Ptrs)| {
                succ[nsucc] = (t, v);
                nsucc += 1;
            };
            let next = if i.is_lddw() { pc + 2 } else { pc + 1 };
            match i.class() {
                op::ALU64 if i.op() == op::MOV && i.is_reg_src() && i.off == 0 => {
                    f.clear(d);
                    f.ptr |= (at[pc].ptr >> s & 1) << d;
                    f.stk |= (at[pc].stk >> s & 1) << d;
                }
                op::ALU64 if matches!(i.op(), op::ADD | op::SUB) => {
                    if i.is_reg_src() && i.op() == op::ADD {
                        f.ptr |= (f.ptr >> s & 1) << d;
                        f.stk |= (f.stk >> s & 1) << d;
                    }
                }
                op::ALU | op::ALU64 => f.clear(d),
                op::LD => {
                    f.clear(d);
                    if i.src != 0 {
                        f.ptr |= bit(d);
                    }
                }
                op::LDX => {
                    let from_stack = at[pc].stk & bit(s) != 0;
                    f.clear(d);
                    if i.mode() == op::MEM {
                        let direct_ptr =
                            s == 10 && f.slots & slots(i64::from(i.off), i.access_size()) != 0;
                        if direct_ptr || wild || (s != 10 && from_stack && spilled) {
                            f.maybe(d);
                        }
                    }
                }
                op::ST | op::STX if i.mode() == op::MEM => {
                    let v_ptr = i.class() == op::STX && f.ptr & bit(s) != 0;
                    if d == 10 {
                        let m = slots(i64::from(i.off), i.access_size());
                        if whole_slot(i64::from(i.off), i.access_size()) {
                            f.slots &= !m;
                        }
                        if v_ptr {
                            f.slots |= m;
                            if !spilled {
                                spilled = true;
                                changed = true; // earlier loads may now read pointers
                            }
                        }
                    } else if v_ptr && !(wild && spilled) {
                        wild = true;
                        spilled = true;
                        changed = true;
                    }
                }
                op::STX => {
                    if i.imm == op::ATOMIC_CMPXCHG {
                        f.clear(0);
                    } else if i.imm & op::FETCH != 0 {
                        f.clear(s);
                    }
                }
                _ => match i.op() {
                    op::EXIT => {}
                    op::JA => {
                        if let Some(t) = jump_target(&i, pc) {
                            push((t as usize, f));
                        }
                    }
                    op::CALL if crate::check::structure::is_pseudo_call(&i) => {
                        let t = (pc as i64 + 1 + i64::from(i.imm)) as usize;
                        let entry = Ptrs {
                            ptr: (f.ptr & R1_5) | bit(10),
                            stk: (f.stk & R1_5) | bit(10),
                            slots: 0,
                            reached: true,
                        };
                        if t < n {
                            push((t, entry));
                        }
                        for r in 0..=5 {
                            f.clear(r);
                        }
                        push((next, f));
                    }
                    op::CALL => {
                        for r in 0..=5 {
                            f.clear(r);
                        }
                        if platform::helper(i.imm)
                            .is_some_and(|h| h.ret == platform::Ret::MapValueOrNull)
                        {
                            f.ptr |= bit(0);
                        }
                        push((next, f));
                    }
                    _ => {
                        push((next, f));
                        if let Some(t) = jump_target(&i, pc) {
                            push((t as usize, f));
                        }
                    }
                },
            }
            if !matches!(i.class(), op::JMP | op::JMP32) {
                push((next, f));
            }
            for &(t, v) in &succ[..nsucc] {
                if t <= n && at[t].join(&v) {
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    at.iter().map(|p| p.ptr).collect()
}

pub struct Liveness {
    at: Vec<Facts>,
}

impl Liveness {
    /// Runs the analysis to its fixed point over the whole program (subprograms included).
    pub fn compute(insns: &[Insn], layout: &Layout) -> Liveness {
        let n = insns.len();
        let mut at = vec![Facts::default(); n + 1];
        let mut ret_prec = vec![false; layout.subprog_starts.len()];
        let may_ptr = may_be_pointer(insns, layout);
        loop {
            let mut changed = false;
            for pc in (0..n).rev() {
                if layout.second_half[pc] {
                    continue;
                }
                let i = insns[pc];
                let next = if i.is_lddw() { pc + 2 } else { pc + 1 };
                let get = |p: usize| at.get(p).copied().unwrap_or_default();
                let mut out = Facts::default();
                let (class, o) = (i.class(), i.op());
                let is_jump = matches!(class, op::JMP | op::JMP32);
                if is_jump && o == op::EXIT {
                    // nothing follows inside the subprogram
                } else if is_jump && o == op::JA {
                    if let Some(t) = jump_target(&i, pc) {
                        out = get(t as usize);
                    }
                } else if is_jump && o != op::CALL {
                    out = get(next);
                    if let Some(t) = jump_target(&i, pc) {
                        out.join(&get(t as usize));
                    }
                } else {
                    out = get(next);
                }
                if crate::check::structure::is_pseudo_call(&i) {
                    let t = (pc as i64 + 1 + i64::from(i.imm)) as usize;
                    if t < n {
                        let k = layout.subprog_of[t];
                        if out.prec & bit(0) != 0 && !ret_prec[k] {
                            ret_prec[k] = true;
                            changed = true;
                        }
                    }
                }
                let f = transfer(&i, pc, out, &at, &ret_prec, layout, may_ptr[pc]);
                if f != at[pc] {
                    at[pc] = f;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        Liveness { at }
    }

    pub fn at(&self, pc: usize) -> Facts {
        self.at.get(pc).copied().unwrap_or_default()
    }

    /// The masks for each frame of a state at `pc` (frames listed outermost first).
    pub fn masks(&self, pc: usize, frames: &Frames) -> Vec<FrameMask> {
        let k = frames.len() - 1;
        // Frame j continues at the return point stored in frame j + 1.
        let cont = |j: usize| {
            if j == k {
                self.at(pc)
            } else {
                self.at(frames[j + 1].ret_pc)
            }
        };
        let mut out = vec![FrameMask::ALL; frames.len()];
        let mut any = false;
        for j in (0..=k).rev() {
            let f = cont(j);
            any |= f.any_live;
            let regs = if j == k { 0x7ff } else { R6_10 };
            out[j] = FrameMask {
                live: (f.live | bit(10)) & regs,
                prec: f.prec & regs,
                slots_live: if any { u64::MAX } else { f.slots_live },
                slots_prec: f.slots_prec,
            };
        }
        out
    }
}

fn transfer(
    i: &Insn,
    pc: usize,
    out: Facts,
    at: &[Facts],
    ret_prec: &[bool],
    layout: &Layout,
    may_ptr: u16,
) -> Facts {
    let (d, s) = (i.dst, i.src);
    let x = i.is_reg_src();
    let mut f = out;
    match i.class() {
        op::ALU | op::ALU64 => {
            let o = i.op();
            let mut uses = 0u16;
            if o != op::MOV {
                uses |= bit(d);
            }
            if x && !matches!(o, op::END | op::NEG) {
                uses |= bit(s);
            }
            let dst_live = out.live & bit(d) != 0;
            let dst_prec = out.prec & bit(d) != 0;
            f.live = (out.live & !bit(d)) | uses;
            f.prec = out.prec & !bit(d);
            if dst_prec {
                f.prec |= uses;
            }
            if x && matches!(o, op::DIV | op::MOD) {
                f.prec |= bit(s); // the zero check
            }
            if i.class() == op::ALU64
                && x
                && matches!(o, op::ADD | op::SUB)
                && dst_live
                && may_ptr & uses != 0
            {
                // One side may be a pointer whose offset the other moves.
                f.prec |= uses;
            }
        }
        op::LD => {
            f.live &= !bit(d);
            f.prec &= !bit(d);
        }
        op::LDX => {
            let dst_prec = out.prec & bit(d) != 0;
            f.live = (out.live & !bit(d)) | bit(s);
            f.prec = out.prec & !bit(d);
            if s == 10 && i.mode() != op::MEMSX {
                let m = slots(i64::from(i.off), i.access_size());
                f.slots_live |= m;
                if dst_prec {
                    f.slots_prec |= halves(i64::from(i.off), i.access_size()).0;
                }
            } else if s == 10 {
                f.slots_live |= slots(i64::from(i.off), i.access_size());
            } else {
                f.any_live = true;
            }
        }
        op::ST | op::STX => {
            let atomic = i.class() == op::STX && i.mode() == op::ATOMIC;
            let mut uses = bit(d);
            let mut defs = 0u16;
            if i.class() == op::STX {
                uses |= bit(s);
            }
            if atomic {
                if i.imm == op::ATOMIC_CMPXCHG {
                    uses |= bit(0);
                    defs |= bit(0);
                } else if i.imm & op::FETCH != 0 {
                    defs |= bit(s);
                }
            }
            f.live = (out.live & !defs) | uses;
            f.prec = out.prec & !defs;
            if d == 10 {
                let off = i64::from(i.off);
                let m = slots(off, i.access_size());
                let (touched, covered) = halves(off, i.access_size());
                if !atomic && whole_slot(off, i.access_size()) {
                    // A spill: the slot now holds the stored register (or constant).
                    if out.slots_prec & touched != 0 && i.class() == op::STX {
                        f.prec |= bit(s);
                    }
                    f.slots_live &= !m;
                    f.slots_prec &= !touched;
                } else if atomic {
                    // An atomic: what the slot held is checked (a spilled pointer may not be
                    // changed), what it holds after is unknown.
                    f.slots_live |= m;
                    f.slots_prec &= !touched;
                } else {
                    // Part of a slot: a narrow spill of the stored register (its value matters
                    // where the halves it touches do). The halves it covers whole held
                    // nothing that matters after; a narrow spill in the slot's other half
                    // stays (so that half stays precise where it was; a spilled pointer may
                    // not be overwritten in part: live).
                    if out.slots_prec & touched != 0 && i.class() == op::STX {
                        f.prec |= bit(s);
                    }
                    f.slots_live |= m;
                    f.slots_prec &= !covered;
                }
            } else {
                f.any_live = true;
            }
        }
        _ => match i.op() {
            op::JA => {}
            op::EXIT => {
                let k = layout.subprog_of[pc];
                f = Facts {
                    live: bit(0),
                    prec: if ret_prec[k] { bit(0) } else { 0 },
                    ..Facts::default()
                };
            }
            op::CALL if crate::check::structure::is_pseudo_call(i) => {
                let t = (pc as i64 + 1 + i64::from(i.imm)) as usize;
                let ce = at.get(t).copied().unwrap_or_default();
                f.live = (out.live & !R0_5) | (ce.live & R1_5);
                f.prec = (out.prec & !R0_5) | (ce.prec & R1_5);
                f.any_live |= ce.any_live;
            }
            op::CALL => {
                let h = platform::helper(i.imm);
                let nargs = h.map_or(5, |h| h.args.len());
                let uses = ((1u16 << nargs) - 1) << 1;
                f.live = (out.live & !R0_5) | uses;
                f.prec = out.prec & !R0_5;
                if h.is_none_or(|h| {
                    h.args
                        .iter()
                        .any(|a| matches!(a, platform::Arg::MapKey | platform::Arg::MapValue))
                }) {
                    f.any_live = true; // key and value buffers are read through pointers
                }
            }
            _ => {
                // A conditional jump: both operands decide the edges and their bounds.
                let mut uses = bit(d);
                if x {
                    uses |= bit(s);
                }
                f.live |= uses;
                f.prec |= uses;
            }
        },
    }
    f
}
