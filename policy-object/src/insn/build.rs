//! Constructors for single instructions, for tests and generators that build bytecode by hand.
//!
//! Each is named for what it encodes and leaves every field the instruction does not use at
//! zero, so what it returns is a valid RFC 9669 encoding whenever its operands are (sizes,
//! operations and registers come from [`super`]'s constants). Operands come in the order the
//! kernel's notation ([`super::disasm`]) prints them: `stx(DW, 10, -8, 1)` is
//! `*(u64 *)(r10 -8) = r1`, `jmp_imm(JGT, 1, 7, 2)` is `if r1 > 0x7 goto +2`. Deliberately
//! malformed encodings are built with [`insn`].
//!
//! ```
//! use policy_object::asm::assemble;
//! use policy_object::insn::{self as op, build::*};
//!
//! let mut p = vec![mov64_imm(0, 1), st(op::W, 10, -4, 7)];
//! p.extend(ld_map(1, 0));
//! p.extend([call(1), exit()]);
//! let text = "mov %r0, 1\nstw [%r10-4], 7\nlddw %r1, 0\ncall 1\nexit";
//! let mut want = assemble(text).unwrap();
//! want[2].src = op::PSEUDO_MAP_FD;
//! assert_eq!(p, want);
//! ```

use super::*;

/// Any instruction, field by field (also the malformed ones the other constructors won't make).
pub const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        dst,
        src,
        off,
        imm,
    }
}

// ---------------------------------------------------------------- ALU

/// `dst op= imm` on 64 bits (`op` one of [`ADD`] … [`ARSH`]).
pub const fn alu64_imm(op: u8, dst: u8, imm: i32) -> Insn {
    insn(ALU64 | op | K, dst, 0, 0, imm)
}
/// `dst op= src` on 64 bits.
pub const fn alu64_reg(op: u8, dst: u8, src: u8) -> Insn {
    insn(ALU64 | op | X, dst, src, 0, 0)
}
/// `wdst op= imm` (32 bits, the result zero-extended).
pub const fn alu32_imm(op: u8, dst: u8, imm: i32) -> Insn {
    insn(ALU | op | K, dst, 0, 0, imm)
}
/// `wdst op= wsrc` (32 bits, the result zero-extended).
pub const fn alu32_reg(op: u8, dst: u8, src: u8) -> Insn {
    insn(ALU | op | X, dst, src, 0, 0)
}
/// `dst = imm` (sign-extended to 64 bits).
pub const fn mov64_imm(dst: u8, imm: i32) -> Insn {
    alu64_imm(MOV, dst, imm)
}
/// `dst = src`.
pub const fn mov64_reg(dst: u8, src: u8) -> Insn {
    alu64_reg(MOV, dst, src)
}
/// `wdst = imm` (upper half zeroed).
pub const fn mov32_imm(dst: u8, imm: i32) -> Insn {
    alu32_imm(MOV, dst, imm)
}
/// `wdst = wsrc` (upper half zeroed).
pub const fn mov32_reg(dst: u8, src: u8) -> Insn {
    alu32_reg(MOV, dst, src)
}
/// `dst = (s<bits>)src`: the low `bits` (8, 16 or 32) of `src`, sign-extended to 64 bits.
pub const fn movsx64(dst: u8, src: u8, bits: i16) -> Insn {
    insn(ALU64 | MOV | X, dst, src, bits, 0)
}
/// `wdst = (s<bits>)wsrc`: the low `bits` (8 or 16) of `src`, sign-extended to 32 bits.
pub const fn movsx32(dst: u8, src: u8, bits: i16) -> Insn {
    insn(ALU | MOV | X, dst, src, bits, 0)
}
/// `dst = -dst`.
pub const fn neg64(dst: u8) -> Insn {
    insn(ALU64 | NEG, dst, 0, 0, 0)
}
/// `wdst = -wdst`.
pub const fn neg32(dst: u8) -> Insn {
    insn(ALU | NEG, dst, 0, 0, 0)
}
/// `dst = bswap<width> dst`: unconditional byte swap of the low `width` (16, 32, 64) bits.
pub const fn bswap(dst: u8, width: i32) -> Insn {
    insn(ALU64 | END, dst, 0, 0, width)
}
/// `dst = le<width> dst`: the low `width` bits read as little-endian (a truncation here).
pub const fn to_le(dst: u8, width: i32) -> Insn {
    insn(ALU | END | TO_LE, dst, 0, 0, width)
}
/// `dst = be<width> dst`: the low `width` bits read as big-endian (a swap here).
pub const fn to_be(dst: u8, width: i32) -> Insn {
    insn(ALU | END | TO_BE, dst, 0, 0, width)
}

