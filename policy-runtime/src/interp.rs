//! The interpreter: the portable tier (hosts other than x86-64, or `NCCL_BPF_JIT=0`), and,
//! with memory checking on, the oracle that proves verified programs stay inside their
//! context, stack and map values.

use crate::helpers;
use policy_object::insn::{self as op, Insn};
use std::fmt;

const STACK: usize = 512;

/// Memory a checked run may touch: `[start, start + len)` ranges.
#[derive(Clone, Debug, Default)]
pub struct Regions(pub Vec<(usize, usize)>);

impl Regions {
    fn allows(&self, addr: usize, size: usize) -> bool {
        self.0
            .iter()
            .any(|&(s, l)| addr >= s && addr.checked_add(size).is_some_and(|e| e <= s + l))
    }
}

/// A checked run touched memory outside its regions, or ran too long.
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
        }
    }
}

struct Frame {
    saved: [u64; 4],
    ret_pc: usize,
    stack: Box<[u64; STACK / 8]>,
}

/// Runs `insns` (map references resolved to addresses) on `ctx`. With `check`, every memory
/// access must fall in the regions (plus the live stacks) and at most `max_steps` run.
pub fn run(insns: &[Insn], ctx: *mut u8, check: Option<(&Regions, u64)>) -> Result<u64, Fault> {
    let mut reg = [0u64; 11];
    let mut frames: Vec<Frame> = vec![Frame {
        saved: [0; 4],
        ret_pc: 0,
        stack: Box::new([0; STACK / 8]),
    }];
    let top = |f: &Frame| f.stack.as_ptr() as u64 + STACK as u64;
    reg[1] = ctx as u64;
    reg[10] = top(&frames[0]);
    let mut pc = 0usize;
    let mut steps = 0u64;
    loop {
        steps += 1;
        if let Some((_, max)) = check
            && steps > max
        {
            return Err(Fault::TooManySteps { steps });
        }
        let i = *insns.get(pc).ok_or(Fault::BadInsn { pc })?;
        let (d, s) = (i.dst as usize, i.src as usize);
        let mem_ok = |addr: u64, size: usize, write: bool, frames: &[Frame]| -> Result<(), Fault> {
            if let Some((regions, _)) = check {
                let a = addr as usize;
                let on_stack = frames.iter().any(|f| {
                    let lo = f.stack.as_ptr() as usize;
                    a >= lo && a + size <= lo + STACK
                });
                if !on_stack && !regions.allows(a, size) {
                    return Err(Fault::OutOfBounds {
                        pc,
                        addr: a,
                        size,
                        write,
                    });
                }
            }
            Ok(())
        };
        match i.class() {
            op::ALU | op::ALU64 => {
                let w = i.class() == op::ALU64;
                let b = if i.is_reg_src() {
                    reg[s]
                } else if w {
                    i.imm as i64 as u64
                } else {
                    u64::from(i.imm as u32)
                };
                let a = reg[d];
                // Byte swaps live in the ALU class but work on the whole register.
                let v = if i.op() == op::END {
                    endian(a, &i)
                } else if w {
                    alu64(i.op(), a, b, &i)
                } else {
                    u64::from(alu32(i.op(), a as u32, b as u32, &i))
                };
                reg[d] = v;
                pc += 1;
            }
            op::LD => {
                let v = (u64::from(insns.get(pc + 1).ok_or(Fault::BadInsn { pc })?.imm as u32)
                    << 32)
                    | u64::from(i.imm as u32);
                reg[d] = v;
                pc += 2;
            }
            op::LDX => {
                let addr = reg[s].wrapping_add(i.off as i64 as u64);
                let size = i.access_size();
                mem_ok(addr, size, false, &frames)?;
                // SAFETY: the verifier proved the access in bounds (and a checked run
                // confirmed it against the regions above).
                reg[d] = unsafe {
                    match size {
                        1 => u64::from((addr as *const u8).read_unaligned()),
                        2 => u64::from((addr as *const u16).read_unaligned()),
                        4 => u64::from((addr as *const u32).read_unaligned()),
                        _ => (addr as *const u64).read_unaligned(),
                    }
                };
                pc += 1;
            }
            op::ST | op::STX if i.mode() == op::MEM => {
                let addr = reg[d].wrapping_add(i.off as i64 as u64);
                let v = if i.class() == op::ST {
                    i.imm as i64 as u64
                } else {
                    reg[s]
                };
                let size = i.access_size();
                mem_ok(addr, size, true, &frames)?;
                // SAFETY: as for loads.
                unsafe {
                    match size {
                        1 => (addr as *mut u8).write_unaligned(v as u8),
                        2 => (addr as *mut u16).write_unaligned(v as u16),
                        4 => (addr as *mut u32).write_unaligned(v as u32),
                        _ => (addr as *mut u64).write_unaligned(v),
                    }
                }
                pc += 1;
            }
            op::STX => {
                let addr = reg[d].wrapping_add(i.off as i64 as u64);
                let size = i.access_size();
                mem_ok(addr, size, true, &frames)?;
                atomic(&i, addr, &mut reg, size == 8).ok_or(Fault::BadInsn { pc })?;
                pc += 1;
            }
            _ => match i.op() {
                op::JA => pc = (pc as i64 + 1 + i64::from(i.off)) as usize,
                op::EXIT => match frames.pop() {
                    Some(f) if !frames.is_empty() => {
                        reg[6..10].copy_from_slice(&f.saved);
                        reg[10] = top(frames.last().expect("caller"));
                        pc = f.ret_pc;
                    }
                    _ => return Ok(reg[0]),
                },
                op::CALL if i.src == op::PSEUDO_CALL => {
                    let f = Frame {
                        saved: [reg[6], reg[7], reg[8], reg[9]],
                        ret_pc: pc + 1,
                        stack: Box::new([0; STACK / 8]),
                    };
                    reg[10] = top(&f);
                    frames.push(f);
                    pc = (pc as i64 + 1 + i64::from(i.imm)) as usize;
                }
                op::CALL => {
                    let h = helpers::by_id(i.imm).ok_or(Fault::BadInsn { pc })?;
                    reg[0] = h(reg[1], reg[2], reg[3], reg[4], reg[5]);
                    pc += 1;
                }
                o => {
                    let w = i.class() == op::JMP;
                    let b = if i.is_reg_src() {
                        reg[s]
                    } else if w {
                        i.imm as i64 as u64
                    } else {
                        u64::from(i.imm as u32)
                    };
                    let (a, b) = if w {
                        (reg[d], b)
                    } else {
                        (reg[d] & 0xffff_ffff, b & 0xffff_ffff)
                    };
                    let (sa, sb) = if w {
                        (a as i64, b as i64)
                    } else {
                        (i64::from(a as u32 as i32), i64::from(b as u32 as i32))
                    };
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
                        _ => return Err(Fault::BadInsn { pc }),
                    };
                    pc = if taken {
                        (pc as i64 + 1 + i64::from(i.off)) as usize
                    } else {
                        pc + 1
                    };
                }
            },
        }
    }
}

