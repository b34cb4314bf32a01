//! What the code of a rank-local region may write ([`MayWrite`]): the registers of its frame
//! and the stack bytes of any frame, for the locality rule ([`super::locality`]).
//!
//! Everything such code may write is rank-local after a jump on a rank-local value, on every
//! edge: on the edge that does not write a register or a byte, it keeps its old value while the
//! other edge changes it, and which edge ran differs between ranks. Tainting only what each path
//! writes would miss that (`dst = &ctx->algo; if (local) dst = &scratch; *dst = 1;` writes the
//! decision on some ranks only).
//!
//! Where stores land is found by a small forward pass over the region's code, from the
//! registers at the jump: for each register, whether it may be a stack pointer and, if so, into
//! which frame at which offset ([`Base`]). A store through a lookup result, the context or a
//! scalar writes no stack; a store through `r10` or a stack pointer of a known offset writes
//! those bytes; one through a stack pointer of unknown offset writes its whole frame; one
//! through a register filled from the stack (which may hold a spilled stack pointer of any
//! frame) may write any byte of any frame. A called subprogram writes its caller's stacks only
//! through the pointers it is passed (stack pointers never reach maps or the context): a call
//! with no argument that may be a stack pointer writes none, any other may write every byte of
//! every frame. Helpers write no stack.

use super::{Checker, structure};
use crate::platform::STACK_SIZE;
use crate::state::{Reg, RegType, State, Taint, join};
use policy_object::insn::{self as op, Insn};
use std::collections::HashMap;

/// Stack bytes of one frame, one bit per byte (byte `k` from the frame's bottom, `fp-512`).
type Bytes = [u64; 8];

/// What a region may write (see the module's documentation).
#[derive(Clone, Default)]
pub(super) struct MayWrite {
    /// Registers of the jump's frame.
    regs: u16,
    /// Stack bytes, per frame (by frame number).
    bytes: Vec<Bytes>,
    /// Any byte of any frame.
    all: bool,
}

/// Whether a register may hold a stack pointer, and where into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    /// Not a stack pointer (a scalar, the context, a map pointer or value, uninitialized).
    NotStack,
    /// If a stack pointer, one into frame `.0` at offset `.1` from its frame pointer (`None`:
    /// anywhere in it).
    Frame(u8, Option<i64>),
    /// Possibly a stack pointer into any frame.
    Any,
}

impl Base {
    fn of(r: &Reg) -> Base {
        match r.ty {
            RegType::Stack { frame } => Base::Frame(
                frame,
                r.v.const_value().and_then(|c| r.off.checked_add(c as i64)),
            ),
            _ => Base::NotStack,
        }
    }

    fn join(self, o: Base) -> Base {
        match (self, o) {
            (a, b) if a == b => a,
            (Base::NotStack, x) | (x, Base::NotStack) => x,
            (Base::Frame(f, _), Base::Frame(g, _)) if f == g => Base::Frame(f, None),
            _ => Base::Any,
        }
    }

    fn may_stack(self) -> bool {
        self != Base::NotStack
    }

    /// Moved by an unknown amount.
    fn moved(self) -> Base {
        match self {
            Base::Frame(f, _) => Base::Frame(f, None),
            x => x,
        }
    }

    /// Moved by `k`.
    fn plus(self, k: i64) -> Base {
        match self {
            Base::Frame(f, Some(o)) => Base::Frame(f, o.checked_add(k)),
            x => x,
        }
    }
}

type Regs = [Base; 11];

impl MayWrite {
    fn bytes_of(&mut self, frame: u8) -> &mut Bytes {
        let f = usize::from(frame);
        if self.bytes.len() <= f {
            self.bytes.resize(f + 1, [0; 8]);
        }
        &mut self.bytes[f]
    }

    /// A store of `size` bytes at `off` through `base`.
    fn store(&mut self, base: Base, off: i64, size: u32) {
        match base {
            Base::NotStack => {}
            Base::Any => self.all = true,
            Base::Frame(f, None) => *self.bytes_of(f) = [u64::MAX; 8],
            Base::Frame(f, Some(o)) => {
                let lo = o.saturating_add(off).saturating_add(STACK_SIZE).max(0);
                let hi = o
                    .saturating_add(off)
                    .saturating_add(i64::from(size))
                    .saturating_add(STACK_SIZE)
                    .min(STACK_SIZE);
                let b = self.bytes_of(f);
                for k in lo..hi {
                    b[(k / 64) as usize] |= 1 << (k % 64);
                }
            }
        }
    }

    /// Taints, in `st`, everything written: registers of the current frame, stack bytes (and
    /// the spills over them) of every frame.
    pub(super) fn taint(&self, st: &mut State, t: Taint) {
        let frame = st.frames.len() - 1;
        // The stack bytes of frame `k` a store may have written, one bit per byte of slot `j`.
        let mask = |k: usize, j: usize| -> u8 {
            if self.all {
                0xff
            } else {
                self.bytes
                    .get(k)
                    .map_or(0, |b| (b[j / 8] >> ((j % 8) * 8)) as u8)
            }
        };
        let writes_stack =
            |k: usize| self.all || self.bytes.get(k).is_some_and(|b| b.iter().any(|&w| w != 0));
        // Frames and stack pieces nothing writes stay shared with the states that hold them
        // (crate::frames).
        st.frames.update_where(
            |k, _| k == frame || writes_stack(k),
            |k, f| {
                if k == frame {
                    for r in 0..11 {
                        if self.regs & (1 << r) != 0 && f.regs[r].ty != RegType::NotInit {
                            f.regs[r].taint = join(f.regs[r].taint, Some(t));
                        }
                    }
                }
                if !writes_stack(k) {
                    return;
                }
                f.stack.update(|j, slot| {
                    let m = mask(k, j);
                    if m == 0 {
                        return;
                    }
                    for (b, taint) in slot.taint.iter_mut().enumerate() {
                        if m & (1 << b) != 0 {
                            *taint = join(*taint, Some(t));
                        }
                    }
                    if m & slot.spill_mask() != 0
                        && let Some(sp) = slot.spill.as_mut()
                    {
                        sp.taint = join(sp.taint, Some(t));
                    }
                });
            },
        );
    }
}