// ---------------------------------------------------------------- memory

/// `dst = *(size *)(src + off)`, zero-extended (`size` one of [`B`], [`H`], [`W`], [`DW`]).
pub const fn ldx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    insn(LDX | MEM | size, dst, src, off, 0)
}
/// `dst = *(s<size> *)(src + off)`, sign-extended (`size` one of [`B`], [`H`], [`W`]).
pub const fn ldsx(size: u8, dst: u8, src: u8, off: i16) -> Insn {
    insn(LDX | MEMSX | size, dst, src, off, 0)
}
/// `*(size *)(dst + off) = src`.
pub const fn stx(size: u8, dst: u8, off: i16, src: u8) -> Insn {
    insn(STX | MEM | size, dst, src, off, 0)
}
/// `*(size *)(dst + off) = imm`.
pub const fn st(size: u8, dst: u8, off: i16, imm: i32) -> Insn {
    insn(ST | MEM | size, dst, 0, off, imm)
}
/// `lock <op> *(size *)(dst + off), src`: `op` one of [`ATOMIC_ADD`], [`ATOMIC_OR`],
/// [`ATOMIC_AND`], [`ATOMIC_XOR`] (each optionally `| FETCH`, which returns the old value in
/// `src`), [`ATOMIC_XCHG`] or [`ATOMIC_CMPXCHG`] (compares with r0, the old value in r0);
/// `size` [`W`] or [`DW`].
pub const fn atomic(size: u8, op: i32, dst: u8, off: i16, src: u8) -> Insn {
    insn(STX | ATOMIC | size, dst, src, off, op)
}

/// `dst = imm ll`: the two-slot 64-bit immediate load.
pub const fn lddw(dst: u8, imm: u64) -> [Insn; 2] {
    [
        insn(LDDW, dst, 0, 0, imm as u32 as i32),
        insn(0, 0, 0, 0, (imm >> 32) as u32 as i32),
    ]
}
/// `dst = map[map] ll`: the address of the object's map number `map` (`lddw` src 1).
pub const fn ld_map(dst: u8, map: i32) -> [Insn; 2] {
    [insn(LDDW, dst, PSEUDO_MAP_FD, 0, map), insn(0, 0, 0, 0, 0)]
}
/// `dst = map_value[map] + off ll`: the address `off` bytes into the single value of map
/// number `map` (global data; `lddw` src 2, the offset in the second half).
pub const fn ld_map_value(dst: u8, map: i32, off: i32) -> [Insn; 2] {
    [
        insn(LDDW, dst, PSEUDO_MAP_VALUE, 0, map),
        insn(0, 0, 0, 0, off),
    ]
}

// ---------------------------------------------------------------- control flow

