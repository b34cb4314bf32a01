//! The interpreter: the portable tier (hosts other than x86-64, or `NCCL_BPF_JIT=0`), and,
//! with memory checking on, the oracle that proves verified programs stay inside their
//! context, stack and map values, read only stack bytes they wrote, and let no host address
//! escape.
//!
//! It runs the whole RFC 9669 instruction set except `callx` and kfunc calls (which fault).
//! Opcodes it does not know fault with [`Fault::BadInsn`]; fields an instruction does not
//! use are ignored here (the JIT and [`crate::raw`] reject them before running).

use crate::helpers::{self, HelperFn};
use policy_object::insn::{self as op, Insn};
use std::fmt;

const STACK: usize = 512;
/// Frames a checked run may nest (the verifier allows far fewer).
const MAX_FRAMES: usize = 64;

/// Memory a checked run may touch: `[start, start + len)` ranges.
#[derive(Clone, Debug, Default)]
pub struct Regions(pub Vec<(usize, usize)>);

impl Regions {
    fn allows(&self, addr: usize, size: usize) -> bool {
        self.0.iter().any(|&(s, l)| {
            addr >= s
                && addr
                    .checked_add(size)
                    .is_some_and(|e| s.checked_add(l).is_some_and(|end| e <= end))
        })
    }
}

/// What a checked run checks. Bounds (every access inside the regions or a live stack) and
/// the step limit always; the rest as switched here ([`Checked::new`] turns everything on).
#[derive(Clone, Copy, Debug)]
pub struct Checked<'a> {
    pub regions: &'a Regions,
    pub max_steps: u64,
    /// A read of a stack byte that its frame never wrote is [`Fault::UninitStackRead`].
    pub uninit_stack: bool,
    /// An 8-byte value stored outside the stacks, or returned from the program, that lies
    /// in `[start, start + len]` of a region or a live stack is [`Fault::PointerEscape`].
    pub pointer_escape: bool,
}

impl<'a> Checked<'a> {
    pub fn new(regions: &'a Regions, max_steps: u64) -> Checked<'a> {
        Checked {
            regions,
            max_steps,
            uninit_stack: true,
            pointer_escape: true,
        }
    }
}

/// A checked run touched memory outside its regions, read uninitialized stack, leaked an
/// address, or ran too long; or an instruction could not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    OutOfBounds {
        pc: usize,
        addr: usize,
        size: usize,
        write: bool,
    },
    TooManySteps {
        steps: u64,
    },
    BadInsn {
        pc: usize,
    },
    /// `size` bytes at `off` from the owning frame's r10, some never written in that frame.
    UninitStackRead {
        pc: usize,
        off: i64,
        size: usize,
    },
    /// `value`, an address inside a region or a live stack, was stored outside the stacks
    /// (at `pc`) or returned (the top-level `exit` at `pc`).
    PointerEscape {
        pc: usize,
        value: u64,
    },
    /// A BPF-to-BPF call nested deeper than a checked run allows.
    CallDepth {
        pc: usize,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::OutOfBounds {
                pc,
                addr,
                size,
                write,
            } => {
                let what = if *write { "write" } else { "read" };
                write!(
                    f,
                    "insn {pc}: {what} of {size} bytes at {addr:#x} outside the context, stack and map values"
                )
            }
            Fault::TooManySteps { steps } => write!(f, "no exit after {steps} instructions"),
            Fault::BadInsn { pc } => write!(f, "insn {pc}: cannot execute"),
            Fault::UninitStackRead { pc, off, size } => write!(
                f,
                "insn {pc}: read of {size} bytes at fp{off:+} that were never written"
            ),
            Fault::PointerEscape { pc, value } => write!(
                f,
                "insn {pc}: host address {value:#x} stored outside the stack or returned"
            ),
            Fault::CallDepth { pc } => {
                write!(f, "insn {pc}: calls nested deeper than {MAX_FRAMES} frames")
            }
        }
    }
}

struct Frame {
    saved: [u64; 4],
    ret_pc: usize,
    stack: Box<[u64; STACK / 8]>,
    /// Bit `b` set: stack byte `b` (from the low end) was written in this frame.
    init: [u64; STACK / 64],
}

