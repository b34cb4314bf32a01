//! The whole RFC 9669 instruction set on both engines, through [`policy_runtime::raw`]:
//! per-instruction edge cases with their expected results (every v4 instruction, both
//! widths, INT_MIN / -1, division and modulo by zero, each sign extension, each byte swap,
//! gotol both ways, every atomic on 4 and 8 bytes), the JIT agreeing with the interpreter on
//! each and on random ALU sequences; programs neither engine may take; and the checking
//! interpreter's stack-initialization and pointer-escape faults.
//!
//! Every program runs in the checking interpreter first, and in the JIT only after that
//! run stayed inside its memory and terminated.

use policy_object::insn::build::{
    alu64_imm, alu64_reg, atomic, call_local, exit, gotol, insn, ja, jmp_imm, lddw, ldsx, ldx,
    mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{self as op, Insn};
use policy_runtime::interp::{self, Checked, Fault, Regions};
use policy_runtime::raw::{self, RawError};

fn listing(p: &[Insn]) -> String {
    let mut out = vec![];
    let mut k = 0;
    while k < p.len() {
        out.push(format!("{k:3}: {}", op::disasm(p, k)));
        k += if p[k].is_lddw() { 2 } else { 1 };
    }
    out.join("\n")
}

/// 8-byte aligned memory, so atomics on it are real atomics in both engines.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Mem([u8; 64]);

/// Runs `p` on both engines, each starting from the contents of `mem` at the same address
/// (so values derived from r1 agree too); asserts they agree on the result and the memory;
/// returns the result, leaving the memory as the runs left it.
fn both(p: &[Insn], mem: &mut Mem) -> u64 {
    let start = *mem;
    let n = raw::run_interpreter(p, &mut mem.0)
        .unwrap_or_else(|f| panic!("interpreter: {f}\n{}", listing(p)));
    let after_interpreter = *mem;
    *mem = start;
    // SAFETY: the checking interpreter just ran the same program on the same memory: it
    // touched only `mem` and its stack, and terminated.
    let j = unsafe { raw::run_jit(p, &mut mem.0) }
        .unwrap_or_else(|e| panic!("JIT: {e}\n{}", listing(p)));
    assert_eq!(n, j, "interpreter {n:#x} vs JIT {j:#x}\n{}", listing(p));
    assert_eq!(after_interpreter, *mem, "memory differs\n{}", listing(p));
    n
}

fn run(p: &[Insn]) -> u64 {
    both(p, &mut Mem([0; 64]))
}

fn word(mem: &Mem, at: usize) -> u64 {
    u64::from_le_bytes(mem.0[at..at + 8].try_into().unwrap())
}

/// `r3 = a; r4 = b; r3 <op> r4 (or imm b); r0 = r3` in both register and, where `b`
/// fits, immediate form; checks both against `want`.
fn binop(class: u8, o: u8, off: i16, a: u64, b: u64, want: u64) {
    let mut p = vec![];
    p.extend(lddw(3, a));
    p.extend(lddw(4, b));
    p.push(insn(class | o | op::X, 3, 4, off, 0));
    p.extend([mov64_reg(0, 3), exit()]);
    assert_eq!(run(&p), want, "reg form\n{}", listing(&p));
    let imm = b as i64;
    // The immediate is sign-extended for ALU64 and taken as 32 bits for ALU.
    let fits = if class == op::ALU64 {
        i64::from(imm as i32) == imm
    } else {
        true
    };
    if fits {
        let mut p = vec![];
        p.extend(lddw(3, a));
        p.push(insn(class | o | op::K, 3, 0, off, b as i32));
        p.extend([mov64_reg(0, 3), exit()]);
        assert_eq!(run(&p), want, "imm form\n{}", listing(&p));
    }
}

const MIN64: u64 = i64::MIN as u64;
const MIN32: u64 = 0x8000_0000;
/// Bits above 32 that 32-bit operations must ignore and clear.
const JUNK: u64 = 0xdead_beef_0000_0000;

fn neg64(x: i64) -> u64 {
    x as u64
}

fn neg32(x: i32) -> u64 {
    u64::from(x as u32)
}

#[test]
fn signed_division_and_modulo() {
    let s = op::OFF_SIGNED;
    for (a, b, q, r) in [
        (7i64, 2i64, 3i64, 1i64),
        (-7, 2, -3, -1),
        (7, -2, -3, 1),
        (-7, -2, 3, -1),
        (i64::MIN, -1, i64::MIN, 0),
        (i64::MIN, 1, i64::MIN, 0),
        (i64::MIN, 3, -3074457345618258602, -2),
        (-1, i64::MIN, 0, -1),
        (5, 0, 0, 5),
        (-5, 0, 0, -5),
        (i64::MAX, -1, -i64::MAX, 0),
    ] {
        binop(op::ALU64, op::DIV, s, a as u64, b as u64, neg64(q));
        binop(op::ALU64, op::MOD, s, a as u64, b as u64, neg64(r));
    }
    for (a, b, q, r) in [
        (7i32, 2i32, 3i32, 1i32),
        (-7, 2, -3, -1),
        (7, -2, -3, 1),
        (-7, -2, 3, -1),
        (i32::MIN, -1, i32::MIN, 0),
        (i32::MIN, 3, -715827882, -2),
        (-10, 0, 0, -10),
        (10, 0, 0, 10),
    ] {
        // Junk above bit 31 of both operands: ignored, and the result zero-extended.
        let (a, b) = (JUNK | u64::from(a as u32), JUNK | u64::from(b as u32));
        binop(op::ALU, op::DIV, s, a, b, neg32(q));
        binop(op::ALU, op::MOD, s, a, b, neg32(r));
    }
    assert_eq!(MIN32, neg32(i32::MIN));
    assert_eq!(MIN64, neg64(i64::MIN));
}

#[test]
fn unsigned_division_by_zero_and_large_divisors() {
    binop(op::ALU64, op::DIV, 0, 9, 0, 0);
    binop(op::ALU64, op::MOD, 0, 9, 0, 9);
    binop(op::ALU64, op::DIV, 0, u64::MAX, u64::MAX, 1);
    // imm -1 is 2^64 - 1 for ALU64.
    binop(op::ALU64, op::DIV, 0, 5, u64::MAX, 0);
    binop(op::ALU64, op::MOD, 0, MIN64 | 5, 7, (MIN64 | 5) % 7);
    binop(op::ALU, op::DIV, 0, JUNK | 9, 0, 0);
    // x % 0 leaves the low 32 bits and clears the rest.
    binop(op::ALU, op::MOD, 0, JUNK | 9, 0, 9);
    binop(op::ALU, op::DIV, 0, JUNK | 0xffff_ffff, 0xffff_ffff, 1);
    binop(op::ALU, op::MOD, 0, JUNK | 100, JUNK | 7, 2);
}

#[test]
fn shifts_mask_the_amount() {
    binop(op::ALU64, op::LSH, 0, 1, 65, 2);
    binop(op::ALU64, op::RSH, 0, 0x100, 64 + 4, 0x10);
    binop(op::ALU64, op::ARSH, 0, MIN64, 127, u64::MAX);
    binop(op::ALU, op::LSH, 0, JUNK | 1, 33, 2);
    binop(op::ALU, op::RSH, 0, JUNK | 0x8000_0000, 63, 1);
    binop(op::ALU, op::ARSH, 0, JUNK | 0x8000_0000, 33, 0xc000_0000);
    binop(op::ALU, op::LSH, 0, 0x11, 60, 0x1000_0000);
}

#[test]
fn sign_extending_moves() {
    let v = 0x0123_4567_89ab_cdef_u64;
    let p = 0x7654_3210_7fff_7f7f_u64;
    let rows = [
        (op::ALU64, 8, v, 0xffff_ffff_ffff_ffef),
        (op::ALU64, 8, p, 0x7f),
        (op::ALU64, 16, v, 0xffff_ffff_ffff_cdef),
        (op::ALU64, 16, p, 0x7f7f),
        (op::ALU64, 32, v, 0xffff_ffff_89ab_cdef),
        (op::ALU64, 32, p, 0x7fff_7f7f),
        (op::ALU, 8, v, 0xffff_ffef),
        (op::ALU, 8, p, 0x7f),
        (op::ALU, 16, v, 0xffff_cdef),
        (op::ALU, 16, p, 0x7f7f),
    ];
    for (class, width, src, want) in rows {
        // Every register pairing, so the byte registers sil/dil and dst == src are covered.
        for d in 0..10u8 {
            for s in 0..10u8 {
                let mut prog = vec![];
                prog.extend(lddw(d, 0x5555_5555_5555_5555));
                prog.extend(lddw(s, src));
                prog.push(insn(class | op::MOV | op::X, d, s, width, 0));
                prog.extend([mov64_reg(0, d), exit()]);
                assert_eq!(run(&prog), want, "{}", listing(&prog));
            }
        }
    }
}

#[test]
fn byte_swaps() {
    let v = 0x0123_4567_89ab_cdef_u64;
    let rows = [
        (op::ALU64 | op::END | op::K, 16, 0xefcd),
        (op::ALU64 | op::END | op::K, 32, 0xefcd_ab89),
        (op::ALU64 | op::END | op::K, 64, 0xefcd_ab89_6745_2301),
        (op::ALU | op::END | op::TO_BE, 16, 0xefcd),
        (op::ALU | op::END | op::TO_BE, 32, 0xefcd_ab89),
        (op::ALU | op::END | op::TO_BE, 64, 0xefcd_ab89_6745_2301),
        (op::ALU | op::END | op::TO_LE, 16, 0xcdef),
        (op::ALU | op::END | op::TO_LE, 32, 0x89ab_cdef),
        (op::ALU | op::END | op::TO_LE, 64, v),
    ];
    for (code, imm, want) in rows {
        for d in [0u8, 1, 2, 3, 5, 9] {
            let mut p = vec![];
            p.extend(lddw(d, v));
            p.extend([insn(code, d, 0, 0, imm), mov64_reg(0, d), exit()]);
            assert_eq!(run(&p), want, "{}", listing(&p));
        }
    }
}

#[test]
fn sign_extending_loads() {
    let mut mem = Mem([0; 64]);
    mem.0[..8].copy_from_slice(&[0x80, 0xff, 0x01, 0x80, 0x7f, 0xff, 0xff, 0x7f]);
    let rows = [
        (op::B, 0, 0xffff_ffff_ffff_ff80),
        (op::B, 4, 0x7f),
        (op::H, 0, 0xffff_ffff_ffff_ff80),
        (op::H, 2, 0xffff_ffff_ffff_8001),
        (op::H, 6, 0x7fff),
        (op::W, 0, 0xffff_ffff_8001_ff80),
        (op::W, 4, 0x7fff_ff7f),
    ];
    for (size, off, want) in rows {
        for d in [0u8, 2, 5, 9] {
            let p = [ldsx(size, d, 1, off), mov64_reg(0, d), exit()];
            assert_eq!(both(&p, &mut mem), want, "{}", listing(&p));
        }
        // The same through the stack: copied there with a plain load and store.
        let p = [
            ldx(op::DW, 3, 1, 0),
            stx(op::DW, 10, -8, 3),
            ldsx(size, 0, 10, -8 + off),
            exit(),
        ];
        assert_eq!(both(&p, &mut mem), want, "{}", listing(&p));
    }
    // The plain loads still zero-extend.
    let p = [ldx(op::H, 0, 1, 2), exit()];
    assert_eq!(both(&p, &mut mem), 0x8001);
}

#[test]
fn gotol_forward_backward_and_far() {
    assert_eq!(
        run(&[mov64_imm(0, 1), gotol(1), mov64_imm(0, 2), exit()]),
        1
    );
    // r0 += 3 five times, the loop closed by a backward gotol.
    let p = [
        mov64_imm(0, 0),
        mov64_imm(3, 5),
        alu64_imm(op::ADD, 0, 3),
        alu64_imm(op::SUB, 3, 1),
        jmp_imm(op::JEQ, 3, 0, 1),
        gotol(-4),
        exit(),
    ];
    assert_eq!(run(&p), 15);
    // A target no 16-bit offset reaches.
    let far = 40_000;
    let mut p = vec![mov64_imm(0, 7), gotol(far)];
    p.extend(std::iter::repeat_n(mov64_imm(0, 1), far as usize));
    p.push(exit());
    assert_eq!(run(&p), 7);
    // JMP-class goto takes off (and the last instruction may be a goto).
    let p = [
        mov64_imm(0, 0),
        ja(2),
        mov64_imm(2, 0),
        exit(),
        mov64_imm(0, 4),
        ja(-3),
    ];
    assert_eq!(run(&p), 4);
}

#[derive(Clone, Copy, Debug)]
enum Rmw {
    Add,
    Or,
    And,
    Xor,
    Xchg,
}

fn apply(o: Rmw, old: u64, v: u64) -> u64 {
    match o {
        Rmw::Add => old.wrapping_add(v),
        Rmw::Or => old | v,
        Rmw::And => old & v,
        Rmw::Xor => old ^ v,
        Rmw::Xchg => v,
    }
}

#[test]
fn every_atomic_on_four_and_eight_bytes() {
    let init = 0x0123_4567_89ab_cdef_u64;
    let v = 0xff00_ff00_f0f0_0ff0_u64;
    let r0 = 0x5a5a_5a5a_5a5a_5a5a_u64;
    let ops = [
        (Rmw::Add, op::ATOMIC_ADD, false),
        (Rmw::Or, op::ATOMIC_OR, false),
        (Rmw::And, op::ATOMIC_AND, false),
        (Rmw::Xor, op::ATOMIC_XOR, false),
        (Rmw::Add, op::ATOMIC_ADD | op::FETCH, true),
        (Rmw::Or, op::ATOMIC_OR | op::FETCH, true),
        (Rmw::And, op::ATOMIC_AND | op::FETCH, true),
        (Rmw::Xor, op::ATOMIC_XOR | op::FETCH, true),
        (Rmw::Xchg, op::ATOMIC_XCHG, true),
    ];
    for (o, imm, fetch) in ops {
        for size in [op::W, op::DW] {
            let mut mem = Mem([0; 64]);
            mem.0[..8].copy_from_slice(&init.to_le_bytes());
            let mut p = vec![];
            p.extend(lddw(2, v));
            p.extend(lddw(0, r0));
            p.extend([atomic(size, imm, 1, 0, 2), stx(op::DW, 1, 8, 2), exit()]);
            let got = both(&p, &mut mem);
            let (want_mem, want_src) = if size == op::DW {
                (apply(o, init, v), if fetch { init } else { v })
            } else {
                let lo = apply(o, init & 0xffff_ffff, v & 0xffff_ffff) & 0xffff_ffff;
                let fetched = init & 0xffff_ffff;
                ((init & !0xffff_ffff) | lo, if fetch { fetched } else { v })
            };
            let what = format!("{o:?} fetch={fetch} size={size:#x}\n{}", listing(&p));
            assert_eq!(got, r0, "r0 changed: {what}");
            assert_eq!(word(&mem, 0), want_mem, "memory: {what}");
            assert_eq!(word(&mem, 8), want_src, "source register: {what}");
        }
    }
    // Concrete values, worked by hand: fetch_and/or/xor on 4 bytes.
    let mut mem = Mem([0; 64]);
    mem.0[..8].copy_from_slice(&0x1111_1111_0000_00ff_u64.to_le_bytes());
    let mut p = vec![];
    p.extend(lddw(2, 0xffff_ffff_0000_0f0f));
    p.extend([
        atomic(op::W, op::ATOMIC_AND | op::FETCH, 1, 0, 2),
        mov64_reg(0, 2),
        exit(),
    ]);
    assert_eq!(both(&p, &mut mem), 0xff);
    assert_eq!(word(&mem, 0), 0x1111_1111_0000_000f);
}

#[test]
fn atomics_with_r0_as_base_or_source() {
    // The JIT's cmpxchg loops need rax (r0): every mix of r0 as base and source must agree.
    for imm in [
        op::ATOMIC_ADD,
        op::ATOMIC_OR | op::FETCH,
        op::ATOMIC_AND | op::FETCH,
        op::ATOMIC_XOR | op::FETCH,
        op::ATOMIC_ADD | op::FETCH,
        op::ATOMIC_XCHG,
        op::ATOMIC_CMPXCHG,
    ] {
        for size in [op::W, op::DW] {
            for (base, src) in [(1u8, 2u8), (0, 2), (1, 0), (0, 0), (3, 3)] {
                let mut mem = Mem([0; 64]);
                mem.0[16..24].copy_from_slice(&0x0f0f_f0f0_1234_5678_u64.to_le_bytes());
                let mut p = vec![];
                p.extend(lddw(2, 0x7777_0000_8888_1111));
                p.extend(lddw(0, 0x1234_5678));
                p.extend([
                    mov64_reg(9, 1),
                    mov64_reg(base, 9),
                    alu64_imm(op::ADD, base, 8),
                ]);
                if src != 2 && src != base {
                    p.extend(lddw(src, 0x7777_0000_8888_1111));
                }
                p.extend([
                    atomic(size, imm, base, 8, src),
                    stx(op::DW, 9, 32, src),
                    stx(op::DW, 9, 40, base),
                    alu64_reg(op::SUB, 0, 9),
                    exit(),
                ]);
                both(&p, &mut mem);
            }
        }
    }
}

#[test]
fn compare_and_exchange() {
    let init = 0x0123_4567_89ab_cdef_u64;
    let v = 0x1111_2222_3333_4444_u64;
    // (size, r0 before, memory after, r0 after)
    let rows = [
        (op::DW, init, v, init),
        (op::DW, 5, init, init),
        // 4 bytes compare the low half of r0 only, and zero-extend the old value into r0.
        (
            op::W,
            0xffff_0000_0000_0000 | (init & 0xffff_ffff),
            0x0123_4567_3333_4444,
            0x89ab_cdef,
        ),
        (op::W, 5, init, 0x89ab_cdef),
    ];
    for (size, before, mem_after, r0_after) in rows {
        let mut mem = Mem([0; 64]);
        mem.0[..8].copy_from_slice(&init.to_le_bytes());
        let mut p = vec![];
        p.extend(lddw(2, v));
        p.extend(lddw(0, before));
        p.extend([
            atomic(size, op::ATOMIC_CMPXCHG, 1, 0, 2),
            stx(op::DW, 1, 8, 2),
            exit(),
        ]);
        assert_eq!(both(&p, &mut mem), r0_after, "{}", listing(&p));
        assert_eq!(word(&mem, 0), mem_after, "{}", listing(&p));
        assert_eq!(word(&mem, 8), v, "source register changed");
    }
}

#[test]
fn registers_start_at_zero_and_r2_is_the_length() {
    assert_eq!(run(&[exit()]), 0);
    let mut p = vec![];
    for r in 3..10u8 {
        p.push(alu64_reg(op::OR, 0, r));
    }
    p.push(exit());
    assert_eq!(run(&p), 0);
    assert_eq!(run(&[mov64_reg(0, 2), exit()]), 64);
}

#[test]
fn calls_keep_callee_saved_registers_and_their_own_stacks() {
    let p = [
        mov64_imm(6, 6),
        st(op::DW, 10, -8, 100),
        call_local(4),
        ldx(op::DW, 3, 10, -8),
        alu64_reg(op::ADD, 0, 3),
        alu64_reg(op::ADD, 0, 6),
        exit(),
        // The callee: its own stack slot at -8, and r6 clobbered.
        st(op::DW, 10, -8, 1000),
        mov64_imm(6, 0),
        ldx(op::DW, 0, 10, -8),
        exit(),
    ];
    assert_eq!(run(&p), 1106);
}

/// Programs neither engine takes: both refuse them, without running anything.
#[test]
fn invalid_programs_are_errors_in_both_engines() {
    let call = |src: u8, imm: i32| insn(op::JMP | op::CALL, 0, src, 0, imm);
    let cases: Vec<(&str, Vec<Insn>)> = vec![
        ("empty", vec![]),
        (
            "callx (0x8d)",
            vec![insn(op::JMP | op::CALL | op::X, 2, 0, 0, 0), exit()],
        ),
        ("kfunc call", vec![call(op::PSEUDO_KFUNC_CALL, 1), exit()]),
        ("helper call (raw mode has none)", vec![call(0, 1), exit()]),
        ("unknown call kind", vec![call(3, 1), exit()]),
        (
            "call in JMP32",
            vec![insn(op::JMP32 | op::CALL, 0, 0, 0, 1), exit()],
        ),
        (
            "exit in JMP32",
            vec![insn(op::JMP32 | op::EXIT, 0, 0, 0, 0)],
        ),
        ("r10 written", vec![mov64_imm(10, 0), exit()]),
        ("r10 loaded", vec![ldx(op::DW, 10, 1, 0), exit()]),
        (
            "r10 fetched into",
            vec![atomic(op::DW, op::ATOMIC_ADD | op::FETCH, 1, 0, 10), exit()],
        ),
        ("r11", vec![mov64_imm(11, 0), exit()]),
        (
            "source register in a K form",
            vec![insn(op::ALU64 | op::ADD | op::K, 0, 3, 0, 1), exit()],
        ),
        (
            "immediate in an X form",
            vec![insn(op::ALU64 | op::ADD | op::X, 0, 3, 0, 1), exit()],
        ),
        (
            "neg with source bit",
            vec![insn(op::ALU64 | op::NEG | op::X, 0, 0, 0, 0), exit()],
        ),
        (
            "division offset 2",
            vec![insn(op::ALU64 | op::DIV | op::K, 0, 0, 2, 1), exit()],
        ),
        (
            "movsx 32 in ALU32",
            vec![insn(op::ALU | op::MOV | op::X, 0, 1, 32, 0), exit()],
        ),
        (
            "bswap with source bit",
            vec![insn(op::ALU64 | op::END | op::X, 0, 0, 0, 16), exit()],
        ),
        (
            "swap width 8",
            vec![insn(op::ALU | op::END | op::TO_BE, 0, 0, 0, 8), exit()],
        ),
        (
            "unknown ALU op",
            vec![insn(op::ALU64 | 0xe0, 0, 0, 0, 0), exit()],
        ),
        (
            "unknown jump op",
            vec![insn(op::JMP | 0xe0, 0, 0, 0, 0), exit()],
        ),
        (
            "8-byte sign-extending load",
            vec![insn(op::LDX | op::MEMSX | op::DW, 0, 1, 0, 0), exit()],
        ),
        (
            "legacy packet load",
            vec![insn(op::LD | 0x20 | op::W, 0, 0, 0, 0), exit()],
        ),
        (
            "atomic in ST",
            vec![insn(op::ST | op::ATOMIC | op::W, 1, 0, 0, 0), exit()],
        ),
        (
            "2-byte atomic",
            vec![insn(op::STX | op::ATOMIC | op::H, 1, 2, 0, 0), exit()],
        ),
        (
            "unknown atomic",
            vec![insn(op::STX | op::ATOMIC | op::DW, 1, 2, 0, 0x02), exit()],
        ),
        (
            "unresolved map reference",
            vec![
                insn(op::LDDW, 0, op::PSEUDO_MAP_FD, 0, 0),
                insn(0, 0, 0, 0, 0),
                exit(),
            ],
        ),
        (
            "lddw without second half",
            vec![exit(), insn(op::LDDW, 0, 0, 0, 0)],
        ),
        ("no exit at the end", vec![mov64_imm(0, 0)]),
        (
            "conditional jump last",
            vec![mov64_imm(0, 0), jmp_imm(op::JEQ, 0, 0, -2)],
        ),
        ("call last", vec![exit(), call(op::PSEUDO_CALL, -1)]),
        ("jump past the end", vec![ja(5), exit()]),
        ("jump before the start", vec![ja(-3), exit()]),
        ("gotol past the end", vec![gotol(1 << 30), exit()]),
        ("call past the end", vec![call(op::PSEUDO_CALL, 5), exit()]),
        ("call to the entry", vec![call(op::PSEUDO_CALL, -1), exit()]),
        (
            "jump into an lddw",
            vec![
                ja(1),
                insn(op::LDDW, 0, 0, 0, 0),
                insn(0, 0, 0, 0, 0),
                exit(),
            ],
        ),
        (
            "main runs into a function",
            vec![
                mov64_imm(0, 1),
                call(op::PSEUDO_CALL, 1),
                mov64_imm(0, 2),
                mov64_imm(0, 3),
                exit(),
            ],
        ),
        (
            "jump from main into a function",
            vec![
                call(op::PSEUDO_CALL, 2),
                jmp_imm(op::JEQ, 0, 0, 2),
                exit(),
                mov64_imm(0, 1),
                exit(),
            ],
        ),
        (
            "jump from a function back into main",
            vec![call(op::PSEUDO_CALL, 1), exit(), ja(-2)],
        ),
    ];
    for (what, p) in cases {
        let mut mem = Mem([0; 64]);
        let n = raw::run_interpreter(&p, &mut mem.0);
        assert!(
            matches!(n, Err(Fault::BadInsn { .. })),
            "{what}: interpreter gave {n:?}"
        );
        // SAFETY: the JIT must refuse the program before running anything.
        let j = unsafe { raw::run_jit(&p, &mut mem.0) };
        assert!(
            matches!(j, Err(RawError::Compile(_))),
            "{what}: JIT gave {j:?}"
        );
        assert_eq!(raw::check(&p), j.clone().map(|_| ()), "{what}");
        // Refused for the reason the case is about.
        let want = match what {
            "empty" => "empty program",
            "kfunc call" => "kfunc",
            "unresolved map reference" => "pseudo source",
            "helper call (raw mode has none)" => "no helper",
            "call past the end" => "call target",
            "call to the entry" => "entry",
            w if w.starts_with("r10") => "read only",
            w if w.starts_with("jump") || w.starts_with("gotol") => "jump target",
            "no exit at the end" | "conditional jump last" | "call last" => "does not end",
            "main runs into a function" => "does not end",
            _ => "invalid instruction",
        };
        let e = j.expect_err("refused").to_string();
        assert!(e.contains(want), "{what}: {e}");
    }
}

/// xorshift64*: reproducible random numbers without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random valid ALU instruction (any operation, width, form, sign-extension and swap).
fn random_alu(r: &mut Rng) -> Insn {
    let class = if r.below(2) == 0 { op::ALU } else { op::ALU64 };
    let d = r.below(10) as u8;
    let s = r.below(10) as u8;
    let imm = match r.below(4) {
        0 => r.next() as i32,
        1 => r.below(70) as i32 - 3,
        2 => [0, -1, i32::MIN, i32::MAX][r.below(4) as usize],
        _ => 1 << r.below(32),
    };
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
        op::END,
    ];
    let o = ops[r.below(ops.len() as u64) as usize];
    match o {
        op::NEG => insn(class | o, d, 0, 0, 0),
        op::END => {
            let src = if class == op::ALU {
                op::X * r.below(2) as u8
            } else {
                op::K
            };
            insn(class | o | src, d, 0, 0, [16, 32, 64][r.below(3) as usize])
        }
        _ => {
            let off = match o {
                op::DIV | op::MOD => r.below(2) as i16,
                op::MOV if class == op::ALU64 => [0, 8, 16, 32][r.below(4) as usize],
                op::MOV => [0, 8, 16][r.below(3) as usize],
                _ => 0,
            };
            if r.below(2) == 0 || (o == op::MOV && off != 0) {
                insn(class | o | op::X, d, s, off, 0)
            } else {
                insn(class | o | op::K, d, 0, off, imm)
            }
        }
    }
}

