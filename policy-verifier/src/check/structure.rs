//! Pass 1: the program's shape, before any path is followed. Every instruction is one the
//! ISA defines with its reserved fields zero; jumps stay inside their subprogram and never
//! land in the middle of an `lddw`; subprograms start at call targets and end in `exit` or an
//! unconditional jump, so no path runs from one into the next.

use super::Checker;
use crate::error::{Reject, VerifyError};
use policy_object::insn::{self as op, Insn};

/// What the structural pass learnt about the program.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// First instruction of each subprogram, ascending (the main program starts at 0).
    pub subprog_starts: Vec<usize>,
    /// The subprogram index of every instruction.
    pub subprog_of: Vec<usize>,
    /// Instructions where states are compared and stored (jump targets, the instruction after
    /// a conditional jump, subprogram entries, return points).
    pub prune_point: Vec<bool>,
    /// Targets of backward jumps.
    pub loop_head: Vec<bool>,
    /// The second slot of an `lddw`.
    pub second_half: Vec<bool>,
}

/// Where an instruction transfers control, as far as the structure is concerned.
pub(crate) fn jump_target(i: &Insn, pc: usize) -> Option<i64> {
    match (i.class(), i.op()) {
        (op::JMP, op::CALL) | (op::JMP, op::EXIT) => None,
        (op::JMP32, op::JA) => Some(pc as i64 + 1 + i64::from(i.imm)),
        (op::JMP | op::JMP32, _) => Some(pc as i64 + 1 + i64::from(i.off)),
        _ => None,
    }
}

/// Whether `i` is a BPF-to-BPF call (the exact encoding: `call` with the K bit, src 1).
pub(crate) fn is_pseudo_call(i: &Insn) -> bool {
    i.code == op::JMP | op::CALL | op::K && i.src == op::PSEUDO_CALL
}

/// Whether `i` ends a path inside its subprogram (control never reaches `pc + 1` from it).
fn ends_block(i: &Insn) -> bool {
    matches!(
        (i.class(), i.op()),
        (op::JMP, op::EXIT) | (op::JMP, op::JA) | (op::JMP32, op::JA)
    )
}