impl Frame {
    fn new(saved: [u64; 4], ret_pc: usize) -> Frame {
        Frame {
            saved,
            ret_pc,
            stack: Box::new([0; STACK / 8]),
            init: [0; STACK / 64],
        }
    }
    fn lo(&self) -> usize {
        self.stack.as_ptr() as usize
    }
    fn top(&self) -> u64 {
        (self.lo() + STACK) as u64
    }
}

/// Runs `insns` (map references resolved to addresses) on `ctx`. With `check`, every memory
/// access must fall in the regions (plus the live stacks), at most `max_steps` run, stack
/// reads must be of bytes written before, and no host address may escape (all of
/// [`Checked::new`]).
pub fn run(insns: &[Insn], ctx: *mut u8, check: Option<(&Regions, u64)>) -> Result<u64, Fault> {
    let c = check.map(|(r, m)| Checked::new(r, m));
    run_with(insns, ctx as u64, 0, c.as_ref(), &helpers::by_id)
}

/// Runs `insns` with `r1` and `r2` as given, the checks of `check`, and the helpers `helper`
/// finds (a call to an id it has no helper for is [`Fault::BadInsn`]).
pub fn run_with(
    insns: &[Insn],
    r1: u64,
    r2: u64,
    check: Option<&Checked>,
    helper: &dyn Fn(i32) -> Option<HelperFn>,
) -> Result<u64, Fault> {
    let mut m = Machine {
        reg: [0; 11],
        frames: vec![Frame::new([0; 4], 0)],
        check,
        pc: 0,
    };
    m.reg[1] = r1;
    m.reg[2] = r2;
    m.reg[10] = m.frames[0].top();
    m.run(insns, helper)
}

struct Machine<'c, 'r> {
    reg: [u64; 11],
    frames: Vec<Frame>,
    check: Option<&'c Checked<'r>>,
    pc: usize,
}

