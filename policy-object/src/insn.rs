//! The BPF instruction set: encoding, classes, and a disassembler in the kernel's notation.

use std::fmt;

/// One 8-byte BPF instruction. A 64-bit immediate load (`lddw`) takes two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

// Classes.
pub const LD: u8 = 0x00;
pub const LDX: u8 = 0x01;
pub const ST: u8 = 0x02;
pub const STX: u8 = 0x03;
pub const ALU: u8 = 0x04;
pub const JMP: u8 = 0x05;
pub const JMP32: u8 = 0x06;
pub const ALU64: u8 = 0x07;

// Sizes (LD/LDX/ST/STX).
pub const W: u8 = 0x00;
pub const H: u8 = 0x08;
pub const B: u8 = 0x10;
pub const DW: u8 = 0x18;

// Modes.
pub const IMM: u8 = 0x00;
pub const MEM: u8 = 0x60;
pub const ATOMIC: u8 = 0xc0;

// Source.
pub const K: u8 = 0x00;
pub const X: u8 = 0x08;

// ALU operations.
pub const ADD: u8 = 0x00;
pub const SUB: u8 = 0x10;
pub const MUL: u8 = 0x20;
pub const DIV: u8 = 0x30;
pub const OR: u8 = 0x40;
pub const AND: u8 = 0x50;
pub const LSH: u8 = 0x60;
pub const RSH: u8 = 0x70;
pub const NEG: u8 = 0x80;
pub const MOD: u8 = 0x90;
pub const XOR: u8 = 0xa0;
pub const MOV: u8 = 0xb0;
pub const ARSH: u8 = 0xc0;
pub const END: u8 = 0xd0;

// Jump operations.
pub const JA: u8 = 0x00;
pub const JEQ: u8 = 0x10;
pub const JGT: u8 = 0x20;
pub const JGE: u8 = 0x30;
pub const JSET: u8 = 0x40;
pub const JNE: u8 = 0x50;
pub const JSGT: u8 = 0x60;
pub const JSGE: u8 = 0x70;
pub const CALL: u8 = 0x80;
pub const EXIT: u8 = 0x90;
pub const JLT: u8 = 0xa0;
pub const JLE: u8 = 0xb0;
pub const JSLT: u8 = 0xc0;
pub const JSLE: u8 = 0xd0;

// Atomic operations (imm of an ATOMIC store).
pub const FETCH: i32 = 0x01;
pub const ATOMIC_ADD: i32 = 0x00;
pub const ATOMIC_OR: i32 = 0x40;
pub const ATOMIC_AND: i32 = 0x50;
pub const ATOMIC_XOR: i32 = 0xa0;
pub const ATOMIC_XCHG: i32 = 0xe0 | FETCH;
pub const ATOMIC_CMPXCHG: i32 = 0xf0 | FETCH;

/// `lddw` src values.
pub const PSEUDO_MAP_FD: u8 = 1;
pub const PSEUDO_MAP_VALUE: u8 = 2;
/// `call` src value for a BPF-to-BPF call.
pub const PSEUDO_CALL: u8 = 1;

pub const LDDW: u8 = LD | IMM | DW;

impl Insn {
    pub fn decode(b: &[u8; 8]) -> Insn {
        Insn {
            code: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    pub fn encode(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = (self.dst & 0x0f) | (self.src << 4);
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }

    pub fn class(&self) -> u8 {
        self.code & 0x07
    }
    /// ALU/JMP operation bits.
    pub fn op(&self) -> u8 {
        self.code & 0xf0
    }
    /// LD/ST size bits.
    pub fn size_bits(&self) -> u8 {
        self.code & 0x18
    }
    /// LD/ST mode bits.
    pub fn mode(&self) -> u8 {
        self.code & 0xe0
    }
    pub fn is_reg_src(&self) -> bool {
        self.code & 0x08 == X
    }
    pub fn is_lddw(&self) -> bool {
        self.code == LDDW
    }
    /// Bytes moved by a load or store.
    pub fn access_size(&self) -> usize {
        match self.size_bits() {
            W => 4,
            H => 2,
            B => 1,
            _ => 8,
        }
    }
}

/// Decodes a byte slice (multiple of 8) into instructions.
pub fn decode_all(bytes: &[u8]) -> Option<Vec<Insn>> {
    if !bytes.len().is_multiple_of(8) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| Insn::decode(c.try_into().expect("8 bytes")))
            .collect(),
    )
}

fn size_name(bits: u8) -> &'static str {
    match bits {
        W => "u32",
        H => "u16",
        B => "u8",
        _ => "u64",
    }
}

fn alu_sym(op: u8) -> &'static str {
    match op {
        ADD => "+=",
        SUB => "-=",
        MUL => "*=",
        DIV => "/=",
        OR => "|=",
        AND => "&=",
        LSH => "<<=",
        RSH => ">>=",
        MOD => "%=",
        XOR => "^=",
        MOV => "=",
        ARSH => "s>>=",
        _ => "?=",
    }
}

fn jmp_sym(op: u8) -> &'static str {
    match op {
        JEQ => "==",
        JGT => ">",
        JGE => ">=",
        JSET => "&",
        JNE => "!=",
        JSGT => "s>",
        JSGE => "s>=",
        JLT => "<",
        JLE => "<=",
        JSLT => "s<",
        JSLE => "s<=",
        _ => "?",
    }
}

