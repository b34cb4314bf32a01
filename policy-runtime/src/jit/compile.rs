//! Translation of verified BPF to x86-64 (through the encoder in [`super::x86`]).
//!
//! Register map: r0 rax, r1 rdi, r2 rsi, r3 rdx, r4 rcx, r5 r8 (the System V argument
//! registers, so helpers are called directly), r6 rbx, r7 r13, r8 r14, r9 r15 (callee-saved,
//! as BPF requires), r10 rbp. r10/r11 of x86 are scratch. Every BPF function gets a frame:
//! `rbp` and the callee-saved registers of the BPF registers r6–r9 it names are pushed (a
//! function that never names r8 leaves r14 alone, so it needs no saving), then 512 bytes of
//! stack, plus 8 when the pushes are even in number, keep `rsp` 16-byte aligned at every call.

use super::x86::*;
use policy_object::insn::{self as op, Insn};
use std::fmt;

const MAP: [Gpr; 11] = [RAX, RDI, RSI, RDX, RCX, R8, RBX, R13, R14, R15, RBP];
const STACK: i32 = 512;

/// Something the JIT cannot translate (the verifier normally rejects it first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JitError {
    /// A valid instruction this JIT does not run (kfunc calls, unresolved map references).
    Unsupported {
        pc: usize,
        what: String,
    },
    UnknownHelper {
        pc: usize,
        id: i32,
    },
    /// An encoding RFC 9669 does not define, a write to r10, or a program whose control flow
    /// could leave a function other than through `exit` (a jump or call target outside the
    /// program, inside an `lddw` or in another function; a function that can run off its end).
    Invalid {
        pc: usize,
        why: String,
    },
}

impl fmt::Display for JitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JitError::Unsupported { pc, what } => {
                write!(f, "JIT: insn {pc}: {what} is not supported")
            }
            JitError::UnknownHelper { pc, id } => write!(f, "JIT: insn {pc}: no helper #{id}"),
            JitError::Invalid { pc, why } => write!(f, "JIT: insn {pc}: {why}"),
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

/// What a function's prologue saves, and the padding that keeps `rsp` aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    /// `rbp`, then the callee-saved registers the function names.
    saved: Vec<Gpr>,
    pad: i32,
}

/// The BPF registers the instructions of `insns` name (as destination or source, whatever the
/// opcode makes of the field: a superset of what they use).
fn named(insns: &[Insn]) -> [bool; 11] {
    let mut n = [false; 11];
    n[0] = true;
    for i in insns {
        for x in [i.dst, i.src] {
            if let Some(b) = n.get_mut(x as usize) {
                *b = true;
            }
        }
    }
    n
}

fn frame_for(named: &[bool; 11]) -> Frame {
    let mut saved = vec![RBP];
    for (bpf, g) in [(6, RBX), (7, R13), (8, R14), (9, R15)] {
        if named[bpf] {
            saved.push(g);
        }
    }
    // The return address and an odd number of pushes leave `rsp` 16-byte aligned.
    let pad = if saved.len() % 2 == 0 { 8 } else { 0 };
    Frame { saved, pad }
}

/// A function's entry: the pushes and the 512-byte stack (see the module doc). The program's
/// entry also zeroes r0 and every register of r3–r9 that any function of the program names, so
/// nothing of the caller's is readable even if the verifier let a program read an unwritten
/// register.
fn prologue(a: &mut Asm, f: &Frame, zero: Option<&[bool; 11]>) {
    for &g in &f.saved {
        a.push(g);
    }
    a.alu_ri(true, Alu::Sub, RSP, STACK + f.pad);
    a.lea(RBP, RSP, STACK);
    if let Some(named) = zero {
        for (bpf, g) in [
            (0, RAX),
            (3, RDX),
            (4, RCX),
            (5, R8),
            (6, RBX),
            (7, R13),
            (8, R14),
            (9, R15),
        ] {
            if named[bpf] {
                a.alu_rr(false, Alu::Xor, g, g);
            }
        }
    }
}

fn epilogue(a: &mut Asm, f: &Frame) {
    if f.pad == 0 {
        a.mov_rr(true, RSP, RBP);
    } else {
        a.lea(RSP, RBP, f.pad);
    }
    for &g in f.saved.iter().rev() {
        a.pop(g);
    }
    a.ret();
}

