//! Translation of verified BPF to x86-64 (through the encoder in [`super::x86`]).
//!
//! Register map: r0 rax, r1 rdi, r2 rsi, r3 rdx, r4 rcx, r5 r8 (the System V argument
//! registers, so helpers are called directly), r6 rbx, r7 r13, r8 r14, r9 r15 (callee-saved,
//! as BPF requires), r10 rbp. r10/r11 of x86 are scratch. Every BPF function gets a frame:
//! five pushes and 512 bytes of stack keep `rsp` 16-byte aligned at every call.

use super::x86::*;
use policy_object::insn::{self as op, Insn};
use std::fmt;

const MAP: [Gpr; 11] = [RAX, RDI, RSI, RDX, RCX, R8, RBX, R13, R14, R15, RBP];
const STACK: i32 = 512;

/// Something the JIT cannot translate (the verifier normally rejects it first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JitError {
    Unsupported { pc: usize, what: String },
    UnknownHelper { pc: usize, id: i32 },
}

impl fmt::Display for JitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JitError::Unsupported { pc, what } => {
                write!(f, "JIT: insn {pc}: {what} is not supported")
            }
            JitError::UnknownHelper { pc, id } => write!(f, "JIT: insn {pc}: no helper #{id}"),
        }
    }
}

impl std::error::Error for JitError {}

fn r(x: u8) -> Gpr {
    MAP[x as usize]
}

fn width(i: &Insn) -> Width {
    match i.size_bits() {
        op::B => Width::B8,
        op::H => Width::B16,
        op::W => Width::B32,
        _ => Width::B64,
    }
}

fn prologue(a: &mut Asm) {
    for g in [RBP, RBX, R13, R14, R15] {
        a.push(g);
    }
    a.alu_ri(true, Alu::Sub, RSP, STACK);
    a.lea(RBP, RSP, STACK);
}

fn epilogue(a: &mut Asm) {
    a.mov_rr(true, RSP, RBP);
    for g in [R15, R14, R13, RBX, RBP] {
        a.pop(g);
    }
    a.ret();
}

/// Translates `insns` (map references already resolved to addresses). `helper` gives the
/// address of each helper id.
pub fn translate(insns: &[Insn], helper: &dyn Fn(i32) -> Option<u64>) -> Result<Vec<u8>, JitError> {
    let mut entries = vec![false; insns.len()];
    entries[0] = true;
    for (pc, i) in insns.iter().enumerate() {
        if i.code == (op::JMP | op::CALL) && i.src == op::PSEUDO_CALL {
            let t = (pc as i64 + 1 + i64::from(i.imm)) as usize;
            if t < insns.len() {
                entries[t] = true;
            }
        }
    }
    let mut a = Asm::default();
    let mut at = vec![0usize; insns.len() + 1];
    let mut fixups: Vec<(usize, usize)> = vec![];
    let mut pc = 0;
    while pc < insns.len() {
        if entries[pc] {
            prologue(&mut a);
        }
        at[pc] = a.len();
        let i = insns[pc];
        let unsupported = |what: &str| JitError::Unsupported {
            pc,
            what: what.into(),
        };
        match i.class() {
            op::ALU | op::ALU64 => alu(&mut a, &i).map_err(&unsupported)?,
            op::LD => {
                let v = (u64::from(insns[pc + 1].imm as u32) << 32) | u64::from(i.imm as u32);
                a.mov_ri64(r(i.dst), v);
                at[pc + 1] = a.len();
                pc += 2;
                continue;
            }
            op::LDX => a.load(width(&i), r(i.dst), r(i.src), i32::from(i.off)),
            op::ST => a.store_imm(width(&i), r(i.dst), i32::from(i.off), i.imm),
            op::STX if i.mode() == op::MEM => {
                a.store(width(&i), r(i.dst), i32::from(i.off), r(i.src))
            }
            op::STX => {
                let w = i.size_bits() == op::DW;
                let (base, off, src) = (r(i.dst), i32::from(i.off), r(i.src));
                match i.imm {
                    op::ATOMIC_ADD => a.lock_alu(w, Alu::Add, base, off, src),
                    op::ATOMIC_OR => a.lock_alu(w, Alu::Or, base, off, src),
                    op::ATOMIC_AND => a.lock_alu(w, Alu::And, base, off, src),
                    op::ATOMIC_XOR => a.lock_alu(w, Alu::Xor, base, off, src),
                    x if x == op::ATOMIC_ADD | op::FETCH => a.lock_xadd(w, base, off, src),
                    op::ATOMIC_XCHG => a.xchg(w, base, off, src),
                    op::ATOMIC_CMPXCHG => {
                        a.lock_cmpxchg(w, base, off, src);
                        if !w {
                            a.mov_rr(false, RAX, RAX);
                        }
                    }
                    _ => return Err(unsupported("atomic operation")),
                }
            }
            _ => match i.op() {
                op::JA => {
                    let f = a.jmp();
                    fixups.push((f, (pc as i64 + 1 + i64::from(i.off)) as usize));
                }
                op::EXIT => epilogue(&mut a),
                op::CALL if i.src == op::PSEUDO_CALL => {
                    let f = a.call_rel();
                    fixups.push((f, (pc as i64 + 1 + i64::from(i.imm)) as usize));
                }
                op::CALL => {
                    let addr = helper(i.imm).ok_or(JitError::UnknownHelper { pc, id: i.imm })?;
                    a.mov_ri64(R11, addr);
                    a.call_r(R11);
                }
                o => {
                    let w = i.class() == op::JMP;
                    let dst = r(i.dst);
                    if o == op::JSET {
                        if i.is_reg_src() {
                            a.test_rr(w, dst, r(i.src));
                        } else {
                            a.test_ri(w, dst, i.imm);
                        }
                    } else if i.is_reg_src() {
                        a.alu_rr(w, Alu::Cmp, dst, r(i.src));
                    } else {
                        a.alu_ri(w, Alu::Cmp, dst, i.imm);
                    }
                    let c = match o {
                        op::JEQ => Cond::E,
                        op::JNE | op::JSET => Cond::Ne,
                        op::JGT => Cond::A,
                        op::JGE => Cond::Ae,
                        op::JLT => Cond::B,
                        op::JLE => Cond::Be,
                        op::JSGT => Cond::G,
                        op::JSGE => Cond::Ge,
                        op::JSLT => Cond::L,
                        op::JSLE => Cond::Le,
                        _ => return Err(unsupported("jump operation")),
                    };
                    let f = a.jcc(c);
                    fixups.push((f, (pc as i64 + 1 + i64::from(i.off)) as usize));
                }
            },
        }
        pc += 1;
    }
    for (f, target) in fixups {
        // A call lands on the function's prologue, a jump on the instruction itself.
        let dest = if entries.get(target).copied().unwrap_or(false) && is_call_fixup(&a, f) {
            prologue_start(&at, target)
        } else {
            at[target]
        };
        a.patch(f, dest);
    }
    Ok(a.code)
}

