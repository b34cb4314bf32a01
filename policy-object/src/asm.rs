//! A BPF assembler for the text dialect of the bpf_conformance test vectors (ubpf style).
//!
//! One instruction or one label per line; `#` and `//` start comments. Registers are `%r0` …
//! `%r10` (the `%` is optional). Numbers are decimal or `0x` hex, optionally signed; an
//! immediate is taken as its 32-bit pattern (`-1` and `0xffffffff` are the same), an offset
//! as its 16-bit pattern.
//!
//! | form | encodes |
//! |---|---|
//! | `add %r0, %r1` / `add32 %r0, 7` (`add64` too) | ALU64 / ALU, register or immediate source; `sub mul div sdiv mod smod or and lsh rsh xor mov arsh`, `neg %r0` |
//! | `movsx832 %r0, %r1`, `movsx1664 …`, `movsx3264 …` | MOVSX: source width then operation width |
//! | `be16 %r0`, `le32 %r0`, `bswap64 %r0` (or `swap64`) | byte swaps (`bswap` is the ALU64 form) |
//! | `ldxdw %r0, [%r1+8]`, `ldxsh %r0, [%r1-2]` | loads, `ldxs*` sign-extending |
//! | `stw [%r10-4], 7`, `stxb [%r1], %r2` | stores of an immediate or a register |
//! | `lddw %r0, 0x1122334455667788` | the two-slot 64-bit immediate load |
//! | `lock [fetch] add [%r1+0], %r2` (`or and xor xchg cmpxchg`, `32` suffix for words) | atomics |
//! | `ja +2`, `jeq %r1, 2, label`, `jslt32 %r1, %r2, -1` | jumps: `+N`/`-N` slots or a label |
//! | `ja32 label` / `gotol label` | the long jump (JMP32 class, offset in the immediate) |
//! | `call 5` (`call helper 5`), `call local label`, `call runtime 5`, `call %r2` | helper, local, BTF-id and register calls |
//! | `exit` | return `r0` |
//!
//! A label is `name:` on its own line; `exit` used as a jump target without an `exit:` label
//! means the first `exit` instruction. Every problem is an [`AsmError`] naming its line,
//! never a panic.

use crate::insn::{self as op, Insn};
use std::collections::HashMap;
use std::fmt;

/// An assembly error, with the 1-based line it was found on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmError {
    pub line: usize,
    pub kind: AsmErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AsmErrorKind {
    UnknownMnemonic(String),
    OperandCount {
        mnemonic: String,
        expected: usize,
        found: usize,
    },
    EmptyOperand,
    BadRegister(String),
    BadNumber(String),
    OutOfRange {
        value: String,
        what: &'static str,
    },
    BadMemoryOperand(String),
    BadLabel(String),
    DuplicateLabel {
        label: String,
        first_line: usize,
    },
    UnknownLabel(String),
    JumpOutOfRange {
        label: String,
        distance: i64,
    },
}

impl fmt::Display for AsmErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsmErrorKind::UnknownMnemonic(m) => write!(f, "unknown mnemonic `{m}`"),
            AsmErrorKind::OperandCount {
                mnemonic,
                expected,
                found,
            } => write!(f, "`{mnemonic}` takes {expected} operand(s), found {found}"),
            AsmErrorKind::EmptyOperand => write!(f, "empty operand"),
            AsmErrorKind::BadRegister(r) => write!(f, "`{r}` is not a register (%r0 … %r10)"),
            AsmErrorKind::BadNumber(n) => write!(f, "`{n}` is not a number"),
            AsmErrorKind::OutOfRange { value, what } => {
                write!(f, "`{value}` does not fit in {what}")
            }
            AsmErrorKind::BadMemoryOperand(m) => {
                write!(
                    f,
                    "`{m}` is not a memory operand ([%rN], [%rN+off], [%rN-off])"
                )
            }
            AsmErrorKind::BadLabel(l) => write!(f, "`{l}` is not a label or a +N/-N offset"),
            AsmErrorKind::DuplicateLabel { label, first_line } => {
                write!(f, "label `{label}` already defined on line {first_line}")
            }
            AsmErrorKind::UnknownLabel(l) => write!(f, "label `{l}` is never defined"),
            AsmErrorKind::JumpOutOfRange { label, distance } => {
                write!(
                    f,
                    "label `{label}` is {distance} slots away, beyond the jump's reach"
                )
            }
        }
    }
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.kind)
    }
}

impl std::error::Error for AsmError {}

/// Which field of an instruction a label resolves into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    /// The 16-bit offset (jumps).
    Off,
    /// The 32-bit immediate (`ja32`, `call local`).
    Imm,
}

struct Fixup {
    slot: usize,
    line: usize,
    label: String,
    field: Field,
}

/// One assembled line: one or two slots, and possibly a label to resolve into the first.
struct Stmt {
    insns: Vec<Insn>,
    label: Option<(String, Field)>,
}

impl Stmt {
    fn one(insn: Insn) -> Stmt {
        Stmt {
            insns: vec![insn],
            label: None,
        }
    }
}

type R<T> = Result<T, AsmErrorKind>;