#[test]
fn random_alu_sequences_agree() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let edge = [
        0,
        1,
        u64::MAX,
        MIN64,
        MIN32,
        0xffff_ffff,
        0x7fff_ffff,
        0x80,
        0xff7f,
    ];
    for _ in 0..400 {
        let mut p = vec![];
        for reg in 0..10u8 {
            let v = if r.below(2) == 0 {
                edge[r.below(edge.len() as u64) as usize]
            } else {
                r.next()
            };
            p.extend(lddw(reg, v));
        }
        for _ in 0..24 {
            p.push(random_alu(&mut r));
        }
        // Fold every register into r0 so no difference hides.
        for reg in 1..10u8 {
            p.push(alu64_reg(op::XOR, 0, reg));
            p.push(alu64_imm(op::MUL, 0, 0x3b));
        }
        p.push(exit());
        run(&p);
    }
}

/// Random instruction words never make the raw interpreter (or the check) panic.
#[test]
fn random_programs_never_panic_the_interpreter() {
    let mut r = Rng(0xdead_beef_1234_5678);
    let mut ran = 0;
    for _ in 0..20_000 {
        let len = 1 + r.below(8) as usize;
        let mut p: Vec<Insn> = (0..len)
            .map(|_| match r.below(4) {
                // Any word at all.
                0 => Insn::decode(&r.next().to_le_bytes()),
                // Any code, registers in range, small offsets.
                1 => {
                    let mut x = Insn::decode(&r.next().to_le_bytes());
                    x.dst %= 11;
                    x.src %= 11;
                    x.off %= 8;
                    x
                }
                // Valid arithmetic, loads and stores near r1 or r10, jumps.
                2 => random_alu(&mut r),
                _ => {
                    let size = [op::B, op::H, op::W, op::DW][r.below(4) as usize];
                    let (base, off) = if r.below(2) == 0 {
                        (1, r.below(72) as i16 - 4)
                    } else {
                        (10, -(r.below(24) as i16))
                    };
                    let reg = r.below(10) as u8;
                    match r.below(5) {
                        0 => ldx(size, reg, base, off),
                        1 => ldsx(size, reg, base, off),
                        2 => stx(size, base, off, reg),
                        3 => atomic(size, r.below(0x100) as i32, base, off, reg),
                        _ => jmp_imm(op::JNE, reg, 0, r.below(4) as i16),
                    }
                }
            })
            .collect();
        p.push(exit());
        let mut mem = Mem([0; 64]);
        let _ = raw::check(&p);
        if raw::run_interpreter(&p, &mut mem.0).is_ok() {
            ran += 1;
        }
    }
    assert!(ran > 100, "only {ran} random programs ran to the end");
}

