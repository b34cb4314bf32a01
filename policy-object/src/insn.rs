//! The BPF instruction set: encoding, classes, and a disassembler in the kernel's notation.

use std::fmt;

pub mod build;

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
/// Sign-extending load (`LDX` only; sizes B, H, W).
pub const MEMSX: u8 = 0x80;
pub const ATOMIC: u8 = 0xc0;

// Source.
pub const K: u8 = 0x00;
pub const X: u8 = 0x08;
/// `END` of class `ALU`: the source bit picks the byte order (`ALU64` `END` is `bswap`).
pub const TO_LE: u8 = 0x00;
pub const TO_BE: u8 = 0x08;

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
/// `off` of `DIV`/`MOD` selecting the signed forms (`sdiv`, `smod`).
pub const OFF_SIGNED: i16 = 1;

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
/// `call` src value for a call to a kernel function by BTF id (not supported here).
pub const PSEUDO_KFUNC_CALL: u8 = 2;

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

/// Why `i` is not an instruction RFC 9669 defines, or `None` when it is one. Fields an
/// instruction does not use must be zero; register numbers are at most 10. For `lddw`, `next`
/// is its second half (code, registers and offset zero). Call kinds 0–2 and every `lddw`
/// source 0–6 are valid encodings here, whether or not an engine supports them; `callx`
/// (`JMP | CALL | X`, code 0x8d) is not in RFC 9669 and is reported.
pub fn encoding_error(i: &Insn, next: Option<&Insn>) -> Option<&'static str> {
    if i.dst > 10 {
        return Some("register number above r10");
    }
    // The operand: a register (imm unused) or an immediate (src unused).
    let operand = |i: &Insn| -> Option<&'static str> {
        if i.is_reg_src() {
            if i.src > 10 {
                Some("register number above r10")
            } else if i.imm != 0 {
                Some("immediate set in a register-source instruction")
            } else {
                None
            }
        } else if i.src != 0 {
            Some("source register set in an immediate-source instruction")
        } else {
            None
        }
    };
    let off_zero = |i: &Insn| (i.off != 0).then_some("offset set where none is used");
    match i.class() {
        ALU | ALU64 => {
            let is64 = i.class() == ALU64;
            match i.op() {
                ADD | SUB | MUL | OR | AND | LSH | RSH | XOR | ARSH => {
                    off_zero(i).or_else(|| operand(i))
                }
                DIV | MOD => {
                    if i.off != 0 && i.off != OFF_SIGNED {
                        Some("division offset other than 0 (unsigned) or 1 (signed)")
                    } else {
                        operand(i)
                    }
                }
                MOV => {
                    let ok: &[i16] = match (i.is_reg_src(), is64) {
                        (false, _) => &[0],
                        (true, true) => &[0, 8, 16, 32],
                        (true, false) => &[0, 8, 16],
                    };
                    if !ok.contains(&i.off) {
                        Some("sign-extension width not valid for this mov")
                    } else {
                        operand(i)
                    }
                }
                NEG => {
                    if i.is_reg_src() || i.src != 0 || i.off != 0 || i.imm != 0 {
                        Some("neg uses neither a source nor an immediate")
                    } else {
                        None
                    }
                }
                END => {
                    if is64 && i.is_reg_src() {
                        Some("64-bit byte swap with the source bit set")
                    } else if i.src != 0 || i.off != 0 {
                        Some("byte swap with a source register or offset")
                    } else if ![16, 32, 64].contains(&i.imm) {
                        Some("byte swap width other than 16, 32 or 64")
                    } else {
                        None
                    }
                }
                _ => Some("unknown ALU operation"),
            }
        }
        JMP | JMP32 => {
            let is32 = i.class() == JMP32;
            match i.op() {
                JA => {
                    if i.is_reg_src() || i.src != 0 || i.dst != 0 {
                        Some("goto with registers")
                    } else if is32 && i.off != 0 {
                        Some("gotol with an offset (its target is in imm)")
                    } else if !is32 && i.imm != 0 {
                        Some("goto with an immediate (its target is in off)")
                    } else {
                        None
                    }
                }
                CALL | EXIT if is32 => Some("call/exit in the JMP32 class"),
                CALL if i.is_reg_src() => Some("callx (call by register) is not supported"),
                CALL => {
                    if i.dst != 0 || i.off != 0 {
                        Some("call with a destination register or offset")
                    } else if i.src > PSEUDO_KFUNC_CALL {
                        Some("unknown call kind")
                    } else {
                        None
                    }
                }
                EXIT => {
                    if i.is_reg_src() || i.dst != 0 || i.src != 0 || i.off != 0 || i.imm != 0 {
                        Some("exit with operands")
                    } else {
                        None
                    }
                }
                JEQ | JGT | JGE | JSET | JNE | JSGT | JSGE | JLT | JLE | JSLT | JSLE => operand(i),
                _ => Some("unknown jump operation"),
            }
        }
        LD => {
            if !i.is_lddw() {
                return Some("legacy packet access or unknown load");
            }
            if i.off != 0 {
                return Some("lddw with an offset");
            }
            if i.src > 6 {
                return Some("unknown lddw source");
            }
            match next {
                None => Some("lddw without its second half"),
                Some(n) if n.code != 0 || n.dst != 0 || n.src != 0 || n.off != 0 => {
                    Some("malformed second half of lddw")
                }
                Some(_) => None,
            }
        }
        LDX => {
            let sx_ok = i.mode() == MEMSX && i.size_bits() != DW;
            if i.mode() != MEM && !sx_ok {
                Some("unknown load mode")
            } else if i.src > 10 {
                Some("register number above r10")
            } else if i.imm != 0 {
                Some("immediate set in a load")
            } else {
                None
            }
        }
        ST => {
            if i.mode() != MEM {
                Some("unknown store mode")
            } else if i.src != 0 {
                Some("source register set in an immediate store")
            } else {
                None
            }
        }
        _ => {
            if i.src > 10 {
                return Some("register number above r10");
            }
            match i.mode() {
                MEM if i.imm != 0 => Some("immediate set in a register store"),
                MEM => None,
                ATOMIC => {
                    if !matches!(i.size_bits(), W | DW) {
                        Some("atomic operation of 1 or 2 bytes")
                    } else if !matches!(
                        i.imm & !FETCH,
                        ATOMIC_ADD | ATOMIC_OR | ATOMIC_AND | ATOMIC_XOR
                    ) && i.imm != ATOMIC_XCHG
                        && i.imm != ATOMIC_CMPXCHG
                    {
                        Some("unknown atomic operation")
                    } else {
                        None
                    }
                }
                _ => Some("unknown store mode"),
            }
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
                let sym = match i.op() {
                    DIV if i.off == OFF_SIGNED => "s/=",
                    MOD if i.off == OFF_SIGNED => "s%=",
                    op => alu_sym(op),
                };
                match i.op() {
                    NEG => write!(f, "{r}{d} = -{r}{d}"),
                    END if i.class() == ALU64 => write!(f, "r{d} = bswap{} r{d}", i.imm),
                    END => {
                        let order = if i.is_reg_src() { "be" } else { "le" };
                        write!(f, "r{d} = {order}{} r{d}", i.imm)
                    }
                    MOV if i.is_reg_src() && i.off != 0 => {
                        write!(f, "{r}{d} = (s{}){r}{s}", i.off)
                    }
                    _ if i.is_reg_src() => write!(f, "{r}{d} {sym} {r}{s}"),
                    _ => write!(f, "{r}{d} {sym} {}", i.imm),
                }
            }
            JMP | JMP32 => {
                let r = if i.class() == JMP { "r" } else { "w" };
                match i.op() {
                    JA if i.class() == JMP32 => write!(f, "gotol {:+}", i.imm),
                    JA => write!(f, "goto {:+}", i.off),
                    CALL if i.is_reg_src() => write!(f, "callx r{d}"),
                    CALL if s == PSEUDO_CALL => write!(f, "call pc{:+}", i.imm),
                    CALL if s == PSEUDO_KFUNC_CALL => write!(f, "call kfunc#{}", i.imm),
                    CALL => write!(f, "call {}", i.imm),
                    EXIT => write!(f, "exit"),
                    op if i.is_reg_src() => {
                        write!(f, "if {r}{d} {} {r}{s} goto {:+}", jmp_sym(op), i.off)
                    }
                    op => write!(f, "if {r}{d} {} {:#x} goto {:+}", jmp_sym(op), i.imm, i.off),
                }
            }
            LDX if i.mode() == MEMSX => write!(
                f,
                "r{d} = *({} *)(r{s} {:+})",
                size_name(i.size_bits()).replace('u', "s"),
                i.off
            ),
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

    fn ins(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            dst,
            src,
            off,
            imm,
        }
    }

    fn text(i: Insn) -> String {
        Disasm {
            insn: &i,
            next: None,
        }
        .to_string()
    }

    #[test]
    fn v4_notation() {
        let rows = [
            (ins(ALU64 | DIV | X, 1, 2, OFF_SIGNED, 0), "r1 s/= r2"),
            (ins(ALU | MOD | K, 3, 0, OFF_SIGNED, -7), "w3 s%= -7"),
            (ins(ALU64 | DIV | K, 3, 0, 0, 5), "r3 /= 5"),
            (ins(ALU64 | MOV | X, 0, 9, 32, 0), "r0 = (s32)r9"),
            (ins(ALU | MOV | X, 4, 5, 8, 0), "w4 = (s8)w5"),
            (ins(ALU64 | END | K, 6, 0, 0, 16), "r6 = bswap16 r6"),
            (ins(ALU | END | TO_BE, 6, 0, 0, 32), "r6 = be32 r6"),
            (ins(ALU | END | TO_LE, 6, 0, 0, 64), "r6 = le64 r6"),
            (ins(LDX | MEMSX | B, 2, 1, -3, 0), "r2 = *(s8 *)(r1 -3)"),
            (ins(LDX | MEMSX | H, 2, 1, 4, 0), "r2 = *(s16 *)(r1 +4)"),
            (ins(LDX | MEMSX | W, 2, 10, -8, 0), "r2 = *(s32 *)(r10 -8)"),
            (ins(JMP32 | JA, 0, 0, 0, -70000), "gotol -70000"),
            (ins(JMP | JA, 0, 0, 3, 0), "goto +3"),
            (ins(JMP | CALL | X, 4, 0, 0, 0), "callx r4"),
            (
                ins(JMP | CALL, 0, PSEUDO_KFUNC_CALL, 0, 77),
                "call kfunc#77",
            ),
            (
                ins(STX | ATOMIC | W, 1, 2, 0, ATOMIC_AND | FETCH),
                "lock fetch_and *(u32 *)(r1 +0), r2",
            ),
            (
                ins(STX | ATOMIC | DW, 1, 2, -8, ATOMIC_XOR | FETCH),
                "lock fetch_xor *(u64 *)(r1 -8), r2",
            ),
        ];
        for (i, want) in rows {
            assert_eq!(text(i), want, "{i:?}");
            // callx only has a notation: it is not an RFC 9669 encoding.
            let valid = i.code != JMP | CALL | X;
            assert_eq!(encoding_error(&i, None).is_none(), valid, "{want}");
        }
    }

    #[test]
    fn reserved_encodings_are_reported() {
        let bad = [
            ins(JMP | CALL | X, 0, 0, 0, 0),      // callx (0x8d)
            ins(JMP32 | CALL, 0, 0, 0, 1),        // call in JMP32
            ins(JMP | CALL, 0, 3, 0, 1),          // unknown call kind
            ins(JMP | EXIT, 0, 0, 0, 1),          // exit with an immediate
            ins(JMP | JA | X, 0, 0, 1, 0),        // goto with the source bit
            ins(JMP32 | JA, 0, 0, 1, 0),          // gotol with off
            ins(JMP | JA, 0, 0, 1, 1),            // goto with imm
            ins(JMP | 0xe0, 1, 0, 1, 0),          // unknown jump op
            ins(ALU64 | 0xe0, 1, 0, 0, 0),        // unknown ALU op
            ins(ALU64 | ADD | K, 1, 2, 0, 1),     // K form with a source register
            ins(ALU64 | ADD | X, 1, 2, 0, 1),     // X form with an immediate
            ins(ALU64 | ADD | X, 1, 2, 1, 0),     // offset on add
            ins(ALU64 | DIV | X, 1, 2, 2, 0),     // division offset 2
            ins(ALU | MOV | X, 1, 2, 32, 0),      // movsx32 in ALU32
            ins(ALU64 | MOV | X, 1, 2, 7, 0),     // movsx width 7
            ins(ALU64 | MOV | K, 1, 0, 8, 0),     // movsx from an immediate
            ins(ALU64 | NEG | X, 1, 2, 0, 0),     // neg with the source bit
            ins(ALU64 | NEG | K, 1, 0, 0, 3),     // neg with an immediate
            ins(ALU64 | END | X, 1, 0, 0, 16),    // bswap with the source bit
            ins(ALU | END | K, 1, 0, 0, 8),       // swap width 8
            ins(ALU64 | ADD | K, 11, 0, 0, 0),    // r11
            ins(LDX | MEMSX | DW, 1, 2, 0, 0),    // sign-extending 8-byte load
            ins(LDX | 0x20 | W, 1, 2, 0, 0),      // legacy ABS mode in LDX
            ins(LDX | MEM | W, 1, 2, 0, 5),       // load with an immediate
            ins(ST | MEM | W, 1, 2, 0, 5),        // immediate store with a source
            ins(ST | ATOMIC | W, 1, 0, 0, 0),     // atomic in ST
            ins(STX | MEM | W, 1, 2, 0, 5),       // register store with an immediate
            ins(STX | ATOMIC | H, 1, 2, 0, 0),    // 2-byte atomic
            ins(STX | ATOMIC | W, 1, 2, 0, 0xe0), // xchg without fetch
            ins(STX | ATOMIC | W, 1, 2, 0, 0x02), // unknown atomic
            ins(LD | 0x20 | W, 0, 0, 0, 0),       // legacy packet load
            ins(LDDW, 1, 7, 0, 0),                // unknown lddw source
        ];
        for i in bad {
            assert!(
                encoding_error(&i, Some(&Insn::default())).is_some(),
                "{i:?} accepted"
            );
        }
        let lddw = ins(LDDW, 1, 0, 0, 5);
        assert_eq!(encoding_error(&lddw, Some(&Insn::default())), None);
        assert!(encoding_error(&lddw, None).is_some());
        assert!(encoding_error(&lddw, Some(&ins(0, 1, 0, 0, 0))).is_some());
        assert_eq!(encoding_error(&ins(JMP | CALL, 0, 2, 0, 1), None), None);
    }
}