/// Assembles `text` into instructions (an `lddw` takes two).
pub fn assemble(text: &str) -> Result<Vec<Insn>, AsmError> {
    let mut out: Vec<Insn> = Vec::new();
    let mut labels: HashMap<String, (usize, usize)> = HashMap::new();
    let mut first_exit: Option<usize> = None;
    let mut fixups: Vec<Fixup> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let err = |kind| AsmError { line, kind };
        let s = strip_comment(raw).trim();
        if s.is_empty() {
            continue;
        }
        if let Some(name) = s.strip_suffix(':') {
            let name = name.trim();
            if !is_ident(name) {
                return Err(err(AsmErrorKind::BadLabel(name.to_string())));
            }
            if let Some(&(_, first_line)) = labels.get(name) {
                return Err(err(AsmErrorKind::DuplicateLabel {
                    label: name.to_string(),
                    first_line,
                }));
            }
            labels.insert(name.to_string(), (out.len(), line));
            continue;
        }
        let stmt = statement(s).map_err(err)?;
        if stmt.insns[0].code == op::JMP | op::EXIT && first_exit.is_none() {
            first_exit = Some(out.len());
        }
        if let Some((label, field)) = stmt.label {
            fixups.push(Fixup {
                slot: out.len(),
                line,
                label,
                field,
            });
        }
        out.extend(stmt.insns);
    }
    for f in fixups {
        let err = |kind| AsmError { line: f.line, kind };
        let implicit = if f.label == "exit" { first_exit } else { None };
        let Some(target) = labels.get(&f.label).map(|&(slot, _)| slot).or(implicit) else {
            return Err(err(AsmErrorKind::UnknownLabel(f.label)));
        };
        let distance = target as i64 - f.slot as i64 - 1;
        let insn = &mut out[f.slot];
        match f.field {
            Field::Off => match i16::try_from(distance) {
                Ok(d) => insn.off = d,
                Err(_) => {
                    return Err(err(AsmErrorKind::JumpOutOfRange {
                        label: f.label,
                        distance,
                    }));
                }
            },
            Field::Imm => match i32::try_from(distance) {
                Ok(d) => insn.imm = d,
                Err(_) => {
                    return Err(err(AsmErrorKind::JumpOutOfRange {
                        label: f.label,
                        distance,
                    }));
                }
            },
        }
    }
    Ok(out)
}

fn strip_comment(s: &str) -> &str {
    let end = [s.find('#'), s.find("//")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(s.len());
    &s[..end]
}

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == '.')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == '.')
}

fn split_word(s: &str) -> (&str, &str) {
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], s[i..].trim_start()),
        None => (s, ""),
    }
}

fn operands(rest: &str) -> R<Vec<&str>> {
    if rest.trim().is_empty() {
        return Ok(Vec::new());
    }
    let ops: Vec<&str> = rest.split(',').map(str::trim).collect();
    if ops.iter().any(|o| o.is_empty()) {
        return Err(AsmErrorKind::EmptyOperand);
    }
    Ok(ops)
}

fn expect<'a>(mnemonic: &str, ops: Vec<&'a str>, n: usize) -> R<Vec<&'a str>> {
    if ops.len() == n {
        Ok(ops)
    } else {
        Err(AsmErrorKind::OperandCount {
            mnemonic: mnemonic.to_string(),
            expected: n,
            found: ops.len(),
        })
    }
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        dst,
        src,
        off,
        imm,
    }
}

fn statement(s: &str) -> R<Stmt> {
    let (word, rest) = split_word(s);
    let m = word.to_ascii_lowercase();
    match m.as_str() {
        "exit" => {
            expect(&m, operands(rest)?, 0)?;
            Ok(Stmt::one(insn(op::JMP | op::EXIT, 0, 0, 0, 0)))
        }
        "call" => call(rest),
        "lock" => atomic(rest),
        "lddw" => {
            let o = expect(&m, operands(rest)?, 2)?;
            let d = reg(o[0])?;
            let v = imm64(o[1])?;
            Ok(Stmt {
                insns: vec![
                    insn(op::LDDW, d, 0, 0, v as u32 as i32),
                    insn(0, 0, 0, 0, (v >> 32) as u32 as i32),
                ],
                label: None,
            })
        }
        "ja" => {
            let o = expect(&m, operands(rest)?, 1)?;
            let (off, label) = target_off(o[0])?;
            Ok(Stmt {
                insns: vec![insn(op::JMP | op::JA, 0, 0, off, 0)],
                label,
            })
        }
        "ja32" | "gotol" => {
            let o = expect(&m, operands(rest)?, 1)?;
            let (imm, label) = target_imm(o[0])?;
            Ok(Stmt {
                insns: vec![insn(op::JMP32 | op::JA, 0, 0, 0, imm)],
                label,
            })
        }
        _ => {
            if let Some(code) = mem_code(&m) {
                return mem(&m, code, rest);
            }
            if let Some((code, imm)) = byteswap(&m) {
                let o = expect(&m, operands(rest)?, 1)?;
                return Ok(Stmt::one(insn(code, reg(o[0])?, 0, 0, imm)));
            }
            if let Some((class, operation)) = cond_jump(&m) {
                let o = expect(&m, operands(rest)?, 3)?;
                let d = reg(o[0])?;
                let (src, code, imm) = reg_or_imm(o[1])?;
                let (off, label) = target_off(o[2])?;
                return Ok(Stmt {
                    insns: vec![insn(class | operation | code, d, src, off, imm)],
                    label,
                });
            }
            if let Some((class, operation, off)) = alu(&m) {
                if operation == op::NEG {
                    let o = expect(&m, operands(rest)?, 1)?;
                    return Ok(Stmt::one(insn(
                        class | op::NEG | op::K,
                        reg(o[0])?,
                        0,
                        0,
                        0,
                    )));
                }
                let o = expect(&m, operands(rest)?, 2)?;
                let d = reg(o[0])?;
                let (src, code, imm) = reg_or_imm(o[1])?;
                if off != 0 && operation == op::MOV && code == op::K {
                    // movsx has no immediate form.
                    return Err(AsmErrorKind::BadRegister(o[1].to_string()));
                }
                return Ok(Stmt::one(insn(class | operation | code, d, src, off, imm)));
            }
            Err(AsmErrorKind::UnknownMnemonic(word.to_string()))
        }
    }
}