// ----------------------------------------------------------- the checking interpreter

fn checked(p: &[Insn], ctx: &mut [u8; 64], c: impl FnOnce(&Regions) -> Option<Fault>) {
    let regions = Regions(vec![(ctx.as_ptr() as usize, ctx.len())]);
    assert_eq!(
        interp::run(p, ctx.as_mut_ptr(), Some((&regions, 1000))).err(),
        c(&regions),
        "{}",
        listing(p)
    );
}

#[test]
fn reading_unwritten_stack_faults() {
    let mut ctx = [0u8; 64];
    let ld = |size: u8, off: i16| ldx(size, 0, 10, off);
    let fault = |pc, off, size| Some(Fault::UninitStackRead { pc, off, size });
    checked(&[ld(op::DW, -8), exit()], &mut ctx, |_| fault(0, -8, 8));
    // Half written is not written.
    let half = [st(op::W, 10, -8, 1), ld(op::DW, -8), exit()];
    checked(&half, &mut ctx, |_| fault(1, -8, 8));
    let whole = [st(op::W, 10, -8, 1), ld(op::W, -8), exit()];
    checked(&whole, &mut ctx, |_| None);
    let edge = [
        st(op::B, 10, -512, 1),
        ld(op::B, -512),
        ld(op::B, -511),
        exit(),
    ];
    checked(&edge, &mut ctx, |_| fault(2, -511, 1));
    // An atomic reads before it writes.
    let rmw = [
        mov64_imm(2, 1),
        atomic(op::DW, op::ATOMIC_ADD, 10, -16, 2),
        exit(),
    ];
    checked(&rmw, &mut ctx, |_| fault(1, -16, 8));
    // Each frame starts unwritten: the callee's -8 is not the caller's.
    let frames = [
        st(op::DW, 10, -8, 7),
        call_local(1),
        exit(),
        ld(op::DW, -8),
        exit(),
    ];
    checked(&frames, &mut ctx, |_| fault(3, -8, 8));
    // But the callee may read what the caller wrote, through a pointer.
    let through = [
        st(op::DW, 10, -8, 7),
        mov64_reg(1, 10),
        alu64_imm(op::ADD, 1, -8),
        call_local(1),
        exit(),
        ldx(op::DW, 0, 1, 0),
        exit(),
    ];
    let regions = Regions(vec![]);
    assert_eq!(
        interp::run(&through, ctx.as_mut_ptr(), Some((&regions, 100))),
        Ok(7)
    );
    // The raw interpreter checks it too; switched off, the read is allowed.
    assert_eq!(
        raw::run_interpreter(&[ld(op::DW, -8), exit()], &mut ctx),
        Err(Fault::UninitStackRead {
            pc: 0,
            off: -8,
            size: 8
        })
    );
    let off = Checked {
        uninit_stack: false,
        ..Checked::new(&regions, 100)
    };
    assert_eq!(
        interp::run_with(&[ld(op::DW, -8), exit()], 0, 0, Some(&off), &|_| None),
        Ok(0)
    );
}