impl Checker<'_> {
    /// [`MayWrite`] of the code reachable from the jump at `pc` before `end` (its
    /// post-dominator, `usize::MAX`: the function's exits), within its function, from the
    /// registers of `st` (the state at the jump).
    pub(super) fn may_write(&self, pc: usize, end: usize, st: &State) -> MayWrite {
        let n = self.insns.len();
        let func = self.layout.subprog_of.get(pc).copied();
        let mut w = MayWrite::default();
        let start: Regs = std::array::from_fn(|r| Base::of(&st.cur().regs[r]));
        let mut seen: HashMap<usize, Regs> = HashMap::new();
        let mut todo: Vec<(usize, Regs)> = vec![];
        let push = |t: i64, regs: Regs, todo: &mut Vec<(usize, Regs)>| {
            if t >= 0 && (t as usize) < n {
                todo.push((t as usize, regs));
            }
        };
        let i = self.insns[pc];
        push(pc as i64 + 1, start, &mut todo);
        if let Some(t) = structure::jump_target(&i, pc) {
            push(t, start, &mut todo);
        }
        while let Some((at, regs)) = todo.pop() {
            if at == end || self.layout.subprog_of.get(at).copied() != func {
                continue;
            }
            let regs = match seen.get(&at) {
                Some(old) => {
                    let joined: Regs = std::array::from_fn(|r| old[r].join(regs[r]));
                    if joined == *old {
                        continue;
                    }
                    joined
                }
                None => regs,
            };
            seen.insert(at, regs);
            let i = self.insns[at];
            let mut out = regs;
            let next = step(&i, at, &mut out, &mut w);
            for t in next.into_iter().flatten() {
                push(t, out, &mut todo);
            }
        }
        w
    }
}

/// One instruction of the pass: updates `regs` and `w`, returns the successors.
fn step(i: &Insn, at: usize, regs: &mut Regs, w: &mut MayWrite) -> [Option<i64>; 2] {
    let reg = |w: &mut MayWrite, r: u8| w.regs |= 1 << (r & 15);
    let get = |regs: &Regs, r: u8| regs.get(usize::from(r)).copied().unwrap_or(Base::Any);
    let set = |regs: &mut Regs, r: u8, b: Base| {
        if let Some(x) = regs.get_mut(usize::from(r)) {
            *x = b;
        }
    };
    let fall = Some(at as i64 + 1);
    match i.class() {
        op::ALU | op::ALU64 => {
            reg(w, i.dst);
            let d = get(regs, i.dst);
            let s = if i.is_reg_src() {
                get(regs, i.src)
            } else {
                Base::NotStack
            };
            let r = if i.class() == op::ALU {
                // 32-bit arithmetic or moves of a pointer are refused: a scalar.
                Base::NotStack
            } else {
                match i.op() {
                    op::MOV => s,
                    op::ADD | op::SUB if !i.is_reg_src() => {
                        let k = i64::from(i.imm);
                        d.plus(if i.op() == op::ADD {
                            k
                        } else {
                            k.wrapping_neg()
                        })
                    }
                    op::ADD | op::SUB => match (d, s) {
                        (d, Base::NotStack) => d.moved(),
                        (Base::NotStack, s) if i.op() == op::ADD => s.moved(),
                        _ => Base::Any,
                    },
                    _ if d.may_stack() || s.may_stack() => Base::Any,
                    _ => Base::NotStack,
                }
            };
            set(regs, i.dst, r);
            [fall, None]
        }
        op::LD => {
            reg(w, i.dst);
            set(regs, i.dst, Base::NotStack);
            [Some(at as i64 + 2), None]
        }
        op::LDX => {
            reg(w, i.dst);
            // Only eight bytes from the stack may be a spilled pointer (of any frame); the
            // context and map values hold no pointers.
            let b = if i.access_size() == 8 && get(regs, i.src).may_stack() {
                Base::Any
            } else {
                Base::NotStack
            };
            set(regs, i.dst, b);
            [fall, None]
        }
        op::ST | op::STX => {
            w.store(get(regs, i.dst), i64::from(i.off), i.access_size() as u32);
            if i.class() == op::STX && i.mode() != op::MEM {
                // Atomics fetch scalars (a spilled pointer is never their operand).
                if i.imm == op::ATOMIC_CMPXCHG {
                    reg(w, 0);
                    set(regs, 0, Base::NotStack);
                } else if i.imm & op::FETCH != 0 {
                    reg(w, i.src);
                    set(regs, i.src, Base::NotStack);
                }
            }
            [fall, None]
        }
        _ => match i.op() {
            op::EXIT => [None, None],
            op::CALL => {
                reg(w, 0);
                if structure::is_pseudo_call(i) {
                    // The callee reaches its callers' stacks only through its arguments.
                    if (1..=5).any(|r| get(regs, r).may_stack()) {
                        w.all = true;
                    }
                    set(regs, 0, Base::Any);
                } else {
                    // Helpers return scalars or map values, and write no stack.
                    set(regs, 0, Base::NotStack);
                }
                for r in 1..=5 {
                    set(regs, r, Base::NotStack);
                }
                [fall, None]
            }
            op::JA => [structure::jump_target(i, at), None],
            _ => [fall, structure::jump_target(i, at)],
        },
    }
}