/// `call N`, `call helper N`, `call local target`, `call runtime N`, `call %rN`.
fn call(rest: &str) -> R<Stmt> {
    let (mode, target) = match split_word(rest) {
        (m @ ("helper" | "local" | "runtime"), t) => (m, t),
        _ => ("", rest),
    };
    let o = expect("call", operands(target)?, 1)?;
    let t = o[0];
    let code = op::JMP | op::CALL;
    match mode {
        "local" => {
            let (imm, label) = target_imm(t)?;
            Ok(Stmt {
                insns: vec![insn(code, 0, op::PSEUDO_CALL, 0, imm)],
                label,
            })
        }
        "runtime" => Ok(Stmt::one(insn(
            code,
            0,
            op::PSEUDO_KFUNC_CALL,
            0,
            imm32(t)?,
        ))),
        _ if is_reg(t) => Ok(Stmt::one(insn(code | op::X, reg(t)?, 0, 0, 0))),
        _ => Ok(Stmt::one(insn(code, 0, 0, 0, imm32(t)?))),
    }
}

/// `lock [fetch] op[32] [%rD+off], %rS`.
fn atomic(rest: &str) -> R<Stmt> {
    let (mut word, mut rest) = split_word(rest);
    let mut fetch = false;
    if word == "fetch" {
        fetch = true;
        (word, rest) = split_word(rest);
    }
    let (name, size) = match word.strip_suffix("32") {
        Some(n) => (n, op::W),
        None => (word, op::DW),
    };
    let imm = match name {
        "add" => op::ATOMIC_ADD,
        "or" => op::ATOMIC_OR,
        "and" => op::ATOMIC_AND,
        "xor" => op::ATOMIC_XOR,
        "xchg" => op::ATOMIC_XCHG,
        "cmpxchg" => op::ATOMIC_CMPXCHG,
        _ => return Err(AsmErrorKind::UnknownMnemonic(format!("lock {word}"))),
    };
    let imm = if fetch { imm | op::FETCH } else { imm };
    let o = expect(&format!("lock {word}"), operands(rest)?, 2)?;
    let (d, off) = mem_operand(o[0])?;
    let s = reg(o[1])?;
    Ok(Stmt::one(insn(op::STX | op::ATOMIC | size, d, s, off, imm)))
}

/// The opcode of a load or store mnemonic.
fn mem_code(m: &str) -> Option<u8> {
    let size = |s: &str| match s {
        "b" => Some(op::B),
        "h" => Some(op::H),
        "w" => Some(op::W),
        "dw" => Some(op::DW),
        _ => None,
    };
    if let Some(s) = m.strip_prefix("ldxs") {
        return size(s)
            .filter(|&z| z != op::DW)
            .map(|z| op::LDX | op::MEMSX | z);
    }
    if let Some(s) = m.strip_prefix("ldx") {
        return size(s).map(|z| op::LDX | op::MEM | z);
    }
    if let Some(s) = m.strip_prefix("stx") {
        return size(s).map(|z| op::STX | op::MEM | z);
    }
    if let Some(s) = m.strip_prefix("st") {
        return size(s).map(|z| op::ST | op::MEM | z);
    }
    None
}

fn mem(m: &str, code: u8, rest: &str) -> R<Stmt> {
    let o = expect(m, operands(rest)?, 2)?;
    match code & 0x07 {
        op::LDX => {
            let d = reg(o[0])?;
            let (s, off) = mem_operand(o[1])?;
            Ok(Stmt::one(insn(code, d, s, off, 0)))
        }
        op::STX => {
            let (d, off) = mem_operand(o[0])?;
            Ok(Stmt::one(insn(code, d, reg(o[1])?, off, 0)))
        }
        _ => {
            let (d, off) = mem_operand(o[0])?;
            Ok(Stmt::one(insn(code, d, 0, off, imm32(o[1])?)))
        }
    }
}