/// What an access does to memory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Machine<'_, '_> {
    fn bad(&self) -> Fault {
        Fault::BadInsn { pc: self.pc }
    }

    /// Checks an access (in a checked run); returns whether it is on a stack.
    fn access(&mut self, addr: u64, size: usize, kind: Access) -> Result<bool, Fault> {
        let Some(c) = self.check else {
            return Ok(false);
        };
        let pc = self.pc;
        let a = addr as usize;
        for f in &mut self.frames {
            let lo = f.lo();
            if a >= lo && a.checked_add(size).is_some_and(|e| e <= lo + STACK) {
                let first = a - lo;
                let bit = |b: usize| (b / 64, 1u64 << (b % 64));
                if kind != Access::Write && c.uninit_stack {
                    let written = (first..first + size).all(|b| {
                        let (w, m) = bit(b);
                        f.init[w] & m != 0
                    });
                    if !written {
                        return Err(Fault::UninitStackRead {
                            pc,
                            off: first as i64 - STACK as i64,
                            size,
                        });
                    }
                }
                if kind != Access::Read {
                    for b in first..first + size {
                        let (w, m) = bit(b);
                        f.init[w] |= m;
                    }
                }
                return Ok(true);
            }
        }
        if !c.regions.allows(a, size) {
            return Err(Fault::OutOfBounds {
                pc,
                addr: a,
                size,
                write: kind != Access::Read,
            });
        }
        Ok(false)
    }

    /// In a checked run with the escape check on: whether `v` points into (or just past) a
    /// region or a live stack.
    fn is_host_address(&self, v: u64) -> bool {
        let Some(c) = self.check.filter(|c| c.pointer_escape) else {
            return false;
        };
        let within =
            |s: usize, l: usize| (s as u64) <= v && v <= (s as u64).saturating_add(l as u64);
        c.regions.0.iter().any(|&(s, l)| within(s, l))
            || self.frames.iter().any(|f| within(f.lo(), STACK))
    }

    /// After a store of `size` bytes at `addr` (not on a stack): faults when it left a host
    /// address in memory.
    fn check_escape(&self, addr: u64, size: usize) -> Result<(), Fault> {
        if size == 8 && self.check.is_some_and(|c| c.pointer_escape) {
            // SAFETY: the access was just checked against the regions and performed.
            let v = unsafe { (addr as *const u64).read_unaligned() };
            if self.is_host_address(v) {
                return Err(Fault::PointerEscape {
                    pc: self.pc,
                    value: v,
                });
            }
        }
        Ok(())
    }

    fn src_reg(&self, i: &Insn) -> Result<u64, Fault> {
        self.reg.get(i.src as usize).copied().ok_or(self.bad())
    }

    fn run(
        &mut self,
        insns: &[Insn],
        helper: &dyn Fn(i32) -> Option<HelperFn>,
    ) -> Result<u64, Fault> {
        let mut steps = 0u64;
        loop {
            steps += 1;
            if let Some(c) = self.check
                && steps > c.max_steps
            {
                return Err(Fault::TooManySteps { steps });
            }
            let i = *insns.get(self.pc).ok_or(self.bad())?;
            let d = i.dst as usize;
            if d > 10 {
                return Err(self.bad());
            }
            match i.class() {
                op::ALU | op::ALU64 => {
                    if d == 10 {
                        return Err(self.bad());
                    }
                    let is64 = i.class() == op::ALU64;
                    let uses_src = i.is_reg_src() && !matches!(i.op(), op::END | op::NEG);
                    let b = if uses_src {
                        self.src_reg(&i)?
                    } else if is64 {
                        i.imm as i64 as u64
                    } else {
                        u64::from(i.imm as u32)
                    };
                    self.reg[d] = alu(&i, self.reg[d], b).ok_or(self.bad())?;
                    self.pc += 1;
                }
                op::LD => {
                    // Only lddw with a plain immediate (map references are resolved first).
                    if !i.is_lddw() || i.src != 0 || d == 10 {
                        return Err(self.bad());
                    }
                    let hi = insns.get(self.pc + 1).ok_or(self.bad())?.imm as u32;
                    self.reg[d] = (u64::from(hi) << 32) | u64::from(i.imm as u32);
                    self.pc += 2;
                }
                op::LDX => {
                    let signed = match i.mode() {
                        op::MEM => false,
                        op::MEMSX if i.size_bits() != op::DW => true,
                        _ => return Err(self.bad()),
                    };
                    if d == 10 {
                        return Err(self.bad());
                    }
                    let addr = self.src_reg(&i)?.wrapping_add(i.off as i64 as u64);
                    let size = i.access_size();
                    self.access(addr, size, Access::Read)?;
                    // SAFETY: the verifier proved the access in bounds (and a checked run
                    // confirmed it against the regions above).
                    self.reg[d] = unsafe {
                        match (size, signed) {
                            (1, false) => u64::from((addr as *const u8).read_unaligned()),
                            (2, false) => u64::from((addr as *const u16).read_unaligned()),
                            (4, false) => u64::from((addr as *const u32).read_unaligned()),
                            (1, true) => (addr as *const i8).read_unaligned() as i64 as u64,
                            (2, true) => (addr as *const i16).read_unaligned() as i64 as u64,
                            (4, true) => (addr as *const i32).read_unaligned() as i64 as u64,
                            _ => (addr as *const u64).read_unaligned(),
                        }
                    };
                    self.pc += 1;
                }
                op::ST | op::STX if i.mode() == op::MEM => {
                    let addr = self.reg[d].wrapping_add(i.off as i64 as u64);
                    let v = if i.class() == op::ST {
                        i.imm as i64 as u64
                    } else {
                        self.src_reg(&i)?
                    };
                    let size = i.access_size();
                    let on_stack = self.access(addr, size, Access::Write)?;
                    // SAFETY: as for loads.
                    unsafe {
                        match size {
                            1 => (addr as *mut u8).write_unaligned(v as u8),
                            2 => (addr as *mut u16).write_unaligned(v as u16),
                            4 => (addr as *mut u32).write_unaligned(v as u32),
                            _ => (addr as *mut u64).write_unaligned(v),
                        }
                    }
                    if !on_stack {
                        self.check_escape(addr, size)?;
                    }
                    self.pc += 1;
                }
                op::STX if i.mode() == op::ATOMIC => {
                    let size = match i.size_bits() {
                        op::W => 4,
                        op::DW => 8,
                        _ => return Err(self.bad()),
                    };
                    let s = i.src as usize;
                    let writes_src = i.imm & op::FETCH != 0 && i.imm != op::ATOMIC_CMPXCHG;
                    if s > 10 || (writes_src && s == 10) {
                        return Err(self.bad());
                    }
                    let addr = self.reg[d].wrapping_add(i.off as i64 as u64);
                    let on_stack = self.access(addr, size, Access::ReadWrite)?;
                    atomic(&i, addr, &mut self.reg, size == 8).ok_or(self.bad())?;
                    if !on_stack {
                        self.check_escape(addr, size)?;
                    }
                    self.pc += 1;
                }
                op::ST | op::STX => return Err(self.bad()),
                _ => {
                    if let Some(r0) = self.jump(&i, helper)? {
                        return Ok(r0);
                    }
                }
            }
        }
    }
}