fn alu64(o: u8, a: u64, b: u64, i: &Insn) -> u64 {
    match o {
        op::ADD => a.wrapping_add(b),
        op::SUB => a.wrapping_sub(b),
        op::MUL => a.wrapping_mul(b),
        op::DIV => a.checked_div(b).unwrap_or(0),
        op::MOD => a.checked_rem(b).unwrap_or(a),
        op::OR => a | b,
        op::AND => a & b,
        op::XOR => a ^ b,
        op::LSH => a.wrapping_shl(b as u32 & 63),
        op::RSH => a.wrapping_shr(b as u32 & 63),
        op::ARSH => ((a as i64).wrapping_shr(b as u32 & 63)) as u64,
        op::NEG => a.wrapping_neg(),
        op::MOV => b,
        _ => endian(a, i),
    }
}

fn alu32(o: u8, a: u32, b: u32, i: &Insn) -> u32 {
    match o {
        op::ADD => a.wrapping_add(b),
        op::SUB => a.wrapping_sub(b),
        op::MUL => a.wrapping_mul(b),
        op::DIV => a.checked_div(b).unwrap_or(0),
        op::MOD => a.checked_rem(b).unwrap_or(a),
        op::OR => a | b,
        op::AND => a & b,
        op::XOR => a ^ b,
        op::LSH => a.wrapping_shl(b & 31),
        op::RSH => a.wrapping_shr(b & 31),
        op::ARSH => ((a as i32).wrapping_shr(b & 31)) as u32,
        op::NEG => a.wrapping_neg(),
        op::MOV => b,
        _ => endian(u64::from(a), i) as u32,
    }
}

fn endian(a: u64, i: &Insn) -> u64 {
    match (i.is_reg_src(), i.imm) {
        (false, 16) => a & 0xffff,
        (false, 32) => a & 0xffff_ffff,
        (false, _) => a,
        (true, 16) => u64::from((a as u16).swap_bytes()),
        (true, 32) => u64::from((a as u32).swap_bytes()),
        (true, _) => a.swap_bytes(),
    }
}

fn atomic(i: &Insn, addr: u64, reg: &mut [u64; 11], w: bool) -> Option<()> {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
    let s = i.src as usize;
    /// The old value of one read-modify-write on `$a`.
    macro_rules! rmw {
        ($a:expr, $v:expr, $expected:expr) => {
            match i.imm {
                x if x == op::ATOMIC_ADD || x == op::ATOMIC_ADD | op::FETCH => {
                    $a.fetch_add($v, SeqCst)
                }
                op::ATOMIC_OR => $a.fetch_or($v, SeqCst),
                op::ATOMIC_AND => $a.fetch_and($v, SeqCst),
                op::ATOMIC_XOR => $a.fetch_xor($v, SeqCst),
                op::ATOMIC_XCHG => $a.swap($v, SeqCst),
                op::ATOMIC_CMPXCHG => $a
                    .compare_exchange($expected, $v, SeqCst, SeqCst)
                    .unwrap_or_else(|x| x),
                _ => return None,
            }
        };
    }
    // SAFETY: the verifier proved an aligned, in-bounds map value or stack access.
    let old = unsafe {
        if w {
            rmw!(AtomicU64::from_ptr(addr as *mut u64), reg[s], reg[0])
        } else {
            u64::from(rmw!(
                AtomicU32::from_ptr(addr as *mut u32),
                reg[s] as u32,
                reg[0] as u32
            ))
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