fn invalid(pc: usize, why: &str) -> JitError {
    JitError::Invalid {
        pc,
        why: why.into(),
    }
}

/// The jump or call target of `insns[pc]`, if it has one (`None` for other instructions).
fn target(pc: usize, i: &Insn) -> Option<i64> {
    let rel = match (i.class(), i.op()) {
        (op::JMP, op::CALL) if i.src == op::PSEUDO_CALL => i64::from(i.imm),
        (op::JMP | op::JMP32, op::CALL | op::EXIT) => return None,
        (op::JMP32, op::JA) => i64::from(i.imm),
        (op::JMP | op::JMP32, _) => i64::from(i.off),
        _ => return None,
    };
    Some(pc as i64 + 1 + rel)
}

/// Checks that `insns` is a program the JIT translates into code that cannot leave it:
/// every instruction a valid RFC 9669 encoding the JIT supports (helpers as `helper` has
/// them), r10 never written, every jump inside its own function and never into the second
/// half of an `lddw`, every call to the start of a function, and every function ending in
/// `exit` or `goto` (so none runs into the next, or off the end of the code). Functions start
/// at 0 and at the target of each BPF-to-BPF call (code 0x85, src 1), and nowhere else; no
/// call targets 0.
/// Returns which instructions start a function.
pub fn check_program(
    insns: &[Insn],
    helper: &dyn Fn(i32) -> Option<u64>,
) -> Result<Vec<bool>, JitError> {
    let n = insns.len();
    if n == 0 {
        return Err(invalid(0, "empty program"));
    }
    let mut second = vec![false; n];
    let mut entries = vec![false; n];
    entries[0] = true;
    let mut pc = 0;
    while pc < n {
        let i = &insns[pc];
        if let Some(why) = op::encoding_error(i, insns.get(pc + 1)) {
            return Err(invalid(
                pc,
                &format!("invalid instruction {:#04x}: {why}", i.code),
            ));
        }
        let writes_r10 = match i.class() {
            op::ALU | op::ALU64 | op::LD | op::LDX => i.dst == 10,
            op::STX if i.mode() == op::ATOMIC => {
                i.src == 10 && i.imm & op::FETCH != 0 && i.imm != op::ATOMIC_CMPXCHG
            }
            _ => false,
        };
        if writes_r10 {
            return Err(invalid(pc, "r10 (the frame pointer) is read only"));
        }
        match (i.class(), i.op()) {
            (op::LD, _) => {
                if i.src != 0 {
                    return Err(JitError::Unsupported {
                        pc,
                        what: format!("lddw with pseudo source {} (unresolved)", i.src),
                    });
                }
                second[pc + 1] = true;
                pc += 2;
                continue;
            }
            (op::JMP, op::CALL) if i.src == op::PSEUDO_KFUNC_CALL => {
                return Err(JitError::Unsupported {
                    pc,
                    what: "a kfunc call".into(),
                });
            }
            (op::JMP, op::CALL) if i.src == 0 && helper(i.imm).is_none() => {
                return Err(JitError::UnknownHelper { pc, id: i.imm });
            }
            _ => {}
        }
        pc += 1;
    }
    for (pc, i) in insns.iter().enumerate() {
        if second[pc] || !(i.class() == op::JMP && i.op() == op::CALL && i.src == op::PSEUDO_CALL) {
            continue;
        }
        let t = target(pc, i).expect("a call");
        if !(0..n as i64).contains(&t) || second[t as usize] {
            return Err(invalid(
                pc,
                "call target outside the program or inside an lddw",
            ));
        }
        if t == 0 {
            // The entry clears registers a call must keep; and this could only be recursion.
            return Err(invalid(pc, "call to the program's entry"));
        }
        entries[t as usize] = true;
    }
    // Function of each instruction (index of its entry).
    let mut func = vec![0usize; n];
    for pc in 1..n {
        func[pc] = if entries[pc] { pc } else { func[pc - 1] };
    }
    for (pc, i) in insns.iter().enumerate() {
        if second[pc] || (i.class() == op::JMP && i.op() == op::CALL) {
            continue;
        }
        if let Some(t) = target(pc, i)
            && (!(0..n as i64).contains(&t) || second[t as usize] || func[t as usize] != func[pc])
        {
            return Err(invalid(
                pc,
                "jump target outside its function or inside an lddw",
            ));
        }
    }
    for last in (0..n).filter(|&pc| pc + 1 == n || entries[pc + 1]) {
        let i = &insns[last];
        let ends = !second[last]
            && matches!(i.class(), op::JMP | op::JMP32)
            && matches!(i.op(), op::EXIT | op::JA);
        if !ends {
            return Err(invalid(
                last,
                "function does not end in exit or goto (it would run into the next)",
            ));
        }
    }
    Ok(entries)
}