fn is_call_fixup(a: &Asm, f: usize) -> bool {
    f >= 1 && a.code[f - 1] == 0xe8
}

/// Size of the prologue, so calls can land before it.
fn prologue_len() -> usize {
    let mut a = Asm::default();
    prologue(&mut a);
    a.len()
}

fn prologue_start(at: &[usize], target: usize) -> usize {
    at[target] - prologue_len()
}

/// An ALU immediate as BPF defines it: sign-extended for 64-bit operations, zero-extended
/// (as a 32-bit value) for 32-bit ones.
fn imm_value(w: bool, imm: i32) -> u64 {
    if w {
        imm as i64 as u64
    } else {
        u64::from(imm as u32)
    }
}

fn alu(a: &mut Asm, i: &Insn) -> Result<(), &'static str> {
    let w = i.class() == op::ALU64;
    let dst = r(i.dst);
    let imm = i.imm;
    let reg = i.is_reg_src();
    let src = r(i.src);
    let simple = |o| match o {
        op::ADD => Some(Alu::Add),
        op::SUB => Some(Alu::Sub),
        op::AND => Some(Alu::And),
        op::OR => Some(Alu::Or),
        op::XOR => Some(Alu::Xor),
        _ => None,
    };
    match i.op() {
        o if simple(o).is_some() => {
            let k = simple(o).expect("checked");
            if reg {
                a.alu_rr(w, k, dst, src)
            } else {
                a.alu_ri(w, k, dst, imm)
            }
        }
        op::MOV => {
            if reg {
                a.mov_rr(w, dst, src);
            } else {
                a.mov_ri64(dst, imm_value(w, imm));
            }
        }
        op::MUL => {
            if reg {
                a.imul_rr(w, dst, src);
            } else {
                a.mov_ri64(R11, imm_value(w, imm));
                a.imul_rr(w, dst, R11);
            }
        }
        op::DIV | op::MOD => {
            if reg {
                a.mov_rr(w, R11, src);
            } else {
                a.mov_ri64(R11, imm_value(w, imm));
            }
            a.test_rr(w, R11, R11);
            let nonzero = a.jcc(Cond::Ne);
            // Kernel semantics for a zero divisor (the verifier rejects possible zeros anyway).
            if i.op() == op::DIV {
                a.alu_rr(false, Alu::Xor, dst, dst);
            } else if !w {
                a.mov_rr(false, dst, dst);
            }
            let done = a.jmp();
            let here = a.len();
            a.patch(nonzero, here);
            a.push(RAX);
            a.push(RDX);
            a.mov_rr(w, RAX, dst);
            a.alu_rr(false, Alu::Xor, RDX, RDX);
            a.div(w, R11);
            a.mov_rr(w, R11, if i.op() == op::DIV { RAX } else { RDX });
            a.pop(RDX);
            a.pop(RAX);
            a.mov_rr(w, dst, R11);
            let end = a.len();
            a.patch(done, end);
        }
        op::LSH | op::RSH | op::ARSH => {
            let k = match i.op() {
                op::LSH => Shift::Shl,
                op::RSH => Shift::Shr,
                _ => Shift::Sar,
            };
            if !reg {
                a.shift_imm(w, k, dst, (imm as u8) & if w { 63 } else { 31 });
            } else if dst == RCX {
                a.mov_rr(true, R10, RCX);
                a.mov_rr(true, RCX, src);
                a.shift_cl(w, k, R10);
                a.mov_rr(true, RCX, R10);
                if !w {
                    a.mov_rr(false, RCX, RCX);
                }
            } else if src == RCX {
                a.shift_cl(w, k, dst);
            } else {
                a.mov_rr(true, R11, RCX);
                a.mov_rr(true, RCX, src);
                a.shift_cl(w, k, dst);
                a.mov_rr(true, RCX, R11);
            }
        }
        op::NEG => a.neg(w, dst),
        op::END => match (reg, imm) {
            (false, 16) => a.movzx16(dst, dst),
            (false, 32) => a.mov_rr(false, dst, dst),
            (false, _) => {}
            (true, 16) => {
                a.rol16_8(dst);
                a.movzx16(dst, dst);
            }
            (true, 32) => a.bswap(false, dst),
            (true, _) => a.bswap(true, dst),
        },
        _ => return Err("ALU operation"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp;
    use crate::jit::exec::ExecBuf;

    fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            dst,
            src,
            off,
            imm,
        }
    }

    fn both(prog: &[Insn]) -> (u64, u64) {
        let code = translate(prog, &|_| None).unwrap();
        let e = ExecBuf::new(&code).unwrap();
        let mut ctx = [0u8; 64];
        // SAFETY: the programs below only touch their registers and stack.
        let j = unsafe { e.call(ctx.as_mut_ptr()) };
        let n = interp::run(prog, ctx.as_mut_ptr(), None).unwrap();
        (j, n)
    }

    /// Every ALU operation, 32 and 64 bit, register and immediate forms, on edge values and
    /// every register pairing that hits a special case (rcx for shifts, rax/rdx for division).
    #[test]
    fn alu_edge_cases_match_the_interpreter() {
        let vals: [u64; 8] = [
            0,
            1,
            7,
            63,
            64,
            0x8000_0000,
            u64::MAX,
            0xdead_beef_cafe_f00d,
        ];
        let ops = [
            op::ADD,
            op::SUB,
            op::MUL,
            op::DIV,
            op::OR,
            op::AND,
            op::LSH,
            op::RSH,
            op::NEG,
            op::MOD,
            op::XOR,
            op::MOV,
            op::ARSH,
        ];
        let regs = [0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9];
        let mut checked = 0;
        for class in [op::ALU, op::ALU64] {
            for &o in &ops {
                for &d in &regs {
                    for &s in &regs {
                        for (k, &a) in vals.iter().enumerate() {
                            let b = vals[(k * 3 + 1) % vals.len()];
                            let mut p = vec![];
                            let lddw = |r: u8, v: u64| {
                                [
                                    i(op::LDDW, r, 0, 0, v as u32 as i32),
                                    i(0, 0, 0, 0, (v >> 32) as u32 as i32),
                                ]
                            };
                            p.extend(lddw(s, b));
                            p.extend(lddw(d, a));
                            p.push(i(class | o | op::X, d, s, 0, 0));
                            p.push(i(op::ALU64 | op::MOV | op::X, 0, d, 0, 0));
                            p.push(i(op::JMP | op::EXIT, 0, 0, 0, 0));
                            let (j, n) = both(&p);
                            assert_eq!(
                                j, n,
                                "class {class:#x} op {o:#x} r{d}=r{d} op r{s}: {a:#x}, {b:#x}"
                            );
                            checked += 1;
                        }
                    }
                }
                for &a in &vals {
                    for imm in [0i32, 1, -1, 5, 31, 33, i32::MIN] {
                        if matches!(o, op::LSH | op::RSH | op::ARSH)
                            && !(0..if class == op::ALU64 { 64 } else { 32 }).contains(&imm)
                        {
                            continue;
                        }
                        let p = [
                            i(op::LDDW, 3, 0, 0, a as u32 as i32),
                            i(0, 0, 0, 0, (a >> 32) as u32 as i32),
                            i(class | o | op::K, 3, 0, 0, imm),
                            i(op::ALU64 | op::MOV | op::X, 0, 3, 0, 0),
                            i(op::JMP | op::EXIT, 0, 0, 0, 0),
                        ];
                        let (j, n) = both(&p);
                        assert_eq!(j, n, "class {class:#x} op {o:#x} imm {imm}: {a:#x}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }

    #[repr(align(16))]
    struct Aligned16(#[allow(dead_code)] [u8; 16]);

    /// Returns 0 when the stack was 16-byte aligned at the call, as the System V ABI requires
    /// (a local with 16-byte alignment lands on a 16-byte boundary only then).
    extern "C" fn probe_alignment(depth: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
        let v = std::hint::black_box(Aligned16([depth as u8; 16]));
        (&v as *const Aligned16 as usize % 16) as u64
    }

    #[test]
    fn helpers_are_called_with_an_aligned_stack() {
        // Main program calls the probe, then a BPF-to-BPF subprogram that calls it again.
        let p = [
            i(op::JMP | op::CALL, 0, 0, 0, 99),
            i(op::ALU64 | op::MOV | op::X, 6, 0, 0, 0),
            i(op::JMP | op::CALL, 0, op::PSEUDO_CALL, 0, 2),
            i(op::ALU64 | op::ADD | op::X, 0, 6, 0, 0),
            i(op::JMP | op::EXIT, 0, 0, 0, 0),
            i(op::JMP | op::CALL, 0, 0, 0, 99),
            i(op::JMP | op::EXIT, 0, 0, 0, 0),
        ];
        let code = translate(&p, &|id| {
            (id == 99).then_some(probe_alignment as *const () as usize as u64)
        })
        .unwrap();
        let e = ExecBuf::new(&code).unwrap();
        let mut ctx = [0u8; 8];
        // SAFETY: the program only calls the probe.
        assert_eq!(
            unsafe { e.call(ctx.as_mut_ptr()) },
            0,
            "misaligned stack at a helper call"
        );
    }

    #[test]
    fn jumps_and_byte_swaps_match_the_interpreter() {
        let vals: [u64; 6] = [
            0,
            5,
            u64::MAX,
            0xffff_ffd9,
            0x1_0000_0005,
            0x8000_0000_0000_0000,
        ];
        let jops = [
            op::JEQ,
            op::JNE,
            op::JGT,
            op::JGE,
            op::JLT,
            op::JLE,
            op::JSGT,
            op::JSGE,
            op::JSLT,
            op::JSLE,
            op::JSET,
        ];
        for class in [op::JMP, op::JMP32] {
            for &o in &jops {
                for &a in &vals {
                    for &b in &vals {
                        let p = [
                            i(op::LDDW, 2, 0, 0, a as u32 as i32),
                            i(0, 0, 0, 0, (a >> 32) as u32 as i32),
                            i(op::LDDW, 3, 0, 0, b as u32 as i32),
                            i(0, 0, 0, 0, (b >> 32) as u32 as i32),
                            i(op::ALU64 | op::MOV | op::K, 0, 0, 0, 1),
                            i(class | o | op::X, 2, 3, 2, 0),
                            i(class | o | op::K, 2, 0, 1, b as i32),
                            i(op::ALU64 | op::MOV | op::K, 0, 0, 0, 2),
                            i(op::JMP | op::EXIT, 0, 0, 0, 0),
                        ];
                        let (j, n) = both(&p);
                        assert_eq!(j, n, "jump {class:#x}/{o:#x} {a:#x} vs {b:#x}");
                    }
                }
            }
        }
        for (src, imm) in [(0u8, 16), (0, 32), (0, 64), (1, 16), (1, 32), (1, 64)] {
            let p = [
                i(op::LDDW, 4, 0, 0, 0x1122_3344),
                i(0, 0, 0, 0, 0x5566_7788),
                i(op::ALU | op::END | (src << 3), 4, 0, 0, imm),
                i(op::ALU64 | op::MOV | op::X, 0, 4, 0, 0),
                i(op::JMP | op::EXIT, 0, 0, 0, 0),
            ];
            let (j, n) = both(&p);
            assert_eq!(j, n, "end src {src} imm {imm}");
        }
    }
}
