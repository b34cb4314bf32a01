//! The locality rule: a tuner program (a hook that [`decides`](crate::platform::Hook::decides)
//! for the communicator) must decide the same on every rank, so nothing it writes to the
//! context may depend on a value that can differ between ranks.
//!
//! Rank-local values are tracked as a taint on registers and stack bytes
//! ([`crate::state::Taint`]): what is loaded from a [`Scope::Local`] map (written by net hooks,
//! per-CPU, `.data`/`.bss`, or simply not declared agreed or config), a lookup result in such
//! a map (whether the entry exists is this rank's own), and what helpers with rank-local results
//! return. In hooks the runtime runs without the communicator's views
//! ([`Hook::views`](crate::platform::Hook::views): `tuner/chunk`, `tuner/init`), maps whose
//! contents are per communicator ([`MapInfo::per_comm`](crate::platform::MapInfo::per_comm):
//! agreed maps, config maps other than `.rodata`) count as rank-local too
//! ([`Taint::NoView`]): the program reads whichever communicator's contents were installed
//! last. Taint flows through arithmetic, copies, the stack (spilled or as bytes), pointer
//! offsets, lookup keys and helper results.
//!
//! Dependence through control flow is tracked too: a conditional jump on a tainted value,
//! with both edges feasible, opens a [`Region`] in both successors that lasts until the jump's
//! immediate post-dominator in its function (computed here once per program), or until the
//! function returns when no instruction post-dominates it. Everything written inside a region
//! is tainted (the value differs with the edge taken, also after the paths meet), and a context
//! write inside one is rejected, as is a context write of a tainted value. A branch the verifier
//! decides one way for every value (only one edge feasible) does not depend on the value.
//!
//! The rule runs beside the instruction semantics: [`Checker::flow`] computes, from the state
//! before an instruction, what the instruction writes and with which taint (and rejects a
//! tainted decision); [`Checker::apply_flow`] stamps that on every state the instruction
//! produced. Net hooks do not decide: nothing is tracked there. A deciding hook's return value
//! is not a decision (the tuner ignores it), so `r0` at the program's exit is not checked.

use super::{Checker, Next, R};
use crate::error::Reject;
use crate::platform::{self, Perm, STACK_SIZE, Scope};
use crate::state::{RegType, Region, State, Taint, join};
use policy_object::insn::{self as op, Insn};

/// What one instruction writes, and with which taint.
#[derive(Default)]
pub(super) struct Flow {
    /// Registers of the current frame.
    regs: Vec<(u8, Option<Taint>)>,
    /// Stack slots: (frame, slot index, taint after the write).
    slots: Vec<(usize, usize, Option<Taint>)>,
    /// A conditional jump's condition, when tainted.
    branch: Option<Taint>,
}

/// The immediate post-dominator of every instruction within its function (`usize::MAX`: none
/// but the function's exit), for the conditional jumps' regions.
pub(super) fn post_dominators(
    insns: &[Insn],
    subprog_of: &[usize],
    second_half: &[bool],
) -> Vec<usize> {
    let n = insns.len();
    const EXIT: usize = usize::MAX;
    // Successors within the function; EXIT for exit.
    let succ = |pc: usize| -> Vec<usize> {
        let i = &insns[pc];
        let mut out = Vec::with_capacity(2);
        match i.class() {
            op::LD => out.push(pc + 2),
            op::JMP | op::JMP32 => match i.op() {
                op::EXIT => out.push(EXIT),
                op::CALL => out.push(pc + 1),
                op::JA => {
                    if let Some(t) = super::structure::jump_target(i, pc) {
                        out.push(t as usize);
                    }
                }
                _ => {
                    out.push(pc + 1);
                    if let Some(t) = super::structure::jump_target(i, pc) {
                        out.push(t as usize);
                    }
                }
            },
            _ => out.push(pc + 1),
        }
        out.retain(|&s| s == EXIT || (s < n && subprog_of.get(s) == subprog_of.get(pc)));
        out
    };
    let words = n.div_ceil(64) + 1;
    let exit_bit = n; // bit n stands for EXIT
    let full = vec![u64::MAX; words];
    let mut pdom: Vec<Vec<u64>> = vec![full; n];
    let set = |v: &mut Vec<u64>, b: usize| v[b / 64] |= 1 << (b % 64);
    let succs: Vec<Vec<usize>> = (0..n)
        .map(|pc| if second_half[pc] { vec![] } else { succ(pc) })
        .collect();
    let mut changed = true;
    while changed {
        changed = false;
        for pc in (0..n).rev() {
            if second_half[pc] {
                continue;
            }
            let mut acc: Option<Vec<u64>> = None;
            for &s in &succs[pc] {
                let sv = if s == EXIT {
                    let mut e = vec![0u64; words];
                    set(&mut e, exit_bit);
                    e
                } else {
                    pdom[s].clone()
                };
                acc = Some(match acc {
                    None => sv,
                    Some(a) => a.iter().zip(&sv).map(|(x, y)| x & y).collect(),
                });
            }
            let mut new = acc.unwrap_or_else(|| vec![u64::MAX; words]);
            set(&mut new, pc);
            if new != pdom[pc] {
                pdom[pc] = new;
                changed = true;
            }
        }
    }
    let count = |v: &[u64]| v.iter().map(|w| w.count_ones()).sum::<u32>();
    (0..n)
        .map(|pc| {
            if second_half[pc] {
                return EXIT;
            }
            // Post-dominators form a chain: the nearest has the most post-dominators itself.
            let mut best = EXIT;
            let mut best_n = 0;
            for d in 0..n {
                if d != pc && pdom[pc][d / 64] & (1 << (d % 64)) != 0 {
                    let c = count(&pdom[d]);
                    // An instruction that cannot reach the exit post-dominates everything; it
                    // is not a meeting point.
                    if c as usize <= n + 1 && c > best_n {
                        best = d;
                        best_n = c;
                    }
                }
            }
            best
        })
        .collect()
}