/// Translates `insns` (map references already resolved to addresses). `helper` gives the
/// address of each helper id. Everything [`check_program`] rejects is an error.
pub fn translate(insns: &[Insn], helper: &dyn Fn(i32) -> Option<u64>) -> Result<Vec<u8>, JitError> {
    translate_with(insns, helper, &|_| None).map(|(code, _)| code)
}

/// An array map whose `map_lookup_elem` the JIT may compute inline: for a key whose first four
/// bytes read as the little-endian `u32` `k`, the helper returns `values + k * stride` when
/// `k < max_entries`, else NULL (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineArray {
    pub values: u64,
    pub max_entries: u32,
    pub stride: u64,
}

/// The helper id whose calls [`translate_with`] may inline (`bpf_map_lookup_elem`).
pub const MAP_LOOKUP: i32 = 1;

/// [`translate`], with `map_lookup_elem` (helper [`MAP_LOOKUP`]) computed inline where the map
/// is known: `array(pc)` describes the map the `lddw` at `pc` loads into its register, when
/// that map is an array whose lookups the helper answers as [`InlineArray`] says (the caller
/// vouches for it; `None` keeps the helper call).
///
/// The map in r1 at a call is known when the last instruction that writes r1 before the call
/// is such an `lddw`, in straight-line code: no instruction after the `lddw`, up to and
/// including the call, is a jump target or a function entry, so every path to the call runs
/// that `lddw` last. Everywhere else (another map, a merge of paths, r1 copied from another register,
/// PERCPU and hash maps) the helper is called. The inline code computes exactly what the
/// helper returns, into r0; the helper's other effect, clobbering r1-r5, needs no
/// counterpart (the verifier lets no program read them after a call). Returns the code and
/// how many calls were inlined.
pub fn translate_with(
    insns: &[Insn],
    helper: &dyn Fn(i32) -> Option<u64>,
    array: &dyn Fn(usize) -> Option<InlineArray>,
) -> Result<(Vec<u8>, usize), JitError> {
    let entries = check_program(insns, helper)?;
    // Each function runs from its entry to the next one (check_program keeps jumps inside).
    let starts: Vec<usize> = (0..insns.len()).filter(|&pc| entries[pc]).collect();
    let all_named = named(insns);
    let frames: Vec<(usize, Frame)> = starts
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let end = starts.get(k + 1).copied().unwrap_or(insns.len());
            // The entry zeroes every register any function names, so it saves all of those.
            let names = if s == 0 {
                all_named
            } else {
                named(&insns[s..end])
            };
            (s, frame_for(&names))
        })
        .collect();
    let mut frame = frames[0].1.clone();
    // Instructions other paths can reach: jump targets and function entries.
    let mut merge = entries.clone();
    let mut pc = 0;
    while pc < insns.len() {
        let i = &insns[pc];
        if i.is_lddw() {
            pc += 2;
            continue;
        }
        if !(i.class() == op::JMP && i.op() == op::CALL)
            && let Some(t) = target(pc, i)
        {
            // check_program proved every target in range.
            merge[t as usize] = true;
        }
        pc += 1;
    }
    let mut inlined = 0;
    // The `lddw` whose map r1 holds on every path to here, if any.
    let mut r1_map: Option<usize> = None;
    let mut a = Asm::default();
    // Where each instruction's code starts, and where each function's prologue does.
    let mut at = vec![0usize; insns.len()];
    let mut entry_at = vec![0usize; insns.len()];
    // (rel32 field, target pc, is a call)
    let mut fixups: Vec<(usize, usize, bool)> = vec![];
    let mut pc = 0;
    while pc < insns.len() {
        if entries[pc] {
            entry_at[pc] = a.len();
            if let Some((_, f)) = frames.iter().find(|(s, _)| *s == pc) {
                frame = f.clone();
            }
            prologue(&mut a, &frame, (pc == 0).then_some(&all_named));
        }
        at[pc] = a.len();
        let i = insns[pc];
        if merge[pc] {
            r1_map = None;
        }
        let r1_before = r1_map;
        r1_map = next_r1_map(pc, &i, r1_map);
        let unsupported = |what: &str| JitError::Unsupported {
            pc,
            what: what.into(),
        };
        let jump_to = |i: &Insn| target(pc, i).expect("a jump") as usize;
        match i.class() {
            op::ALU | op::ALU64 => alu(&mut a, &i).map_err(&unsupported)?,
            op::LD => {
                let v = (u64::from(insns[pc + 1].imm as u32) << 32) | u64::from(i.imm as u32);
                a.mov_ri64(r(i.dst), v);
                at[pc + 1] = a.len();
                pc += 2;
                continue;
            }
            op::LDX if i.mode() == op::MEMSX => {
                a.load_sx(width(&i), r(i.dst), r(i.src), i32::from(i.off))
            }
            op::LDX => a.load(width(&i), r(i.dst), r(i.src), i32::from(i.off)),
            op::ST => a.store_imm(width(&i), r(i.dst), i32::from(i.off), i.imm),
            op::STX if i.mode() == op::MEM => {
                a.store(width(&i), r(i.dst), i32::from(i.off), r(i.src))
            }
            op::STX => atomic(&mut a, &i).map_err(&unsupported)?,
            _ => match i.op() {
                op::JA => {
                    let f = a.jmp();
                    fixups.push((f, jump_to(&i), false));
                }
                op::EXIT => epilogue(&mut a, &frame),
                op::CALL if i.src == op::PSEUDO_CALL => {
                    let f = a.call_rel();
                    fixups.push((f, jump_to(&i), true));
                }
                op::CALL => {
                    let addr = helper(i.imm).ok_or(JitError::UnknownHelper { pc, id: i.imm })?;
                    match r1_before.and_then(array).filter(|_| i.imm == MAP_LOOKUP) {
                        Some(m) if inline_array_lookup(&mut a, &m) => inlined += 1,
                        _ => {
                            a.mov_ri64(R11, addr);
                            a.call_r(R11);
                        }
                    }
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
                    fixups.push((f, jump_to(&i), false));
                }
            },
        }
        pc += 1;
    }
    for (f, target, call) in fixups {
        // A call lands on the function's prologue, a jump on the instruction itself.
        a.patch(f, if call { entry_at[target] } else { at[target] });
    }
    Ok((a.code, inlined))
}