/// `be16`…`le64` (ALU class, X = big endian) and `bswap16`…`bswap64` (ALU64 class).
fn byteswap(m: &str) -> Option<(u8, i32)> {
    let (code, width) = if let Some(w) = m.strip_prefix("be") {
        (op::ALU | op::END | op::TO_BE, w)
    } else if let Some(w) = m.strip_prefix("le") {
        (op::ALU | op::END | op::TO_LE, w)
    } else if let Some(w) = m.strip_prefix("bswap").or_else(|| m.strip_prefix("swap")) {
        (op::ALU64 | op::END | op::K, w)
    } else {
        return None;
    };
    match width {
        "16" => Some((code, 16)),
        "32" => Some((code, 32)),
        "64" => Some((code, 64)),
        _ => None,
    }
}

fn cond_jump(m: &str) -> Option<(u8, u8)> {
    let (base, class) = match m.strip_suffix("32") {
        Some(b) => (b, op::JMP32),
        None => (m, op::JMP),
    };
    let operation = match base {
        "jeq" => op::JEQ,
        "jgt" => op::JGT,
        "jge" => op::JGE,
        "jset" => op::JSET,
        "jne" => op::JNE,
        "jsgt" => op::JSGT,
        "jsge" => op::JSGE,
        "jlt" => op::JLT,
        "jle" => op::JLE,
        "jslt" => op::JSLT,
        "jsle" => op::JSLE,
        _ => return None,
    };
    Some((class, operation))
}

/// (class, operation, offset field) of an ALU mnemonic.
fn alu(m: &str) -> Option<(u8, u8, i16)> {
    if let Some(widths) = m.strip_prefix("movsx") {
        return match widths {
            "832" => Some((op::ALU, op::MOV, 8)),
            "1632" => Some((op::ALU, op::MOV, 16)),
            "864" => Some((op::ALU64, op::MOV, 8)),
            "1664" => Some((op::ALU64, op::MOV, 16)),
            "3264" => Some((op::ALU64, op::MOV, 32)),
            _ => None,
        };
    }
    let (base, class) = if let Some(b) = m.strip_suffix("32") {
        (b, op::ALU)
    } else if let Some(b) = m.strip_suffix("64") {
        (b, op::ALU64)
    } else {
        (m, op::ALU64)
    };
    let (operation, off) = match base {
        "add" => (op::ADD, 0),
        "sub" => (op::SUB, 0),
        "mul" => (op::MUL, 0),
        "div" => (op::DIV, 0),
        "sdiv" => (op::DIV, op::OFF_SIGNED),
        "or" => (op::OR, 0),
        "and" => (op::AND, 0),
        "lsh" => (op::LSH, 0),
        "rsh" => (op::RSH, 0),
        "neg" => (op::NEG, 0),
        "mod" => (op::MOD, 0),
        "smod" => (op::MOD, op::OFF_SIGNED),
        "xor" => (op::XOR, 0),
        "mov" => (op::MOV, 0),
        "arsh" => (op::ARSH, 0),
        _ => return None,
    };
    Some((class, operation, off))
}

fn is_reg(s: &str) -> bool {
    reg(s).is_ok()
}

fn reg(s: &str) -> R<u8> {
    let bad = || AsmErrorKind::BadRegister(s.to_string());
    let n = s.strip_prefix('%').unwrap_or(s);
    let digits = n.strip_prefix('r').ok_or_else(bad)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match digits.parse::<u8>() {
        Ok(r) if r <= 10 => Ok(r),
        _ => Err(bad()),
    }
}

/// A register operand (X) or an immediate (K): (src, source bit, imm).
fn reg_or_imm(s: &str) -> R<(u8, u8, i32)> {
    if s.starts_with('%') || s.starts_with('r') {
        Ok((reg(s)?, op::X, 0))
    } else {
        Ok((0, op::K, imm32(s)?))
    }
}

fn number(s: &str) -> R<i128> {
    let bad = || AsmErrorKind::BadNumber(s.to_string());
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(h) => (16, h),
        None => (10, body),
    };
    // from_str_radix would accept a second sign; only digits may follow.
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(bad());
    }
    let v = i128::from_str_radix(digits, radix).map_err(|_| AsmErrorKind::OutOfRange {
        value: s.to_string(),
        what: "128 bits",
    })?;
    Ok(if neg { -v } else { v })
}

/// A 32-bit immediate: any value in `i32::MIN ..= u32::MAX`, kept as its bit pattern.
fn imm32(s: &str) -> R<i32> {
    let v = number(s)?;
    if v < i128::from(i32::MIN) || v > i128::from(u32::MAX) {
        return Err(AsmErrorKind::OutOfRange {
            value: s.to_string(),
            what: "a 32-bit immediate",
        });
    }
    Ok(v as i64 as u32 as i32)
}

fn imm64(s: &str) -> R<u64> {
    let v = number(s)?;
    if v < i128::from(i64::MIN) || v > i128::from(u64::MAX) {
        return Err(AsmErrorKind::OutOfRange {
            value: s.to_string(),
            what: "a 64-bit immediate",
        });
    }
    Ok(v as u64)
}