impl Machine<'_, '_> {
    /// Runs a JMP/JMP32 instruction; `Some(r0)` when the program exited.
    fn jump(
        &mut self,
        i: &Insn,
        helper: &dyn Fn(i32) -> Option<HelperFn>,
    ) -> Result<Option<u64>, Fault> {
        let is64 = i.class() == op::JMP;
        let target = |off: i64| (self.pc as i64).wrapping_add(1).wrapping_add(off) as usize;
        match i.op() {
            op::JA => {
                self.pc = target(if is64 {
                    i64::from(i.off)
                } else {
                    i64::from(i.imm)
                });
            }
            op::EXIT if is64 => match self.frames.pop() {
                Some(f) if !self.frames.is_empty() => {
                    self.reg[6..10].copy_from_slice(&f.saved);
                    self.reg[10] = self.frames.last().expect("caller").top();
                    self.pc = f.ret_pc;
                }
                Some(f) => {
                    // Keep the stack alive for the escape check of r0.
                    self.frames.push(f);
                    if self.is_host_address(self.reg[0]) {
                        return Err(Fault::PointerEscape {
                            pc: self.pc,
                            value: self.reg[0],
                        });
                    }
                    return Ok(Some(self.reg[0]));
                }
                None => return Err(self.bad()),
            },
            op::CALL if is64 && !i.is_reg_src() && i.src == op::PSEUDO_CALL => {
                if self.check.is_some() && self.frames.len() >= MAX_FRAMES {
                    return Err(Fault::CallDepth { pc: self.pc });
                }
                let r = &self.reg;
                let f = Frame::new([r[6], r[7], r[8], r[9]], self.pc + 1);
                self.reg[10] = f.top();
                self.frames.push(f);
                self.pc = target(i64::from(i.imm));
            }
            op::CALL if is64 && !i.is_reg_src() && i.src == 0 => {
                let h = helper(i.imm).ok_or(self.bad())?;
                let r = &self.reg;
                self.reg[0] = h(r[1], r[2], r[3], r[4], r[5]);
                self.pc += 1;
            }
            o => {
                let b = if i.is_reg_src() {
                    self.src_reg(i)?
                } else if is64 {
                    i.imm as i64 as u64
                } else {
                    u64::from(i.imm as u32)
                };
                let (a, b, sa, sb) = operands(is64, self.reg[i.dst as usize], b);
                let taken = match o {
                    op::JEQ => a == b,
                    op::JNE => a != b,
                    op::JGT => a > b,
                    op::JGE => a >= b,
                    op::JLT => a < b,
                    op::JLE => a <= b,
                    op::JSGT => sa > sb,
                    op::JSGE => sa >= sb,
                    op::JSLT => sa < sb,
                    op::JSLE => sa <= sb,
                    op::JSET => a & b != 0,
                    // callx, kfunc calls, call/exit in JMP32, unknown operations.
                    _ => return Err(self.bad()),
                };
                self.pc = if taken {
                    target(i64::from(i.off))
                } else {
                    self.pc + 1
                };
            }
        }
        Ok(None)
    }
}