/// What the code between a conditional jump and its post-dominator may write: registers,
/// stack slots of the jump's frame addressed through `r10`, and whether it may write stack
/// anywhere else (through another pointer, or in a called subprogram).
///
/// All of it is rank-local after a jump on a rank-local value, on every edge: on the edge that
/// does not write a register, the register keeps its old value while the other edge changes
/// it, and which edge ran differs between ranks. Tainting only what each path writes would miss
/// that (`dst = &ctx->algo; if (local) dst = &scratch; *dst = 1;` writes the decision on some
/// ranks only).
#[derive(Clone, Copy, Default)]
pub(super) struct MayWrite {
    regs: u16,
    slots: u64,
    /// Registers that stores and atomics other than through `r10` use as their base.
    bases: u16,
    /// Whether it calls a subprogram (which may write its caller's stack).
    calls: bool,
}

impl MayWrite {
    /// Whether the code may write stack other than its `r10` slots, given the registers at the
    /// jump: a store's base that the code does not reassign keeps its type there, and a map
    /// value or the context is not stack.
    fn any_stack(&self, st: &State) -> bool {
        let f = st.cur();
        self.calls
            || (0..11).any(|r| {
                self.bases & (1 << r) != 0
                    && (self.regs & (1 << r) != 0
                        || !matches!(
                            f.regs[r].ty,
                            RegType::MapValue { .. }
                                | RegType::MapValueOrNull { .. }
                                | RegType::Ctx
                        ))
            })
    }

    fn taint(&self, st: &mut State, t: Taint) {
        let any_stack = self.any_stack(st);
        let frame = st.frames.len() - 1;
        st.frames.update_where(
            |k, _| any_stack || k == frame,
            |k, f| {
                if k == frame {
                    for r in 0..11 {
                        if self.regs & (1 << r) != 0 && f.regs[r].ty != RegType::NotInit {
                            f.regs[r].taint = join(f.regs[r].taint, Some(t));
                        }
                    }
                }
                f.stack.update_where(
                    |j, _| any_stack || (k == frame && self.slots & (1 << j) != 0),
                    |slot| {
                        slot.taint = join(slot.taint, Some(t));
                        if let Some(sp) = slot.spill.as_mut() {
                            sp.taint = join(sp.taint, Some(t));
                        }
                    },
                );
            },
        );
    }
}