/// An instruction (and, for `lddw`, its second half) in the kernel verifier's notation.
pub struct Disasm<'a> {
    pub insn: &'a Insn,
    pub next: Option<&'a Insn>,
}

impl fmt::Display for Disasm<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = self.insn;
        let (d, s) = (i.dst, i.src);
        match i.class() {
            ALU | ALU64 => {
                let r = if i.class() == ALU64 { "r" } else { "w" };
                match i.op() {
                    NEG => write!(f, "{r}{d} = -{r}{d}"),
                    END => {
                        let order = if i.is_reg_src() { "be" } else { "le" };
                        write!(f, "r{d} = {order}{} r{d}", i.imm)
                    }
                    op if i.is_reg_src() => write!(f, "{r}{d} {} {r}{s}", alu_sym(op)),
                    op => write!(f, "{r}{d} {} {}", alu_sym(op), i.imm),
                }
            }
            JMP | JMP32 => {
                let r = if i.class() == JMP { "r" } else { "w" };
                match i.op() {
                    JA => write!(f, "goto {:+}", i.off),
                    CALL if s == PSEUDO_CALL => write!(f, "call pc{:+}", i.imm),
                    CALL => write!(f, "call {}", i.imm),
                    EXIT => write!(f, "exit"),
                    op if i.is_reg_src() => {
                        write!(f, "if {r}{d} {} {r}{s} goto {:+}", jmp_sym(op), i.off)
                    }
                    op => write!(f, "if {r}{d} {} {:#x} goto {:+}", jmp_sym(op), i.imm, i.off),
                }
            }
            LDX => write!(
                f,
                "r{d} = *({} *)(r{s} {:+})",
                size_name(i.size_bits()),
                i.off
            ),
            STX if i.mode() == ATOMIC => {
                let sz = size_name(i.size_bits());
                match i.imm {
                    ATOMIC_CMPXCHG => {
                        write!(f, "r0 = cmpxchg(({sz} *)(r{d} {:+}), r0, r{s})", i.off)
                    }
                    ATOMIC_XCHG => write!(f, "r{s} = xchg(({sz} *)(r{d} {:+}), r{s})", i.off),
                    op => {
                        let name = match op & !FETCH {
                            ATOMIC_ADD => "add",
                            ATOMIC_OR => "or",
                            ATOMIC_AND => "and",
                            ATOMIC_XOR => "xor",
                            _ => "?",
                        };
                        let fetch = if op & FETCH != 0 { "fetch_" } else { "" };
                        write!(f, "lock {fetch}{name} *({sz} *)(r{d} {:+}), r{s}", i.off)
                    }
                }
            }
            STX => write!(
                f,
                "*({} *)(r{d} {:+}) = r{s}",
                size_name(i.size_bits()),
                i.off
            ),
            ST => write!(
                f,
                "*({} *)(r{d} {:+}) = {}",
                size_name(i.size_bits()),
                i.off,
                i.imm
            ),
            LD if i.is_lddw() => {
                let hi = self.next.map_or(0, |n| n.imm as u32 as u64);
                let v = (hi << 32) | (i.imm as u32 as u64);
                match s {
                    PSEUDO_MAP_FD => write!(f, "r{d} = map[{}] ll", i.imm),
                    PSEUDO_MAP_VALUE => write!(f, "r{d} = map_value[{}] + {} ll", i.imm, hi),
                    _ => write!(f, "r{d} = {v:#x} ll"),
                }
            }
            _ => write!(f, "(bad opcode {:#04x})", i.code),
        }
    }
}

/// Disassembles instruction `pc` of `insns`.
pub fn disasm(insns: &[Insn], pc: usize) -> String {
    match insns.get(pc) {
        Some(i) => Disasm {
            insn: i,
            next: insns.get(pc + 1),
        }
        .to_string(),
        None => format!("(no instruction {pc})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_notation() {
        let i = Insn {
            code: STX | MEM | W,
            dst: 10,
            src: 1,
            off: -4,
            imm: 0,
        };
        assert_eq!(Insn::decode(&i.encode()), i);
        assert_eq!(
            Disasm {
                insn: &i,
                next: None
            }
            .to_string(),
            "*(u32 *)(r10 -4) = r1"
        );
        let a = Insn {
            code: STX | ATOMIC | DW,
            dst: 0,
            src: 1,
            off: 8,
            imm: ATOMIC_ADD,
        };
        assert_eq!(
            Disasm {
                insn: &a,
                next: None
            }
            .to_string(),
            "lock add *(u64 *)(r0 +8), r1"
        );
        let j = Insn {
            code: JMP32 | JGT | K,
            dst: 1,
            src: 0,
            off: 4,
            imm: 7,
        };
        assert_eq!(
            Disasm {
                insn: &j,
                next: None
            }
            .to_string(),
            "if w1 > 0x7 goto +4"
        );
        let m = Insn {
            code: LDDW,
            dst: 1,
            src: PSEUDO_MAP_FD,
            off: 0,
            imm: 2,
        };
        assert_eq!(
            Disasm {
                insn: &m,
                next: Some(&Insn::default())
            }
            .to_string(),
            "r1 = map[2] ll"
        );
        assert!(decode_all(&[0u8; 7]).is_none());
    }
}