/// An ALU or ALU64 instruction on `a` (dst) and `b` (the source register or the immediate,
/// sign-extended for ALU64); `None` for an operation or offset the ISA does not define. Both
/// widths compute on 64 bits: for ALU the operands are their low halves (see [`operands`]),
/// shifts take the amount modulo 32 and the result is truncated to 32 bits, zero-extended.
fn alu(i: &Insn, a: u64, b: u64) -> Option<u64> {
    if i.op() == op::END {
        return byte_swap(i, a);
    }
    let is64 = i.class() == op::ALU64;
    let (a, b, sa, sb) = operands(is64, a, b);
    let shift = b as u32 & if is64 { 63 } else { 31 };
    let r = match (i.op(), i.off) {
        (op::ADD, _) => a.wrapping_add(b),
        (op::SUB, _) => a.wrapping_sub(b),
        (op::MUL, _) => a.wrapping_mul(b),
        (op::DIV, 0) => a.checked_div(b).unwrap_or(0),
        (op::MOD, 0) => a.checked_rem(b).unwrap_or(a),
        // Signed: x / 0 = 0, x % 0 = x, MIN / -1 = MIN, MIN % -1 = 0 (wrapping_*; for ALU,
        // i32::MIN / -1 is 2^31 on 64 bits, which truncates to i32::MIN).
        (op::DIV, op::OFF_SIGNED) => {
            if sb == 0 {
                0
            } else {
                sa.wrapping_div(sb) as u64
            }
        }
        (op::MOD, op::OFF_SIGNED) => {
            if sb == 0 {
                a
            } else {
                sa.wrapping_rem(sb) as u64
            }
        }
        (op::OR, _) => a | b,
        (op::AND, _) => a & b,
        (op::XOR, _) => a ^ b,
        (op::LSH, _) => a.wrapping_shl(shift),
        (op::RSH, _) => a.wrapping_shr(shift),
        (op::ARSH, _) => sa.wrapping_shr(shift) as u64,
        (op::NEG, _) => a.wrapping_neg(),
        (op::MOV, 0) => b,
        (op::MOV, 8) if i.is_reg_src() => b as i8 as i64 as u64,
        (op::MOV, 16) if i.is_reg_src() => b as i16 as i64 as u64,
        (op::MOV, 32) if i.is_reg_src() && is64 => b as i32 as i64 as u64,
        _ => return None,
    };
    Some(if is64 { r } else { r & 0xffff_ffff })
}

/// The operands of a 64-bit (`is64`) or 32-bit ALU operation or comparison: `a` and `b`,
/// zero-extended from their low halves for 32 bits, and the same as signed values,
/// sign-extended from their low halves for 32 bits.
fn operands(is64: bool, a: u64, b: u64) -> (u64, u64, i64, i64) {
    if is64 {
        (a, b, a as i64, b as i64)
    } else {
        let (a, b) = (a as u32, b as u32);
        (
            u64::from(a),
            u64::from(b),
            i64::from(a as i32),
            i64::from(b as i32),
        )
    }
}

/// `le`/`be` (class ALU, source bit = order) and `bswap` (class ALU64): conversions of the
/// low 16, 32 or 64 bits, zero-extended.
fn byte_swap(i: &Insn, a: u64) -> Option<u64> {
    let to_be = match (i.class() == op::ALU64, i.is_reg_src()) {
        (true, true) => return None,
        // bswap swaps unconditionally: the opposite of the host order's no-op.
        (true, false) => cfg!(target_endian = "little"),
        (false, be) => be,
    };
    Some(match (i.imm, to_be) {
        (16, false) => u64::from((a as u16).to_le()),
        (32, false) => u64::from((a as u32).to_le()),
        (64, false) => a.to_le(),
        (16, true) => u64::from((a as u16).to_be()),
        (32, true) => u64::from((a as u32).to_be()),
        (64, true) => a.to_be(),
        _ => return None,
    })
}