/// What r1 holds after `i` (at `pc`), given `before`: `Some(l)` when it is what the `lddw` at
/// `l` loaded. Only instructions known to leave r1 alone keep it; an `lddw` into r1 sets it.
fn next_r1_map(pc: usize, i: &Insn, before: Option<usize>) -> Option<usize> {
    let keeps = match i.class() {
        op::LD => {
            return if i.dst == 1 { Some(pc) } else { before };
        }
        op::ALU | op::ALU64 | op::LDX => i.dst != 1,
        op::ST => true,
        op::STX if i.mode() == op::MEM => true,
        // Atomics write memory, and the fetch forms their source register (cmpxchg: r0).
        op::STX => i.src != 1,
        // Conditional jumps write nothing; calls clobber r1, and after exit or goto only a
        // jump (a merge point) reaches the next instruction.
        _ => !matches!(i.op(), op::CALL | op::EXIT | op::JA),
    };
    if keeps { before } else { None }
}

/// `r0 = map_lookup_elem(m, r2)` for an array map, inline: the key's first four bytes as a
/// `u32` (as the helper reads them), NULL from `max_entries` on, else `values + k * stride`.
/// Emits nothing and returns false for a stride the code below cannot multiply by.
///
/// ```text
///     mov eax, [rsi]          ; r0 = *(u32 *)r2, zero-extended
///     cmp eax, max_entries    ; unsigned 32-bit compare
///     jae null
///     shl rax, log2(stride)   ; or: mov r11, stride; imul rax, r11
///     mov r11, values
///     add rax, r11
///     jmp done
/// null:
///     xor eax, eax
/// done:
/// ```
fn inline_array_lookup(a: &mut Asm, m: &InlineArray) -> bool {
    // Every index below max_entries gives an offset that fits in 64 bits (the helper computes
    // it in usize too; the map's segment holds max_entries * stride bytes).
    if m.stride == 0 || u64::from(m.max_entries).checked_mul(m.stride).is_none() {
        return false;
    }
    a.load(Width::B32, RAX, MAP[2], 0);
    a.alu_ri(false, Alu::Cmp, RAX, m.max_entries as i32);
    let null = a.jcc(Cond::Ae);
    if m.stride.is_power_of_two() {
        if m.stride > 1 {
            a.shift_imm(true, Shift::Shl, RAX, m.stride.trailing_zeros() as u8);
        }
    } else {
        a.mov_ri64(R11, m.stride);
        a.imul_rr(true, RAX, R11);
    }
    a.mov_ri64(R11, m.values);
    a.alu_rr(true, Alu::Add, RAX, R11);
    let done = a.jmp();
    let here = a.len();
    a.patch(null, here);
    a.alu_rr(false, Alu::Xor, RAX, RAX);
    let end = a.len();
    a.patch(done, end);
    true
}