#[test]
fn host_addresses_may_not_escape() {
    let mut ctx = [0u8; 64];
    // The stored or returned value is the address, which the test cannot know in advance:
    // compare the variant and pc only.
    let check = |p: &[Insn], ctx: &mut [u8; 64], want: Option<usize>| {
        let regions = Regions(vec![(ctx.as_ptr() as usize, ctx.len())]);
        let got = interp::run(p, ctx.as_mut_ptr(), Some((&regions, 1000)));
        match want {
            Some(pc) => assert!(
                matches!(got, Err(Fault::PointerEscape { pc: p, value }) if p == pc && value != 0),
                "{got:?}\n{}",
                listing(p)
            ),
            None => assert!(got.is_ok(), "{got:?}\n{}", listing(p)),
        }
    };
    check(&[stx(op::DW, 1, 0, 10), exit()], &mut ctx, Some(0));
    check(
        &[mov64_imm(0, 0), stx(op::DW, 1, 8, 1), exit()],
        &mut ctx,
        Some(1),
    );
    check(&[mov64_reg(0, 10), exit()], &mut ctx, Some(1));
    check(&[mov64_reg(0, 1), exit()], &mut ctx, Some(1));
    // One past the end of a region still points at it.
    check(
        &[mov64_reg(0, 1), alu64_imm(op::ADD, 0, 64), exit()],
        &mut ctx,
        Some(2),
    );
    // An atomic exchange leaves the address in memory.
    check(
        &[
            mov64_reg(3, 10),
            atomic(op::DW, op::ATOMIC_XCHG, 1, 16, 3),
            mov64_imm(0, 0),
            exit(),
        ],
        &mut ctx,
        Some(1),
    );
    // Spills to the stack are fine, as are small numbers and 4-byte stores.
    check(
        &[
            stx(op::DW, 10, -8, 10),
            stx(op::DW, 10, -16, 1),
            mov64_imm(0, 0),
            exit(),
        ],
        &mut ctx,
        None,
    );
    check(
        &[
            mov64_imm(2, 64),
            stx(op::DW, 1, 0, 2),
            mov64_reg(0, 2),
            exit(),
        ],
        &mut ctx,
        None,
    );
    check(
        &[stx(op::W, 1, 0, 10), mov64_imm(0, 0), exit()],
        &mut ctx,
        None,
    );
    // Switched off, an escape is not a fault.
    let regions = Regions(vec![(ctx.as_ptr() as usize, ctx.len())]);
    let off = Checked {
        pointer_escape: false,
        ..Checked::new(&regions, 100)
    };
    let r1 = ctx.as_mut_ptr() as u64;
    assert_eq!(
        interp::run_with(&[mov64_reg(0, 1), exit()], r1, 0, Some(&off), &|_| None),
        Ok(r1)
    );
}

#[test]
fn checked_runs_bound_call_depth() {
    let mut ctx = [0u8; 64];
    // A function that calls itself forever.
    let p = [call_local(1), exit(), call_local(-1), exit()];
    let regions = Regions(vec![]);
    assert!(matches!(
        interp::run(&p, ctx.as_mut_ptr(), Some((&regions, 1_000_000))),
        Err(Fault::CallDepth { .. })
    ));
}