impl Checker<'_> {
    pub(super) fn structure(&mut self) -> Result<(), VerifyError> {
        let n = self.insns.len();
        let bad = |what: &str| Reject::BadInsn {
            what: what.to_string(),
        };
        if n == 0 {
            return Err(self.err(0, None, bad("empty program")));
        }
        if n > self.limits.max_insns {
            return Err(self.err(
                0,
                None,
                Reject::TooLarge {
                    insns: n,
                    limit: self.limits.max_insns,
                },
            ));
        }
        let mut lay = Layout {
            subprog_starts: vec![0],
            subprog_of: vec![0; n],
            prune_point: vec![false; n + 1],
            loop_head: vec![false; n + 1],
            second_half: vec![false; n + 1],
        };
        let mut pc = 0;
        while pc < n {
            let i = self.insns[pc];
            self.insn_fields(pc, &i)?;
            if i.is_lddw() {
                self.lddw_fields(pc)?;
                lay.second_half[pc + 1] = true;
                pc += 2;
                continue;
            }
            if is_pseudo_call(&i) {
                let t = pc as i64 + 1 + i64::from(i.imm);
                self.check_target(pc, t)?;
                lay.subprog_starts.push(t as usize);
            }
            pc += 1;
        }
        lay.subprog_starts.sort_unstable();
        lay.subprog_starts.dedup();
        for (k, &s) in lay.subprog_starts.iter().enumerate() {
            let end = lay.subprog_starts.get(k + 1).copied().unwrap_or(n);
            lay.subprog_of[s..end].fill(k);
            if lay.second_half[s] {
                return Err(self.err(s - 1, None, Reject::JumpIntoLddw { target: s - 1 }));
            }
            // The last instruction must not fall through into the next subprogram (or off
            // the end).
            let last = if lay.second_half[end - 1] {
                end - 2
            } else {
                end - 1
            };
            if !ends_block(&self.insns[last]) {
                if end == n {
                    // The last instruction of the program could run past its end.
                    return Err(self.err(last, None, Reject::FallOffEnd));
                }
                let what = format!(
                    "subprogram at insn {s} falls through into the subprogram at insn {end}: \
                     it must end in exit or an unconditional jump"
                );
                return Err(self.err(last, None, Reject::BadSubprog { what }));
            }
        }
        for s in lay.subprog_starts.iter().skip(1) {
            lay.prune_point[*s] = true;
        }
        self.no_recursion(&lay)?;
        for (pc, i) in self.insns.iter().enumerate() {
            if lay.second_half[pc] {
                continue;
            }
            if is_pseudo_call(i) {
                lay.prune_point[pc + 1] = true;
            }
            let Some(t) = jump_target(i, pc) else {
                continue;
            };
            self.check_target(pc, t)?;
            let t = t as usize;
            if lay.second_half[t] {
                return Err(self.err(pc, None, Reject::JumpIntoLddw { target: t - 1 }));
            }
            if lay.subprog_of[t] != lay.subprog_of[pc] {
                return Err(self.err(
                    pc,
                    None,
                    Reject::BadSubprog {
                        what: format!(
                            "jump from insn {pc} to insn {t} leaves its subprogram (insns {}..)",
                            lay.subprog_starts[lay.subprog_of[pc]]
                        ),
                    },
                ));
            }
            lay.prune_point[t] = true;
            if !ends_block(i) {
                // The fall-through of a conditional jump: both edges meet states there.
                lay.prune_point[pc + 1] = true;
            }
            if t <= pc {
                lay.loop_head[t] = true;
            }
        }
        self.layout = lay;
        Ok(())
    }

    /// The call graph between subprograms has no cycle (as the kernel requires: the stack
    /// each call chain needs is then bounded by the program, and the entry is never re-entered).
    fn no_recursion(&self, lay: &Layout) -> Result<(), VerifyError> {
        let k = lay.subprog_starts.len();
        let mut calls: Vec<Vec<(usize, usize)>> = vec![vec![]; k];
        for (pc, i) in self.insns.iter().enumerate() {
            if !lay.second_half[pc] && is_pseudo_call(i) {
                let t = (pc as i64 + 1 + i64::from(i.imm)) as usize;
                calls[lay.subprog_of[pc]].push((pc, lay.subprog_of[t]));
            }
        }
        // Depth-first search from every subprogram; 1 = on the current path, 2 = done.
        let mut mark = vec![0u8; k];
        fn visit(n: usize, calls: &[Vec<(usize, usize)>], mark: &mut [u8]) -> Option<usize> {
            mark[n] = 1;
            for &(pc, t) in &calls[n] {
                if mark[t] == 1 {
                    return Some(pc);
                }
                if mark[t] == 0
                    && let Some(pc) = visit(t, calls, mark)
                {
                    return Some(pc);
                }
            }
            mark[n] = 2;
            None
        }
        for n in 0..k {
            if mark[n] == 0
                && let Some(pc) = visit(n, &calls, &mut mark)
            {
                return Err(self.err(
                    pc,
                    None,
                    Reject::BadSubprog {
                        what: "recursive call: subprograms may not call themselves, directly or through others".into(),
                    },
                ));
            }
        }
        Ok(())
    }

    pub(super) fn check_target(&self, pc: usize, t: i64) -> Result<(), VerifyError> {
        if t < 0 || t as usize >= self.insns.len() {
            return Err(self.err(pc, None, Reject::JumpOutOfRange { target: t }));
        }
        Ok(())
    }

    fn lddw_fields(&self, pc: usize) -> Result<(), VerifyError> {
        let bad = |what: &str| Reject::BadInsn {
            what: what.to_string(),
        };
        // The two halves' encoding was checked by `insn_fields`.
        let i = self.insns[pc];
        let next = self.insns[pc + 1];
        match i.src {
            0 => {}
            op::PSEUDO_MAP_FD | op::PSEUDO_MAP_VALUE => {
                let m = i64::from(i.imm);
                if m < 0 || m as usize >= self.maps.len() {
                    return Err(self.err(pc, None, Reject::BadMapRef { index: m }));
                }
                if i.src == op::PSEUDO_MAP_FD && next.imm != 0 {
                    return Err(self.err(
                        pc,
                        None,
                        bad("map reference with a nonzero upper immediate"),
                    ));
                }
                if i.src == op::PSEUDO_MAP_VALUE {
                    if !self.maps[m as usize].global_data {
                        return Err(self.err(
                            pc,
                            None,
                            bad("direct map value reference (lddw src 2) to a map that is not global data"),
                        ));
                    }
                    let off = i64::from(next.imm);
                    let vs = i64::from(self.maps[m as usize].value_size);
                    if !(0..vs).contains(&off) {
                        return Err(self.err(pc, None, bad("map value offset outside the value")));
                    }
                }
            }
            _ => return Err(self.err(pc, None, bad("unsupported pseudo source in lddw"))),
        }
        Ok(())
    }

    /// One instruction's encoding: a defined RFC 9669 encoding with its reserved fields zero
    /// (`policy_object::insn::encoding_error`, which the JIT applies too), and what the
    /// verifier adds: r10 is never written, no constant zero divisor, shifts by an immediate
    /// within the width, no kfunc calls (`lddw` sources: `lddw_fields`).
    fn insn_fields(&self, pc: usize, i: &Insn) -> Result<(), VerifyError> {
        let fail = |what: String| Err(self.err(pc, None, Reject::BadInsn { what }));
        if i.src > 10 || i.dst > 10 {
            return fail("register number above r10".into());
        }
        if let Some(why) = op::encoding_error(i, self.insns.get(pc + 1)) {
            return fail(format!(
                "{why} (code={:#04x} dst=r{} src=r{} off={} imm={})",
                i.code, i.dst, i.src, i.off, i.imm
            ));
        }
        let writes_dst = matches!(i.class(), op::ALU | op::ALU64 | op::LDX | op::LD);
        if writes_dst && i.dst == 10 {
            return fail("frame pointer r10 is read only".into());
        }
        match i.class() {
            op::ALU | op::ALU64 => {
                let o = i.op();
                if matches!(o, op::DIV | op::MOD) && !i.is_reg_src() && i.imm == 0 {
                    return Err(self.err(pc, None, Reject::DivByZero { reg: None }));
                }
                let bits = if i.class() == op::ALU64 { 64 } else { 32 };
                if matches!(o, op::LSH | op::RSH | op::ARSH)
                    && !i.is_reg_src()
                    && !(0..bits).contains(&i.imm)
                {
                    return fail("shift by an immediate out of range".into());
                }
            }
            op::JMP if i.op() == op::CALL && i.src == op::PSEUDO_KFUNC_CALL => {
                return fail("calls of kernel functions (kfuncs) are not supported".into());
            }
            _ => {}
        }
        Ok(())
    }
}