/// A 16-bit offset: any value in `i16::MIN ..= u16::MAX`, kept as its bit pattern.
fn off16(s: &str) -> R<i16> {
    let v = number(s)?;
    if v < i128::from(i16::MIN) || v > i128::from(u16::MAX) {
        return Err(AsmErrorKind::OutOfRange {
            value: s.to_string(),
            what: "a 16-bit offset",
        });
    }
    Ok(v as i32 as u16 as i16)
}

/// `[%rN]`, `[%rN+off]`, `[%rN-off]` (spaces allowed inside the brackets).
fn mem_operand(s: &str) -> R<(u8, i16)> {
    let bad = || AsmErrorKind::BadMemoryOperand(s.to_string());
    let inner = s
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(bad)?;
    let inner: String = inner.chars().filter(|c| !c.is_whitespace()).collect();
    match inner.find(['+', '-']) {
        Some(i) => Ok((reg(&inner[..i])?, off16(&inner[i..])?)),
        None => Ok((reg(&inner)?, 0)),
    }
}

fn signed_target(s: &str) -> bool {
    s.starts_with('+') || s.starts_with('-')
}

fn label_of(s: &str) -> R<String> {
    if is_ident(s) {
        Ok(s.to_string())
    } else {
        Err(AsmErrorKind::BadLabel(s.to_string()))
    }
}

/// A jump target in the offset field: `+N`, `-N` or a label (resolved later).
fn target_off(s: &str) -> R<(i16, Option<(String, Field)>)> {
    if signed_target(s) {
        let v = number(s)?;
        let off = i16::try_from(v).map_err(|_| AsmErrorKind::OutOfRange {
            value: s.to_string(),
            what: "a 16-bit jump offset",
        })?;
        Ok((off, None))
    } else {
        Ok((0, Some((label_of(s)?, Field::Off))))
    }
}