/// An atomic read-modify-write (of 4 or 8 bytes at `addr`): the fetch forms and `xchg` put
/// the old value in the source register, `cmpxchg` in r0 (32-bit forms zero-extend it).
/// A misaligned address, which only an unverified program can produce, is updated without
/// atomicity (the result is the same for a single thread).
fn atomic(i: &Insn, addr: u64, reg: &mut [u64; 11], is64: bool) -> Option<()> {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
    let s = i.src as usize;
    let new: fn(u64, u64, u64) -> u64 = match i.imm {
        op::ATOMIC_XCHG => |_, v, _| v,
        op::ATOMIC_CMPXCHG => |old, v, expected| if old == expected { v } else { old },
        x => match x & !op::FETCH {
            op::ATOMIC_ADD => |old, v, _| old.wrapping_add(v),
            op::ATOMIC_OR => |old, v, _| old | v,
            op::ATOMIC_AND => |old, v, _| old & v,
            op::ATOMIC_XOR => |old, v, _| old ^ v,
            _ => return None,
        },
    };
    let (v, expected) = if is64 {
        (reg[s], reg[0])
    } else {
        (reg[s] & 0xffff_ffff, reg[0] & 0xffff_ffff)
    };
    let size = if is64 { 8 } else { 4 };
    let old = if !addr.is_multiple_of(size) {
        // SAFETY: the access was checked (or verified) to be in bounds; unaligned is allowed.
        unsafe {
            if is64 {
                let p = addr as *mut u64;
                let old = p.read_unaligned();
                p.write_unaligned(new(old, v, expected));
                old
            } else {
                let p = addr as *mut u32;
                let old = u64::from(p.read_unaligned());
                p.write_unaligned(new(old, v, expected) as u32);
                old
            }
        }
    } else if is64 {
        // SAFETY: in bounds (checked or verified) and aligned; other threads touch the
        // location only through atomics as well (programs' map values).
        let a = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
        let mut cur = a.load(SeqCst);
        loop {
            match a.compare_exchange_weak(cur, new(cur, v, expected), SeqCst, SeqCst) {
                Ok(old) => break old,
                Err(x) => cur = x,
            }
        }
    } else {
        // SAFETY: as above.
        let a = unsafe { AtomicU32::from_ptr(addr as *mut u32) };
        let mut cur = a.load(SeqCst);
        loop {
            let n = new(u64::from(cur), v, expected) as u32;
            match a.compare_exchange_weak(cur, n, SeqCst, SeqCst) {
                Ok(old) => break u64::from(old),
                Err(x) => cur = x,
            }
        }
    };
    match i.imm {
        op::ATOMIC_CMPXCHG => reg[0] = old,
        x if x & op::FETCH != 0 => reg[s] = old,
        _ => {}
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            dst,
            src,
            off,
            imm,
        }
    }

    #[test]
    fn checking_catches_accesses_outside_the_regions() {
        let mut ctx = [0u8; 56];
        let regions = Regions(vec![(ctx.as_ptr() as usize, 56)]);
        let inside = [
            i(op::LDX | op::MEM | op::DW, 0, 1, 48, 0),
            i(op::JMP | op::EXIT, 0, 0, 0, 0),
        ];
        assert_eq!(run(&inside, ctx.as_mut_ptr(), Some((&regions, 100))), Ok(0));
        let past = [
            i(op::LDX | op::MEM | op::DW, 0, 1, 52, 0),
            i(op::JMP | op::EXIT, 0, 0, 0, 0),
        ];
        assert!(matches!(
            run(&past, ctx.as_mut_ptr(), Some((&regions, 100))),
            Err(Fault::OutOfBounds { pc: 0, size: 8, .. })
        ));
        let stack_ok = [
            i(op::ST | op::MEM | op::DW, 10, 0, -8, 7),
            i(op::LDX | op::MEM | op::DW, 0, 10, -8, 0),
            i(op::JMP | op::EXIT, 0, 0, 0, 0),
        ];
        assert_eq!(
            run(&stack_ok, ctx.as_mut_ptr(), Some((&regions, 100))),
            Ok(7)
        );
        let above_stack = [
            i(op::ST | op::MEM | op::DW, 10, 0, 0, 7),
            i(op::JMP | op::EXIT, 0, 0, 0, 0),
        ];
        assert!(run(&above_stack, ctx.as_mut_ptr(), Some((&regions, 100))).is_err());
        let spin = [i(op::JMP | op::JA, 0, 0, -1, 0)];
        assert!(matches!(
            run(&spin, ctx.as_mut_ptr(), Some((&regions, 1000))),
            Err(Fault::TooManySteps { .. })
        ));
    }

    #[test]
    fn division_by_zero_has_kernel_semantics() {
        let prog = |o: u8| {
            [
                i(op::ALU64 | op::MOV | op::K, 0, 0, 0, 9),
                i(op::ALU64 | op::MOV | op::K, 2, 0, 0, 0),
                i(op::ALU64 | o | op::X, 0, 2, 0, 0),
                i(op::JMP | op::EXIT, 0, 0, 0, 0),
            ]
        };
        let mut ctx = [0u8; 8];
        assert_eq!(run(&prog(op::DIV), ctx.as_mut_ptr(), None), Ok(0));
        assert_eq!(run(&prog(op::MOD), ctx.as_mut_ptr(), None), Ok(9));
    }
}