/// `if dst op imm goto off` (`op` one of [`JEQ`] … [`JSLE`]), comparing 64 bits.
pub const fn jmp_imm(op: u8, dst: u8, imm: i32, off: i16) -> Insn {
    insn(JMP | op | K, dst, 0, off, imm)
}
/// `if dst op src goto off`, comparing 64 bits.
pub const fn jmp_reg(op: u8, dst: u8, src: u8, off: i16) -> Insn {
    insn(JMP | op | X, dst, src, off, 0)
}
/// `if wdst op imm goto off`, comparing the low 32 bits.
pub const fn jmp32_imm(op: u8, dst: u8, imm: i32, off: i16) -> Insn {
    insn(JMP32 | op | K, dst, 0, off, imm)
}
/// `if wdst op wsrc goto off`, comparing the low 32 bits.
pub const fn jmp32_reg(op: u8, dst: u8, src: u8, off: i16) -> Insn {
    insn(JMP32 | op | X, dst, src, off, 0)
}
/// `goto off`: to the instruction `off + 1` slots on.
pub const fn ja(off: i16) -> Insn {
    insn(JMP | JA, 0, 0, off, 0)
}
/// `gotol imm`: the long jump (class JMP32, its offset in the immediate).
pub const fn gotol(imm: i32) -> Insn {
    insn(JMP32 | JA, 0, 0, 0, imm)
}
/// `call helper`: helper function number `helper`.
pub const fn call(helper: i32) -> Insn {
    insn(JMP | CALL, 0, 0, 0, helper)
}
/// `call pc+rel`: a BPF-to-BPF call to the instruction `rel + 1` slots on (src 1).
pub const fn call_local(rel: i32) -> Insn {
    insn(JMP | CALL, 0, PSEUDO_CALL, 0, rel)
}
/// `exit`: return r0.
pub const fn exit() -> Insn {
    insn(JMP | EXIT, 0, 0, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asm::assemble;

    /// Each constructor against the assembler and, through the disassembler, the notation.
    #[test]
    fn constructors_encode_what_the_assembler_does() {
        let one = |text: &str| {
            let v = assemble(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(v.len(), 1, "{text}");
            v[0]
        };
        let rows: &[(Insn, &str, &str)] = &[
            (mov64_imm(0, 1), "mov %r0, 1", "r0 = 1"),
            (mov64_imm(3, -1), "mov %r3, -1", "r3 = -1"),
            (mov64_reg(6, 1), "mov %r6, %r1", "r6 = r1"),
            (mov32_imm(2, 7), "mov32 %r2, 7", "w2 = 7"),
            (mov32_reg(2, 9), "mov32 %r2, %r9", "w2 = w9"),
            (movsx64(0, 9, 32), "movsx3264 %r0, %r9", "r0 = (s32)r9"),
            (movsx64(1, 2, 8), "movsx864 %r1, %r2", "r1 = (s8)r2"),
            (movsx32(4, 5, 16), "movsx1632 %r4, %r5", "w4 = (s16)w5"),
            (alu64_imm(ADD, 2, -4), "add %r2, -4", "r2 += -4"),
            (alu64_imm(AND, 1, 7), "and %r1, 7", "r1 &= 7"),
            (alu64_reg(SUB, 1, 2), "sub %r1, %r2", "r1 -= r2"),
            (alu64_reg(ARSH, 3, 4), "arsh %r3, %r4", "r3 s>>= r4"),
            (alu32_imm(LSH, 1, 3), "lsh32 %r1, 3", "w1 <<= 3"),
            (alu32_reg(XOR, 1, 2), "xor32 %r1, %r2", "w1 ^= w2"),
            (neg64(5), "neg %r5", "r5 = -r5"),
            (neg32(5), "neg32 %r5", "w5 = -w5"),
            (bswap(6, 16), "bswap16 %r6", "r6 = bswap16 r6"),
            (to_le(6, 64), "le64 %r6", "r6 = le64 r6"),
            (to_be(6, 32), "be32 %r6", "r6 = be32 r6"),
            (ldx(B, 0, 1, 3), "ldxb %r0, [%r1+3]", "r0 = *(u8 *)(r1 +3)"),
            (ldx(H, 0, 1, 2), "ldxh %r0, [%r1+2]", "r0 = *(u16 *)(r1 +2)"),
            (
                ldx(W, 2, 10, -4),
                "ldxw %r2, [%r10-4]",
                "r2 = *(u32 *)(r10 -4)",
            ),
            (
                ldx(DW, 0, 1, 8),
                "ldxdw %r0, [%r1+8]",
                "r0 = *(u64 *)(r1 +8)",
            ),
            (
                ldsx(B, 2, 1, -3),
                "ldxsb %r2, [%r1-3]",
                "r2 = *(s8 *)(r1 -3)",
            ),
            (
                ldsx(H, 2, 1, 4),
                "ldxsh %r2, [%r1+4]",
                "r2 = *(s16 *)(r1 +4)",
            ),
            (
                ldsx(W, 2, 10, -8),
                "ldxsw %r2, [%r10-8]",
                "r2 = *(s32 *)(r10 -8)",
            ),
            (stx(B, 1, 0, 2), "stxb [%r1], %r2", "*(u8 *)(r1 +0) = r2"),
            (stx(H, 1, 6, 2), "stxh [%r1+6], %r2", "*(u16 *)(r1 +6) = r2"),
            (
                stx(W, 10, -4, 1),
                "stxw [%r10-4], %r1",
                "*(u32 *)(r10 -4) = r1",
            ),
            (
                stx(DW, 10, -8, 1),
                "stxdw [%r10-8], %r1",
                "*(u64 *)(r10 -8) = r1",
            ),
            (st(B, 10, -1, 7), "stb [%r10-1], 7", "*(u8 *)(r10 -1) = 7"),
            (st(H, 10, -2, 7), "sth [%r10-2], 7", "*(u16 *)(r10 -2) = 7"),
            (st(W, 10, -4, 7), "stw [%r10-4], 7", "*(u32 *)(r10 -4) = 7"),
            (
                st(DW, 10, -8, -1),
                "stdw [%r10-8], -1",
                "*(u64 *)(r10 -8) = -1",
            ),
            (
                atomic(DW, ATOMIC_ADD, 0, 8, 1),
                "lock add [%r0+8], %r1",
                "lock add *(u64 *)(r0 +8), r1",
            ),
            (
                atomic(W, ATOMIC_AND | FETCH, 1, 0, 2),
                "lock fetch and32 [%r1+0], %r2",
                "lock fetch_and *(u32 *)(r1 +0), r2",
            ),
            (
                atomic(DW, ATOMIC_XCHG, 1, -8, 2),
                "lock xchg [%r1-8], %r2",
                "r2 = xchg((u64 *)(r1 -8), r2)",
            ),
            (
                atomic(W, ATOMIC_CMPXCHG, 10, -4, 3),
                "lock cmpxchg32 [%r10-4], %r3",
                "r0 = cmpxchg((u32 *)(r10 -4), r0, r3)",
            ),
            (
                jmp_imm(JEQ, 1, 2, 3),
                "jeq %r1, 2, +3",
                "if r1 == 0x2 goto +3",
            ),
            (
                jmp_imm(JNE, 0, 0, -2),
                "jne %r0, 0, -2",
                "if r0 != 0x0 goto -2",
            ),
            (
                jmp_reg(JGT, 1, 2, 1),
                "jgt %r1, %r2, +1",
                "if r1 > r2 goto +1",
            ),
            (
                jmp32_imm(JSLT, 1, -1, 4),
                "jslt32 %r1, -1, +4",
                "if w1 s< 0xffffffff goto +4",
            ),
            (
                jmp32_reg(JSLE, 1, 2, -1),
                "jsle32 %r1, %r2, -1",
                "if w1 s<= w2 goto -1",
            ),
            (ja(3), "ja +3", "goto +3"),
            (ja(-1), "ja -1", "goto -1"),
            (gotol(-70000), "gotol -70000", "gotol -70000"),
            (call(1), "call 1", "call 1"),
            (exit(), "exit", "exit"),
        ];
        for &(i, text, notation) in rows {
            assert_eq!(i, one(text), "{text}");
            assert_eq!(disasm(&[i], 0), notation, "{text}");
            assert_eq!(encoding_error(&i, None), None, "{text}");
        }
    }

    #[test]
    fn calls_and_wide_loads() {
        // The assembler resolves local calls by label: `call local f` to the next slot but one.
        let local = assemble("call local f\nexit\nf:\nexit").unwrap();
        assert_eq!(call_local(1), local[0]);
        assert_eq!(disasm(&[call_local(-3)], 0), "call pc-3");

        let imm = lddw(1, 0x1122_3344_5566_7788);
        assert_eq!(
            imm.to_vec(),
            assemble("lddw %r1, 0x1122334455667788").unwrap()
        );
        assert_eq!(disasm(&imm, 0), "r1 = 0x1122334455667788 ll");
        assert_eq!(lddw(0, u64::MAX)[1].imm, -1);

        let map = ld_map(1, 2);
        assert_eq!(map, [insn(LDDW, 1, PSEUDO_MAP_FD, 0, 2), Insn::default()]);
        assert_eq!(disasm(&map, 0), "r1 = map[2] ll");

        let value = ld_map_value(3, 4, 8);
        assert_eq!(
            value,
            [insn(LDDW, 3, PSEUDO_MAP_VALUE, 0, 4), insn(0, 0, 0, 0, 8)]
        );
        assert_eq!(disasm(&value, 0), "r3 = map_value[4] + 8 ll");
        for pair in [imm, map, value] {
            assert_eq!(encoding_error(&pair[0], Some(&pair[1])), None);
        }
        assert_eq!(
            insn(0x8d, 1, 2, 3, 4),
            Insn {
                code: 0x8d,
                dst: 1,
                src: 2,
                off: 3,
                imm: 4
            }
        );
    }
}