impl Checker<'_> {
    /// [`MayWrite`] of the code reachable from the jump at `pc` before `end` (its
    /// post-dominator, `usize::MAX`: the function's exits), within its function.
    fn may_write(&self, pc: usize, end: usize) -> MayWrite {
        let n = self.insns.len();
        let func = self.layout.subprog_of.get(pc).copied();
        let mut w = MayWrite::default();
        let mut seen = vec![false; n];
        let mut todo: Vec<usize> = vec![];
        let push = |t: i64, todo: &mut Vec<usize>| {
            if t >= 0 && (t as usize) < n {
                todo.push(t as usize);
            }
        };
        let i = self.insns[pc];
        push(pc as i64 + 1, &mut todo);
        if let Some(t) = super::structure::jump_target(&i, pc) {
            push(t, &mut todo);
        }
        let reg = |w: &mut MayWrite, r: u8| w.regs |= 1 << (r & 15);
        while let Some(at) = todo.pop() {
            if at == end || seen[at] || self.layout.subprog_of.get(at).copied() != func {
                continue;
            }
            seen[at] = true;
            let i = self.insns[at];
            let mut next = Some(at as i64 + 1);
            match i.class() {
                op::ALU | op::ALU64 | op::LDX => reg(&mut w, i.dst),
                op::LD => {
                    reg(&mut w, i.dst);
                    next = Some(at as i64 + 2);
                }
                op::ST | op::STX => {
                    let lo = i64::from(i.off) + STACK_SIZE;
                    let hi = lo + i.access_size() as i64 - 1;
                    if i.dst == 10 && lo >= 0 && hi < STACK_SIZE {
                        for k in (lo / 8)..=(hi / 8) {
                            w.slots |= 1 << k;
                        }
                    } else if i.dst != 10 {
                        w.bases |= 1 << (i.dst & 15);
                    }
                    if i.class() == op::STX && i.mode() != op::MEM {
                        if i.imm == op::ATOMIC_CMPXCHG {
                            reg(&mut w, 0);
                        } else if i.imm & op::FETCH != 0 {
                            reg(&mut w, i.src);
                        }
                    }
                }
                _ => match i.op() {
                    op::EXIT => next = None,
                    op::CALL => {
                        // Helpers clobber r1-r5 (left uninitialized) and set r0; a subprogram
                        // may write its caller's stack through pointers it was given.
                        reg(&mut w, 0);
                        if super::structure::is_pseudo_call(&i) {
                            w.calls = true;
                        }
                    }
                    op::JA => next = super::structure::jump_target(&i, at),
                    _ => {
                        if let Some(t) = super::structure::jump_target(&i, at) {
                            push(t, &mut todo);
                        }
                    }
                },
            }
            if let Some(t) = next {
                push(t, &mut todo);
            }
        }
        w
    }

    /// The taint of what a map holds (its values, and whether an entry exists), for this
    /// hook: rank-local maps, and maps whose contents are per communicator where the runtime
    /// runs the program without the communicator's views ([`platform::Hook::views`]).
    fn local_map(&self, m: u16) -> Option<Taint> {
        let mi = &self.maps[m as usize];
        if mi.scope == Scope::Local {
            Some(Taint::Map(m))
        } else if mi.per_comm() && !self.hook.views {
            Some(Taint::NoView(m))
        } else {
            None
        }
    }

    /// The taint of `size` bytes read at `off` through `base` (before bounds checks: a read
    /// the memory check rejects does not matter).
    fn mem_taint(&self, st: &State, base: crate::state::Reg, off: i64, size: u32) -> Option<Taint> {
        let t = match base.ty {
            RegType::MapValue { map } | RegType::MapValueOrNull { map } => self.local_map(map),
            RegType::Stack { frame } => self.slots(base, off, size).and_then(|(lo, hi)| {
                st.frames
                    .get(frame as usize)?
                    .stack
                    .get(lo..=hi)?
                    .iter()
                    .fold(None, |a, s| join(a, s.read_taint()))
            }),
            RegType::Ctx => base.v.const_value().and_then(|c| {
                let start = u32::try_from(base.off + off + c as i64).ok()?;
                let f = self.hook.field_at(start)?;
                let &(name, why) = self.hook.local_fields.iter().find(|(n, _)| *n == f.name)?;
                Some(Taint::Field(name, why))
            }),
            _ => None,
        };
        join(base.taint, t)
    }

    /// The stack slots `size` bytes at `off` through a stack pointer may touch.
    fn slots(&self, base: crate::state::Reg, off: i64, size: u32) -> Option<(usize, usize)> {
        let lo = base.off + off + base.v.smin;
        let hi = base.off + off + base.v.smax + i64::from(size) - 1;
        if lo < -STACK_SIZE || hi >= 0 {
            return None;
        }
        Some((
            ((lo + STACK_SIZE) / 8) as usize,
            ((hi + STACK_SIZE) / 8) as usize,
        ))
    }

    /// A write of taint `t` through `base` at `off`: the stack slots it may change.
    fn slot_writes(
        &self,
        st: &State,
        base: crate::state::Reg,
        off: i64,
        size: u32,
        t: Option<Taint>,
        flow: &mut Flow,
    ) {
        let RegType::Stack { frame } = base.ty else {
            return;
        };
        let Some((first, last)) = self.slots(base, off, size) else {
            return;
        };
        let whole = first == last && size == 8 && base.v.const_value().is_some();
        for k in first..=last {
            let old = st
                .frames
                .get(frame as usize)
                .and_then(|f| f.stack.get(k))
                .and_then(|s| s.read_taint());
            // A whole-slot store replaces what was there; any other keeps the rest's taint.
            flow.slots
                .push((frame as usize, k, if whole { t } else { join(t, old) }));
        }
    }

    /// A tainted write to a writable context field of a deciding hook is rejected.
    fn check_decision(
        &self,
        st: &State,
        reg: Option<u8>,
        base: crate::state::Reg,
        off: i64,
        size: u32,
        t: Option<Taint>,
    ) -> R<()> {
        let Some(c) = base.v.const_value() else {
            return Ok(()); // rejected by the context check
        };
        let start = base.off + off + c as i64;
        let Ok(start) = u32::try_from(start) else {
            return Ok(());
        };
        let Some(field) = (start..start + size)
            .filter_map(|b| self.hook.field_at(b))
            .find(|f| f.perm == Perm::ReadWrite)
        else {
            return Ok(());
        };
        let from_control = st.regions.first();
        let taint = join(t, base.taint);
        match (taint, from_control) {
            (Some(t), _) => Err(Reject::RankLocal {
                reg,
                field: field.name,
                from: t.describe(self.maps),
                why: t.why(self.maps, self.hook),
                branch: None,
            }),
            (None, Some(r)) => Err(Reject::RankLocal {
                reg,
                field: field.name,
                from: r.taint.describe(self.maps),
                why: r.taint.why(self.maps, self.hook),
                branch: Some(r.branch),
            }),
            (None, None) => Ok(()),
        }
    }

    /// What instruction `pc` writes, and with which taint; rejects a rank-local decision.
    pub(super) fn flow(&self, pc: usize, st: &State) -> R<Flow> {
        let mut flow = Flow::default();
        let i = self.insns[pc];
        let regs = &st.cur().regs;
        let ctrl = st.control();
        let src_t = |i: &Insn| {
            if i.is_reg_src() {
                regs[i.src as usize].taint
            } else {
                None
            }
        };
        match i.class() {
            op::ALU | op::ALU64 => {
                let dst_t = if i.op() == op::MOV {
                    None
                } else {
                    regs[i.dst as usize].taint
                };
                // `neg` and the byte swaps read no source register (the swaps' source bit
                // is the byte order).
                let src = if matches!(i.op(), op::NEG | op::END) {
                    None
                } else {
                    src_t(&i)
                };
                flow.regs.push((i.dst, join(ctrl, join(src, dst_t))));
            }
            op::LD => flow.regs.push((i.dst, ctrl)),
            op::LDX => {
                let base = regs[i.src as usize];
                let t = self.mem_taint(st, base, i64::from(i.off), i.access_size() as u32);
                flow.regs.push((i.dst, join(ctrl, t)));
            }
            op::ST | op::STX => {
                let base = regs[i.dst as usize];
                let size = i.access_size() as u32;
                let off = i64::from(i.off);
                let v_t = if i.class() == op::STX {
                    regs[i.src as usize].taint
                } else {
                    None
                };
                if i.mode() == op::MEM {
                    let t = join(ctrl, join(v_t, base.taint));
                    if base.ty == RegType::Ctx {
                        let reg = (i.class() == op::STX).then_some(i.src);
                        self.check_decision(st, reg, base, off, size, v_t)?;
                    }
                    self.slot_writes(st, base, off, size, t, &mut flow);
                } else {
                    // An atomic: memory gets the operand's taint (and, for cmpxchg, the
                    // comparand's: whether it is written depends on r0), and a fetch returns
                    // memory's.
                    let old = self.mem_taint(st, base, off, size);
                    let cmp = if i.imm == op::ATOMIC_CMPXCHG {
                        regs[0].taint
                    } else {
                        None
                    };
                    let t = join(ctrl, join(v_t, join(old, cmp)));
                    self.slot_writes(st, base, off, size, t, &mut flow);
                    let fetched = join(ctrl, join(old, v_t));
                    if i.imm == op::ATOMIC_CMPXCHG {
                        flow.regs.push((0, fetched));
                    } else if i.imm & op::FETCH != 0 {
                        flow.regs.push((i.src, fetched));
                    }
                }
            }
            _ => match i.op() {
                op::CALL if !super::structure::is_pseudo_call(&i) => {
                    flow.regs
                        .push((0, join(ctrl, self.helper_taint(st, i.imm))));
                }
                op::CALL | op::EXIT | op::JA => {}
                _ => {
                    let a = regs[i.dst as usize].taint;
                    flow.branch = join(a, src_t(&i));
                }
            },
        }
        Ok(flow)
    }

    /// The taint of a helper's result: a lookup in a rank-local map, or with a rank-local key,
    /// or any result of a helper that is this rank's own.
    fn helper_taint(&self, st: &State, id: i32) -> Option<Taint> {
        let regs = &st.cur().regs;
        let Some(h) = platform::helper(id) else {
            return None; // rejected by the call check
        };
        if !matches!(
            id,
            platform::HELPER_MAP_LOOKUP | platform::HELPER_MAP_UPDATE | platform::HELPER_MAP_DELETE
        ) {
            return Some(Taint::Helper(id));
        }
        let mut t = None;
        let mut map = None;
        for (k, arg) in h.args.iter().enumerate() {
            let r = regs[k + 1];
            t = join(t, r.taint);
            match (arg, r.ty) {
                (platform::Arg::MapPtr, RegType::MapPtr { map: m }) => {
                    // Whether a lookup in an array finds an entry depends on the key alone
                    // (its values are still rank-local: loads through the result are tainted);
                    // in a hash map it depends on what this rank stored, as do the results of
                    // updates and deletes.
                    let array_lookup =
                        id == platform::HELPER_MAP_LOOKUP && self.maps[m as usize].array;
                    if !array_lookup {
                        t = join(t, self.local_map(m));
                    }
                    map = Some(m);
                }
                (platform::Arg::MapKey | platform::Arg::MapValue, _) => {
                    let Some(m) = map else { continue };
                    let mi = &self.maps[m as usize];
                    let need = if *arg == platform::Arg::MapKey {
                        mi.key_size
                    } else {
                        mi.value_size
                    };
                    t = join(t, self.mem_taint(st, r, 0, need));
                }
                _ => {}
            }
        }
        t
    }

    /// Stamps `flow` on the states instruction `pc` produced: the written registers and slots,
    /// and a region on both edges of a tainted branch.
    pub(super) fn apply_flow(
        &self,
        pc: usize,
        depth: usize,
        flow: &Flow,
        next: &mut Next,
        st: &mut State,
    ) {
        let apply = |s: &mut State| {
            // A call leaves the caller's frame below the callee's; an exit pops the callee's.
            if s.frames.len() == depth {
                let f = s.cur_mut();
                for &(r, t) in &flow.regs {
                    let reg = &mut f.regs[r as usize];
                    if reg.ty != RegType::NotInit {
                        reg.taint = t;
                    }
                }
            }
            for &(fr, k, t) in &flow.slots {
                if let Some(slot) = s.frames.get_mut(fr).and_then(|f| f.stack.get_mut(k)) {
                    slot.taint = t;
                    if let Some(sp) = slot.spill.as_mut() {
                        sp.taint = join(sp.taint, t);
                    }
                }
            }
            // Regions of frames that returned are over.
            let n = s.frames.len();
            s.regions.retain(|r| (r.frame as usize) < n);
        };
        let states: Vec<&mut State> = match next {
            Next::Go(_) | Next::Done => vec![st],
            Next::GoWith(_, s) => vec![s],
            Next::Branch { cont, other } => vec![&mut cont.1, &mut other.1],
        };
        // A conditional jump on a rank-local value opens a region on every edge it takes, also
        // when the verifier knows only one is possible here: that knowledge may come from this
        // path, which itself may depend on rank-local values (bounds an earlier rank-local
        // branch refined, a pointer a NULL check turned into a map value).
        let region = flow.branch.map(|t| Region {
            frame: (depth - 1) as u8,
            end: self.ipdom.get(pc).copied().unwrap_or(usize::MAX),
            branch: pc,
            taint: t,
        });
        let writes = region.map(|r| self.may_write(pc, r.end));
        for s in states {
            apply(s);
            if let (Some(region), Some(writes)) = (region, writes) {
                if !s
                    .regions
                    .iter()
                    .any(|r| (r.frame, r.end) == (region.frame, region.end))
                {
                    s.regions.push(region);
                }
                writes.taint(s, region.taint);
            }
        }
    }

    /// Closes the regions that end at `pc` in the current frame.
    pub(super) fn close_regions(pc: usize, st: &mut State) {
        if st.regions.is_empty() {
            return;
        }
        let f = st.frame_no();
        st.regions.retain(|r| !(r.frame == f && r.end == pc));
    }
}