/// An atomic read-modify-write. r0 is rax, which `cmpxchg` needs: the fetch forms of
/// and/or/xor (a `cmpxchg` loop) keep r0 in r10 of x86 meanwhile, and use it in place of
/// a base or source register that is r0.
fn atomic(a: &mut Asm, i: &Insn) -> Result<(), &'static str> {
    let w = i.size_bits() == op::DW;
    let (base, off, src) = (r(i.dst), i32::from(i.off), r(i.src));
    let loop_op = |k| match k {
        op::ATOMIC_OR => Some(Alu::Or),
        op::ATOMIC_AND => Some(Alu::And),
        op::ATOMIC_XOR => Some(Alu::Xor),
        _ => None,
    };
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
        x if x & op::FETCH != 0 && loop_op(x & !op::FETCH).is_some() => {
            let k = loop_op(x & !op::FETCH).expect("checked");
            let sub = |g: Gpr| if g == RAX { R10 } else { g };
            let (b, s) = (sub(base), sub(src));
            a.mov_rr(true, R10, RAX);
            a.load(if w { Width::B64 } else { Width::B32 }, RAX, b, off);
            let again = a.len();
            a.mov_rr(w, R11, RAX);
            a.alu_rr(w, k, R11, s);
            a.lock_cmpxchg(w, b, off, R11);
            let f = a.jcc(Cond::Ne);
            a.patch(f, again);
            // rax: the old value (zero-extended for 32 bits).
            if src != RAX {
                a.mov_rr(w, src, RAX);
                a.mov_rr(true, RAX, R10);
            }
        }
        _ => return Err("atomic operation"),
    }
    Ok(())
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
        op::MOV if reg && i.off != 0 => a.movsx_rr(w, i.off as u8, dst, src),
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
            let div = i.op() == op::DIV;
            let signed = i.off == op::OFF_SIGNED;
            if reg {
                a.mov_rr(w, R11, src);
            } else {
                a.mov_ri64(R11, imm_value(w, imm));
            }
            // x86 division traps on a zero divisor, and signed division on MIN / -1: both
            // are handled before it, with BPF's results (x / 0 = 0, x % 0 = x,
            // x s/ -1 = -x wrapping, x s% -1 = 0).
            let mut done = vec![];
            a.test_rr(w, R11, R11);
            let nonzero = a.jcc(Cond::Ne);
            if div {
                a.alu_rr(false, Alu::Xor, dst, dst);
            } else if !w {
                a.mov_rr(false, dst, dst);
            }
            done.push(a.jmp());
            let here = a.len();
            a.patch(nonzero, here);
            if signed {
                a.alu_ri(w, Alu::Cmp, R11, -1);
                let not_minus_one = a.jcc(Cond::Ne);
                if div {
                    a.neg(w, dst);
                } else {
                    a.alu_rr(false, Alu::Xor, dst, dst);
                }
                done.push(a.jmp());
                let here = a.len();
                a.patch(not_minus_one, here);
            }
            a.push(RAX);
            a.push(RDX);
            a.mov_rr(w, RAX, dst);
            if signed {
                a.cqo(w);
                a.idiv(w, R11);
            } else {
                a.alu_rr(false, Alu::Xor, RDX, RDX);
                a.div(w, R11);
            }
            a.mov_rr(w, R11, if div { RAX } else { RDX });
            a.pop(RDX);
            a.pop(RAX);
            a.mov_rr(w, dst, R11);
            let end = a.len();
            for f in done {
                a.patch(f, end);
            }
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
        // bswap (ALU64, source bit 0) swaps as `be` does on this little-endian host.
        op::END => match (reg || w, imm) {
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
                // neg has no source operand (its source bit and imm must be 0).
                let form = if o == op::NEG { op::K } else { op::X };
                for &d in &regs {
                    for &s in &regs {
                        let s = if o == op::NEG { 0 } else { s };
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
                            p.push(i(class | o | form, d, s, 0, 0));
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
                        if (matches!(o, op::LSH | op::RSH | op::ARSH)
                            && !(0..if class == op::ALU64 { 64 } else { 32 }).contains(&imm))
                            || (o == op::NEG && imm != 0)
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
        let r = unsafe { e.call(ctx.as_mut_ptr()) };
        assert_eq!(r, 0, "misaligned stack at a helper call");
    }

    /// Frames save only the callee-saved registers a function names: for every subset of r6–r9
    /// named by the main program and every subset named by a subprogram it calls, helpers see
    /// an aligned stack in both, and the caller's r6–r9 survive the call (the subprogram
    /// overwrites those it names).
    #[test]
    fn frames_save_what_each_function_names_and_stay_aligned() {
        let probe = probe_alignment as *const () as usize as u64;
        let helper = |id: i32| (id == 99).then_some(probe);
        for main_set in 0u8..16 {
            for sub_set in 0u8..16 {
                let regs = |set: u8| (0..4u8).filter(move |k| set & (1 << k) != 0).map(|k| 6 + k);
                let mut p = vec![];
                // main: rK = K*1000 for its registers, probe, call sub, r0 = probe results +
                // sum of (rK - K*1000), which is 0 unless the call clobbered one.
                for r6 in regs(main_set) {
                    p.push(i(op::ALU64 | op::MOV | op::K, r6, 0, 0, r6 as i32 * 1000));
                }
                p.push(i(op::JMP | op::CALL, 0, 0, 0, 99));
                p.push(i(op::ALU64 | op::MOV | op::X, 1, 0, 0, 0));
                p.push(i(op::STX | op::MEM | op::DW, 10, 1, -8, 0));
                let call_at = p.len();
                p.push(i(op::JMP | op::CALL, 0, op::PSEUDO_CALL, 0, 0)); // patched below
                p.push(i(op::LDX | op::MEM | op::DW, 1, 10, -8, 0));
                p.push(i(op::ALU64 | op::ADD | op::X, 0, 1, 0, 0));
                for r6 in regs(main_set) {
                    p.push(i(op::ALU64 | op::SUB | op::K, r6, 0, 0, r6 as i32 * 1000));
                    p.push(i(op::ALU64 | op::ADD | op::X, 0, r6, 0, 0));
                }
                p.push(i(op::JMP | op::EXIT, 0, 0, 0, 0));
                let sub = p.len();
                p[call_at].imm = (sub - call_at - 1) as i32;
                // sub: overwrite its registers, probe, return the probe's result.
                for r6 in regs(sub_set) {
                    p.push(i(op::ALU64 | op::MOV | op::K, r6, 0, 0, -7));
                }
                p.push(i(op::JMP | op::CALL, 0, 0, 0, 99));
                p.push(i(op::JMP | op::EXIT, 0, 0, 0, 0));
                let code = translate(&p, &helper).unwrap();
                let e = ExecBuf::new(&code).unwrap();
                let mut ctx = [0u8; 8];
                // SAFETY: the program only calls the probe and its own subprogram.
                let got = unsafe { e.call(ctx.as_mut_ptr()) };
                assert_eq!(
                    got, 0,
                    "main names {main_set:#06b}, sub names {sub_set:#06b}"
                );
            }
        }
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