/// A jump target in the immediate field (`ja32`, `call local`).
fn target_imm(s: &str) -> R<(i32, Option<(String, Field)>)> {
    if signed_target(s) {
        let v = number(s)?;
        let imm = i32::try_from(v).map_err(|_| AsmErrorKind::OutOfRange {
            value: s.to_string(),
            what: "a 32-bit jump offset",
        })?;
        Ok((imm, None))
    } else {
        Ok((0, Some((label_of(s)?, Field::Imm))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8 bytes of one instruction as the little-endian u64 the vectors' `-- raw` uses.
    fn raw(i: &Insn) -> u64 {
        u64::from_le_bytes(i.encode())
    }

    /// Assembles one instruction, which must also be an encoding RFC 9669 defines
    /// (`insn::encoding_error`, written independently), except `callx`.
    fn one(text: &str) -> [u8; 8] {
        let v = assemble(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(v.len(), 1, "{text}");
        let rfc = op::encoding_error(&v[0], None);
        if text.starts_with("call %") {
            assert!(rfc.is_some(), "{text}: callx is not in RFC 9669");
        } else {
            assert_eq!(rfc, None, "{text}");
        }
        v[0].encode()
    }

    fn fails(text: &str) -> AsmError {
        match assemble(text) {
            Ok(v) => panic!("{text} assembled to {v:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn alu_encodings() {
        // Opcode bytes: RFC 9669 §4.1 (class | source | operation); regs byte is src<<4 | dst.
        let rows: &[(&str, [u8; 8])] = &[
            ("mov %r0, 1", [0xb7, 0x00, 0, 0, 1, 0, 0, 0]),
            ("mov r0, 1", [0xb7, 0x00, 0, 0, 1, 0, 0, 0]),
            ("mov32 %r3, -1", [0xb4, 0x03, 0, 0, 0xff, 0xff, 0xff, 0xff]),
            (
                "mov32 %r3, 0xffffffff",
                [0xb4, 0x03, 0, 0, 0xff, 0xff, 0xff, 0xff],
            ),
            ("add32 %r1, %r2", [0x0c, 0x21, 0, 0, 0, 0, 0, 0]),
            ("add %r1, %r2", [0x0f, 0x21, 0, 0, 0, 0, 0, 0]),
            ("add64 %r1, 0x10", [0x07, 0x01, 0, 0, 0x10, 0, 0, 0]),
            ("sub %r9, %r10", [0x1f, 0xa9, 0, 0, 0, 0, 0, 0]),
            ("mul32 %r0, 7", [0x24, 0x00, 0, 0, 7, 0, 0, 0]),
            ("div %r0, %r1", [0x3f, 0x10, 0, 0, 0, 0, 0, 0]),
            ("or32 %r0, %r1", [0x4c, 0x10, 0, 0, 0, 0, 0, 0]),
            ("and %r0, 0xff", [0x57, 0x00, 0, 0, 0xff, 0, 0, 0]),
            ("lsh %r0, 3", [0x67, 0x00, 0, 0, 3, 0, 0, 0]),
            ("rsh32 %r0, %r2", [0x7c, 0x20, 0, 0, 0, 0, 0, 0]),
            ("neg %r4", [0x87, 0x04, 0, 0, 0, 0, 0, 0]),
            ("neg32 %r4", [0x84, 0x04, 0, 0, 0, 0, 0, 0]),
            ("mod32 %r0, 5", [0x94, 0x00, 0, 0, 5, 0, 0, 0]),
            ("xor %r0, %r0", [0xaf, 0x00, 0, 0, 0, 0, 0, 0]),
            ("arsh32 %r1, 4", [0xc4, 0x01, 0, 0, 4, 0, 0, 0]),
            // v4: signed division and modulo carry offset 1.
            ("sdiv32 %r0, 3", [0x34, 0x00, 1, 0, 3, 0, 0, 0]),
            ("sdiv %r0, %r1", [0x3f, 0x10, 1, 0, 0, 0, 0, 0]),
            ("smod %r1, %r2", [0x9f, 0x21, 1, 0, 0, 0, 0, 0]),
            ("smod32 %r1, -3", [0x94, 0x01, 1, 0, 0xfd, 0xff, 0xff, 0xff]),
            // v4: MOVSX, offset = source width.
            ("movsx832 %r0, %r1", [0xbc, 0x10, 8, 0, 0, 0, 0, 0]),
            ("movsx1632 %r4, %r3", [0xbc, 0x34, 16, 0, 0, 0, 0, 0]),
            ("movsx864 %r6, %r5", [0xbf, 0x56, 8, 0, 0, 0, 0, 0]),
            ("movsx1664 %r0, %r1", [0xbf, 0x10, 16, 0, 0, 0, 0, 0]),
            ("movsx3264 %r0, %r9", [0xbf, 0x90, 32, 0, 0, 0, 0, 0]),
            // Byte swaps, RFC 9669 §4.2: 0xd4 le, 0xdc be, 0xd7 unconditional (v4).
            ("be16 %r0", [0xdc, 0x00, 0, 0, 16, 0, 0, 0]),
            ("be64 %r2", [0xdc, 0x02, 0, 0, 64, 0, 0, 0]),
            ("le32 %r0", [0xd4, 0x00, 0, 0, 32, 0, 0, 0]),
            ("bswap16 %r0", [0xd7, 0x00, 0, 0, 16, 0, 0, 0]),
            ("swap64 %r0", [0xd7, 0x00, 0, 0, 64, 0, 0, 0]),
        ];
        for (text, bytes) in rows {
            assert_eq!(&one(text), bytes, "{text}");
        }
    }

    #[test]
    fn memory_encodings() {
        // RFC 9669 §5: class | size | mode; MEMSX (0x80) loads sign-extend.
        let rows: &[(&str, [u8; 8])] = &[
            ("ldxdw %r0, [%r1+8]", [0x79, 0x10, 8, 0, 0, 0, 0, 0]),
            ("ldxw %r0, [%r1]", [0x61, 0x10, 0, 0, 0, 0, 0, 0]),
            ("ldxh %r3, [%r1+12]", [0x69, 0x13, 12, 0, 0, 0, 0, 0]),
            (
                "ldxb %r0, [ %r10 - 1 ]",
                [0x71, 0xa0, 0xff, 0xff, 0, 0, 0, 0],
            ),
            ("ldxsb %r0, [%r10-1]", [0x91, 0xa0, 0xff, 0xff, 0, 0, 0, 0]),
            ("ldxsh %r0, [%r10-2]", [0x89, 0xa0, 0xfe, 0xff, 0, 0, 0, 0]),
            ("ldxsw %r0, [%r10-4]", [0x81, 0xa0, 0xfc, 0xff, 0, 0, 0, 0]),
            ("stxw [%r10-4], %r1", [0x63, 0x1a, 0xfc, 0xff, 0, 0, 0, 0]),
            ("stxdw [%r10-8], %r1", [0x7b, 0x1a, 0xf8, 0xff, 0, 0, 0, 0]),
            ("stxh [%r1+2], %r2", [0x6b, 0x21, 2, 0, 0, 0, 0, 0]),
            ("stxb [%r1+0x10], %r2", [0x73, 0x21, 0x10, 0, 0, 0, 0, 0]),
            ("stb [%r1+2], 0x11", [0x72, 0x01, 2, 0, 0x11, 0, 0, 0]),
            ("sth [%r1+2], 0x2211", [0x6a, 0x01, 2, 0, 0x11, 0x22, 0, 0]),
            ("stw [%r1], -2", [0x62, 0x01, 0, 0, 0xfe, 0xff, 0xff, 0xff]),
            (
                "stdw [%r10-16], 0xab",
                [0x7a, 0x0a, 0xf0, 0xff, 0xab, 0, 0, 0],
            ),
            // Atomics: RFC 9669 §5.3, 0xc3 (word) / 0xdb (double word), operation in imm.
            ("lock add [%r1], %r2", [0xdb, 0x21, 0, 0, 0x00, 0, 0, 0]),
            (
                "lock add32 [%r10-4], %r1",
                [0xc3, 0x1a, 0xfc, 0xff, 0x00, 0, 0, 0],
            ),
            (
                "lock fetch add [%r10-8], %r1",
                [0xdb, 0x1a, 0xf8, 0xff, 0x01, 0, 0, 0],
            ),
            (
                "lock or [%r10-8], %r1",
                [0xdb, 0x1a, 0xf8, 0xff, 0x40, 0, 0, 0],
            ),
            (
                "lock fetch and32 [%r10-8], %r3",
                [0xc3, 0x3a, 0xf8, 0xff, 0x51, 0, 0, 0],
            ),
            (
                "lock fetch xor [%r10-8], %r3",
                [0xdb, 0x3a, 0xf8, 0xff, 0xa1, 0, 0, 0],
            ),
            (
                "lock xchg [%r10-8], %r1",
                [0xdb, 0x1a, 0xf8, 0xff, 0xe1, 0, 0, 0],
            ),
            (
                "lock cmpxchg32 [%r10-8], %r1",
                [0xc3, 0x1a, 0xf8, 0xff, 0xf1, 0, 0, 0],
            ),
        ];
        for (text, bytes) in rows {
            assert_eq!(&one(text), bytes, "{text}");
        }
    }

    #[test]
    fn lddw_matches_the_vectors_raw_form() {
        // lddw.data gives these three raw words for the same text.
        let v = assemble("lddw %r0, 0x1122334455667788\nexit").unwrap();
        let words: Vec<u64> = v.iter().map(raw).collect();
        assert_eq!(
            words,
            [0x5566778800000018, 0x1122334400000000, 0x0000000000000095]
        );
        assert_eq!(op::encoding_error(&v[0], Some(&v[1])), None);
        let v = assemble("lddw %r3, -1").unwrap();
        assert_eq!(v[0].encode(), [0x18, 0x03, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(v[1].encode(), [0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn jump_and_call_encodings() {
        let rows: &[(&str, [u8; 8])] = &[
            ("ja +3", [0x05, 0x00, 3, 0, 0, 0, 0, 0]),
            ("ja -1", [0x05, 0x00, 0xff, 0xff, 0, 0, 0, 0]),
            ("ja32 +2", [0x06, 0x00, 0, 0, 2, 0, 0, 0]),
            ("gotol -2", [0x06, 0x00, 0, 0, 0xfe, 0xff, 0xff, 0xff]),
            ("jeq %r1, 2, +3", [0x15, 0x01, 3, 0, 2, 0, 0, 0]),
            ("jeq %r1, %r2, +3", [0x1d, 0x21, 3, 0, 0, 0, 0, 0]),
            ("jgt %r1, 0x80000000, +1", [0x25, 0x01, 1, 0, 0, 0, 0, 0x80]),
            ("jge32 %r1, %r2, +1", [0x3e, 0x21, 1, 0, 0, 0, 0, 0]),
            ("jset %r1, 8, +1", [0x45, 0x01, 1, 0, 8, 0, 0, 0]),
            ("jne32 %r2, 42, +1", [0x56, 0x02, 1, 0, 42, 0, 0, 0]),
            (
                "jsgt %r1, -1, +1",
                [0x65, 0x01, 1, 0, 0xff, 0xff, 0xff, 0xff],
            ),
            ("jsge %r1, %r2, +1", [0x7d, 0x21, 1, 0, 0, 0, 0, 0]),
            ("jlt32 %r1, 5, +3", [0xa6, 0x01, 3, 0, 5, 0, 0, 0]),
            ("jle %r1, 5, +3", [0xb5, 0x01, 3, 0, 5, 0, 0, 0]),
            ("jslt %r1, %r2, -1", [0xcd, 0x21, 0xff, 0xff, 0, 0, 0, 0]),
            ("jsle32 %r1, 0, +1", [0xd6, 0x01, 1, 0, 0, 0, 0, 0]),
            ("call 1", [0x85, 0x00, 0, 0, 1, 0, 0, 0]),
            ("call helper 5", [0x85, 0x00, 0, 0, 5, 0, 0, 0]),
            ("call runtime 7", [0x85, 0x20, 0, 0, 7, 0, 0, 0]),
            ("call local +4", [0x85, 0x10, 0, 0, 4, 0, 0, 0]),
            ("call %r2", [0x8d, 0x02, 0, 0, 0, 0, 0, 0]),
            ("exit", [0x95, 0x00, 0, 0, 0, 0, 0, 0]),
        ];
        for (text, bytes) in rows {
            assert_eq!(&one(text), bytes, "{text}");
        }
    }

    #[test]
    fn labels_resolve_forward_backward_and_to_the_first_exit() {
        let text = "\
            mov %r0, 0        # slot 0
            lddw %r1, 1       # slots 1-2
            top:
            jeq %r0, 3, done  # slot 3: done is slot 7, offset 3
            add %r0, 1        # slot 4
            ja top            # slot 5: offset -3
            exit              # slot 6
            done:
            jne %r0, 3, exit  // slot 7: first exit is slot 6, offset -2
            ja32 done         # slot 8: offset -2
            call local f      # slot 9: f is slot 11, imm 1
            exit
            f:
            exit
        ";
        let v = assemble(text).unwrap();
        assert_eq!(v.len(), 12);
        assert_eq!((v[3].code, v[3].off), (0x15, 3));
        assert_eq!((v[5].code, v[5].off), (0x05, -3));
        assert_eq!((v[7].code, v[7].off), (0x55, -2));
        assert_eq!((v[8].code, v[8].imm, v[8].off), (0x06, -2, 0));
        assert_eq!((v[9].src, v[9].imm), (1, 1));
        // An explicit `exit:` label wins over the implicit one.
        let v = assemble("ja exit\nexit\nexit:\nexit").unwrap();
        assert_eq!(v[0].off, 1);
    }

    #[test]
    fn errors_name_their_line_and_never_panic() {
        let e = fails("mov %r0, 1\n\nfrob %r0\n");
        assert_eq!(e.line, 3);
        assert_eq!(e.kind, AsmErrorKind::UnknownMnemonic("frob".into()));
        assert_eq!(e.to_string(), "line 3: unknown mnemonic `frob`");
        assert_eq!(
            fails("mov %r11, 1").kind,
            AsmErrorKind::BadRegister("%r11".into())
        );
        assert!(matches!(
            fails("mov %r0").kind,
            AsmErrorKind::OperandCount {
                expected: 2,
                found: 1,
                ..
            }
        ));
        assert_eq!(fails("mov %r0,, 1").kind, AsmErrorKind::EmptyOperand);
        assert!(matches!(
            fails("mov %r0, 0x100000000").kind,
            AsmErrorKind::OutOfRange { .. }
        ));
        assert!(matches!(
            fails("mov %r0, -2147483649").kind,
            AsmErrorKind::OutOfRange { .. }
        ));
        assert_eq!(
            fails("mov %r0, 12z").kind,
            AsmErrorKind::BadNumber("12z".into())
        );
        assert_eq!(
            fails("mov %r0, --1").kind,
            AsmErrorKind::BadNumber("--1".into())
        );
        assert!(matches!(
            fails("ldxw %r0, [%r1+70000]").kind,
            AsmErrorKind::OutOfRange { .. }
        ));
        assert!(matches!(
            fails("ldxw %r0, %r1").kind,
            AsmErrorKind::BadMemoryOperand(_)
        ));
        assert!(matches!(fails("ja 3").kind, AsmErrorKind::BadLabel(_)));
        assert!(matches!(
            fails("ja +40000").kind,
            AsmErrorKind::OutOfRange { .. }
        ));
        let e = fails("exit\nja nowhere\n");
        assert_eq!(
            (e.line, e.kind),
            (2, AsmErrorKind::UnknownLabel("nowhere".into()))
        );
        let e = fails("a:\nexit\na:\n");
        assert_eq!(
            (e.line, e.kind),
            (
                3,
                AsmErrorKind::DuplicateLabel {
                    label: "a".into(),
                    first_line: 1
                }
            )
        );
        assert!(matches!(
            fails("lock nand [%r1], %r2").kind,
            AsmErrorKind::UnknownMnemonic(_)
        ));
        assert!(matches!(
            fails("ldxsdw %r0, [%r1]").kind,
            AsmErrorKind::UnknownMnemonic(_)
        ));
        assert!(matches!(
            fails("movsx3232 %r0, %r1").kind,
            AsmErrorKind::UnknownMnemonic(_)
        ));
        assert!(matches!(
            fails("be8 %r0").kind,
            AsmErrorKind::UnknownMnemonic(_)
        ));
        assert!(matches!(
            fails("movsx864 %r0, 1").kind,
            AsmErrorKind::BadRegister(_)
        ));
        assert!(matches!(
            fails("exit %r0").kind,
            AsmErrorKind::OperandCount { .. }
        ));
        // A jump beyond the offset field's reach.
        let mut far = String::from("ja end\n");
        far.push_str(&"mov %r0, 0\n".repeat(40000));
        far.push_str("end:\nexit\n");
        let e = fails(&far);
        assert_eq!(e.line, 1);
        assert!(matches!(
            e.kind,
            AsmErrorKind::JumpOutOfRange {
                distance: 40000,
                ..
            }
        ));
        assert!(assemble(&far.replacen("ja end", "ja32 end", 1)).is_ok());
    }

    #[test]
    fn hostile_text_is_an_error_or_a_program() {
        // Every prefix of a varied program, and some junk: never a panic.
        let text = "mov %r0, 1\nlock fetch add [%r1-8], %r2\nldxdw %r0, [%r1+8]\njeq %r1, 0x10, +1\ncall local x\nx:\nlddw %r0, -0x8000000000000000\nexit\n";
        for end in 0..=text.len() {
            if text.is_char_boundary(end) {
                let _ = assemble(&text[..end]);
            }
        }
        for junk in [
            "[",
            "]",
            ":",
            "lock",
            "lock fetch",
            "call",
            "call local",
            "mov ,",
            "ldxw %r0, []",
            "ldxw %r0, [+]",
            "ldxw %r0, [%r1+]",
            "é:",
            "mov %r0, 0x",
            "mov %r0, -",
        ] {
            assert!(assemble(junk).is_err(), "{junk}");
        }
    }
}
