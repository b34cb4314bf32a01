//! An x86-64 instruction encoder: x86 instructions to bytes, knowing nothing of BPF.

/// An x86-64 general-purpose register number (rax = 0 … r15 = 15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpr(pub u8);

pub const RAX: Gpr = Gpr(0);
pub const RCX: Gpr = Gpr(1);
pub const RDX: Gpr = Gpr(2);
pub const RBX: Gpr = Gpr(3);
pub const RSP: Gpr = Gpr(4);
pub const RBP: Gpr = Gpr(5);
pub const RSI: Gpr = Gpr(6);
pub const RDI: Gpr = Gpr(7);
pub const R8: Gpr = Gpr(8);
pub const R10: Gpr = Gpr(10);
pub const R11: Gpr = Gpr(11);
pub const R13: Gpr = Gpr(13);
pub const R14: Gpr = Gpr(14);
pub const R15: Gpr = Gpr(15);

impl Gpr {
    fn low(self) -> u8 {
        self.0 & 7
    }
    fn ext(self) -> u8 {
        self.0 >> 3
    }
}

/// Two-operand ALU operations that share the `op r/m, r` / `81 /digit` encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alu {
    Add,
    Or,
    And,
    Sub,
    Xor,
    Cmp,
}

impl Alu {
    fn rm_r(self) -> u8 {
        match self {
            Alu::Add => 0x01,
            Alu::Or => 0x09,
            Alu::And => 0x21,
            Alu::Sub => 0x29,
            Alu::Xor => 0x31,
            Alu::Cmp => 0x39,
        }
    }
    fn digit(self) -> u8 {
        match self {
            Alu::Add => 0,
            Alu::Or => 1,
            Alu::And => 4,
            Alu::Sub => 5,
            Alu::Xor => 6,
            Alu::Cmp => 7,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shift {
    Shl,
    Shr,
    Sar,
}

impl Shift {
    fn digit(self) -> u8 {
        match self {
            Shift::Shl => 4,
            Shift::Shr => 5,
            Shift::Sar => 7,
        }
    }
}

/// Condition codes for `jcc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    B = 0x2,
    Ae = 0x3,
    E = 0x4,
    Ne = 0x5,
    Be = 0x6,
    A = 0x7,
    L = 0xc,
    Ge = 0xd,
    Le = 0xe,
    G = 0xf,
}

/// Operand width of memory accesses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    B8,
    B16,
    B32,
    B64,
}

#[derive(Default)]
pub struct Asm {
    pub code: Vec<u8>,
}

impl Asm {
    fn b(&mut self, x: u8) {
        self.code.push(x);
    }
    fn d(&mut self, x: i32) {
        self.code.extend_from_slice(&x.to_le_bytes());
    }
    fn rex(&mut self, w: bool, r: u8, x: u8, b: u8, force: bool) {
        let v = 0x40 | (u8::from(w) << 3) | (r << 2) | (x << 1) | b;
        if v != 0x40 || force {
            self.b(v);
        }
    }
    fn modrm(&mut self, md: u8, reg: u8, rm: u8) {
        self.b((md << 6) | ((reg & 7) << 3) | (rm & 7));
    }
    /// ModRM + SIB + disp32 for `[base + disp]`.
    fn mem(&mut self, reg: u8, base: Gpr, disp: i32) {
        self.modrm(2, reg, base.low());
        if base.low() == 4 {
            self.b(0x24);
        }
        self.d(disp);
    }

    pub fn len(&self) -> usize {
        self.code.len()
    }

    pub fn is_empty(&self) -> bool {
        self.code.is_empty()
    }

    /// `op dst, src` (64- or 32-bit).
    pub fn alu_rr(&mut self, w: bool, op: Alu, dst: Gpr, src: Gpr) {
        self.rex(w, src.ext(), 0, dst.ext(), false);
        self.b(op.rm_r());
        self.modrm(3, src.0, dst.0);
    }

    /// `op dst, imm32` (sign-extended for 64-bit).
    pub fn alu_ri(&mut self, w: bool, op: Alu, dst: Gpr, imm: i32) {
        self.rex(w, 0, 0, dst.ext(), false);
        self.b(0x81);
        self.modrm(3, op.digit(), dst.0);
        self.d(imm);
    }

    pub fn mov_rr(&mut self, w: bool, dst: Gpr, src: Gpr) {
        self.rex(w, src.ext(), 0, dst.ext(), false);
        self.b(0x89);
        self.modrm(3, src.0, dst.0);
    }

    /// `mov dst, imm` choosing the shortest exact form.
    pub fn mov_ri64(&mut self, dst: Gpr, imm: u64) {
        if imm <= u32::MAX as u64 {
            // mov r32, imm32 zero-extends.
            self.rex(false, 0, 0, dst.ext(), false);
            self.b(0xb8 + dst.low());
            self.d(imm as u32 as i32);
        } else if imm as i64 >= i64::from(i32::MIN) && imm as i64 <= i64::from(i32::MAX) {
            self.rex(true, 0, 0, dst.ext(), false);
            self.b(0xc7);
            self.modrm(3, 0, dst.0);
            self.d(imm as i32);
        } else {
            self.rex(true, 0, 0, dst.ext(), false);
            self.b(0xb8 + dst.low());
            self.code.extend_from_slice(&imm.to_le_bytes());
        }
    }

    /// `imul dst, src`.
    pub fn imul_rr(&mut self, w: bool, dst: Gpr, src: Gpr) {
        self.rex(w, dst.ext(), 0, src.ext(), false);
        self.b(0x0f);
        self.b(0xaf);
        self.modrm(3, dst.0, src.0);
    }

    pub fn neg(&mut self, w: bool, r: Gpr) {
        self.rex(w, 0, 0, r.ext(), false);
        self.b(0xf7);
        self.modrm(3, 3, r.0);
    }

    pub fn shift_imm(&mut self, w: bool, op: Shift, r: Gpr, n: u8) {
        self.rex(w, 0, 0, r.ext(), false);
        self.b(0xc1);
        self.modrm(3, op.digit(), r.0);
        self.b(n);
    }

    /// Shift by `cl`.
    pub fn shift_cl(&mut self, w: bool, op: Shift, r: Gpr) {
        self.rex(w, 0, 0, r.ext(), false);
        self.b(0xd3);
        self.modrm(3, op.digit(), r.0);
    }

    /// Unsigned `div r` (rdx:rax / r).
    pub fn div(&mut self, w: bool, r: Gpr) {
        self.rex(w, 0, 0, r.ext(), false);
        self.b(0xf7);
        self.modrm(3, 6, r.0);
    }

    /// Signed `idiv r` (rdx:rax / r).
    pub fn idiv(&mut self, w: bool, r: Gpr) {
        self.rex(w, 0, 0, r.ext(), false);
        self.b(0xf7);
        self.modrm(3, 7, r.0);
    }

    /// `cqo` (64-bit) or `cdq` (32-bit): sign-extend rax into rdx.
    pub fn cqo(&mut self, w: bool) {
        self.rex(w, 0, 0, 0, false);
        self.b(0x99);
    }

    /// `movsx dst, src` from the low `bits` (8, 16 or 32) of `src`, into 64 bits (`w`) or
    /// 32 bits (zero-extended further, as every 32-bit write is).
    pub fn movsx_rr(&mut self, w: bool, bits: u8, dst: Gpr, src: Gpr) {
        // REX (forced for 8 bits) makes sil/dil, not dh/bh, the byte registers.
        self.rex(w || bits == 32, dst.ext(), 0, src.ext(), bits == 8);
        match bits {
            8 => {
                self.b(0x0f);
                self.b(0xbe);
            }
            16 => {
                self.b(0x0f);
                self.b(0xbf);
            }
            _ => self.b(0x63),
        }
        self.modrm(3, dst.0, src.0);
    }

    /// Sign-extending load into 64 bits, `dst = [base + disp]` (1, 2 or 4 bytes).
    pub fn load_sx(&mut self, wd: Width, dst: Gpr, base: Gpr, disp: i32) {
        self.rex(true, dst.ext(), 0, base.ext(), false);
        match wd {
            Width::B8 => {
                self.b(0x0f);
                self.b(0xbe);
            }
            Width::B16 => {
                self.b(0x0f);
                self.b(0xbf);
            }
            _ => self.b(0x63),
        }
        self.mem(dst.0, base, disp);
    }

    pub fn test_rr(&mut self, w: bool, a: Gpr, b: Gpr) {
        self.rex(w, b.ext(), 0, a.ext(), false);
        self.b(0x85);
        self.modrm(3, b.0, a.0);
    }

    /// `test r, imm32`.
    pub fn test_ri(&mut self, w: bool, r: Gpr, imm: i32) {
        self.rex(w, 0, 0, r.ext(), false);
        self.b(0xf7);
        self.modrm(3, 0, r.0);
        self.d(imm);
    }

    pub fn bswap(&mut self, w: bool, r: Gpr) {
        self.rex(w, 0, 0, r.ext(), false);
        self.b(0x0f);
        self.b(0xc8 + r.low());
    }

    /// `rol r16, 8` (swap the two low bytes).
    pub fn rol16_8(&mut self, r: Gpr) {
        self.b(0x66);
        self.rex(false, 0, 0, r.ext(), false);
        self.b(0xc1);
        self.modrm(3, 0, r.0);
        self.b(8);
    }

    /// `movzx r32, r16`.
    pub fn movzx16(&mut self, dst: Gpr, src: Gpr) {
        self.rex(false, dst.ext(), 0, src.ext(), false);
        self.b(0x0f);
        self.b(0xb7);
        self.modrm(3, dst.0, src.0);
    }

    /// Zero-extending load `dst = [base + disp]`.
    pub fn load(&mut self, wd: Width, dst: Gpr, base: Gpr, disp: i32) {
        match wd {
            Width::B8 | Width::B16 => {
                self.rex(false, dst.ext(), 0, base.ext(), false);
                self.b(0x0f);
                self.b(if wd == Width::B8 { 0xb6 } else { 0xb7 });
            }
            Width::B32 => {
                self.rex(false, dst.ext(), 0, base.ext(), false);
                self.b(0x8b);
            }
            Width::B64 => {
                self.rex(true, dst.ext(), 0, base.ext(), false);
                self.b(0x8b);
            }
        }
        self.mem(dst.0, base, disp);
    }

    /// `[base + disp] = src`.
    pub fn store(&mut self, wd: Width, base: Gpr, disp: i32, src: Gpr) {
        match wd {
            Width::B8 => {
                // REX makes sil/dil (not ah/dh) addressable.
                self.rex(false, src.ext(), 0, base.ext(), true);
                self.b(0x88);
            }
            Width::B16 => {
                self.b(0x66);
                self.rex(false, src.ext(), 0, base.ext(), false);
                self.b(0x89);
            }
            Width::B32 => {
                self.rex(false, src.ext(), 0, base.ext(), false);
                self.b(0x89);
            }
            Width::B64 => {
                self.rex(true, src.ext(), 0, base.ext(), false);
                self.b(0x89);
            }
        }
        self.mem(src.0, base, disp);
    }

    /// `[base + disp] = imm`.
    pub fn store_imm(&mut self, wd: Width, base: Gpr, disp: i32, imm: i32) {
        match wd {
            Width::B8 => {
                self.rex(false, 0, 0, base.ext(), false);
                self.b(0xc6);
                self.mem(0, base, disp);
                self.b(imm as u8);
            }
            Width::B16 => {
                self.b(0x66);
                self.rex(false, 0, 0, base.ext(), false);
                self.b(0xc7);
                self.mem(0, base, disp);
                self.code.extend_from_slice(&(imm as u16).to_le_bytes());
            }
            Width::B32 | Width::B64 => {
                self.rex(wd == Width::B64, 0, 0, base.ext(), false);
                self.b(0xc7);
                self.mem(0, base, disp);
                self.d(imm);
            }
        }
    }

    /// `lock op [base + disp], src` for add/or/and/xor.
    pub fn lock_alu(&mut self, w: bool, op: Alu, base: Gpr, disp: i32, src: Gpr) {
        self.b(0xf0);
        self.rex(w, src.ext(), 0, base.ext(), false);
        self.b(op.rm_r());
        self.mem(src.0, base, disp);
    }

    /// `lock xadd [base + disp], src`.
    pub fn lock_xadd(&mut self, w: bool, base: Gpr, disp: i32, src: Gpr) {
        self.b(0xf0);
        self.rex(w, src.ext(), 0, base.ext(), false);
        self.b(0x0f);
        self.b(0xc1);
        self.mem(src.0, base, disp);
    }

    /// `xchg [base + disp], src` (implicitly locked).
    pub fn xchg(&mut self, w: bool, base: Gpr, disp: i32, src: Gpr) {
        self.rex(w, src.ext(), 0, base.ext(), false);
        self.b(0x87);
        self.mem(src.0, base, disp);
    }

    /// `lock cmpxchg [base + disp], src` (compares with rax).
    pub fn lock_cmpxchg(&mut self, w: bool, base: Gpr, disp: i32, src: Gpr) {
        self.b(0xf0);
        self.rex(w, src.ext(), 0, base.ext(), false);
        self.b(0x0f);
        self.b(0xb1);
        self.mem(src.0, base, disp);
    }

    pub fn push(&mut self, r: Gpr) {
        self.rex(false, 0, 0, r.ext(), false);
        self.b(0x50 + r.low());
    }

    pub fn pop(&mut self, r: Gpr) {
        self.rex(false, 0, 0, r.ext(), false);
        self.b(0x58 + r.low());
    }

    /// `lea dst, [base + disp]`.
    pub fn lea(&mut self, dst: Gpr, base: Gpr, disp: i32) {
        self.rex(true, dst.ext(), 0, base.ext(), false);
        self.b(0x8d);
        self.mem(dst.0, base, disp);
    }

    pub fn ret(&mut self) {
        self.b(0xc3);
    }

    /// `call r`.
    pub fn call_r(&mut self, r: Gpr) {
        self.rex(false, 0, 0, r.ext(), false);
        self.b(0xff);
        self.modrm(3, 2, r.0);
    }

    /// `jmp rel32`; returns the offset of the rel32 field for patching.
    pub fn jmp(&mut self) -> usize {
        self.b(0xe9);
        self.d(0);
        self.len() - 4
    }

    /// `jcc rel32`; returns the offset of the rel32 field.
    pub fn jcc(&mut self, c: Cond) -> usize {
        self.b(0x0f);
        self.b(0x80 + c as u8);
        self.d(0);
        self.len() - 4
    }

    /// `call rel32`; returns the offset of the rel32 field.
    pub fn call_rel(&mut self) -> usize {
        self.b(0xe8);
        self.d(0);
        self.len() - 4
    }

    /// Points the rel32 at `at` to code offset `target`.
    pub fn patch(&mut self, at: usize, target: usize) {
        let rel = target as i64 - (at as i64 + 4);
        self.code[at..at + 4].copy_from_slice(&(rel as i32).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(f: impl FnOnce(&mut Asm)) -> String {
        let mut a = Asm::default();
        f(&mut a);
        a.code
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn objdump(hex: &str) -> Option<String> {
        let bytes: Vec<u8> = hex
            .split(' ')
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        let path = std::env::temp_dir()
            .join(format!("ncclbpf-x86-{}-{hex}.bin", std::process::id()).replace(' ', ""));
        std::fs::write(&path, &bytes).ok()?;
        let out = std::process::Command::new("objdump")
            .args(["-D", "-b", "binary", "-mi386:x86-64"])
            .arg(&path)
            .output()
            .ok()?;
        let _ = std::fs::remove_file(&path);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text.lines().find(|l| l.trim_start().starts_with("0:"))?;
        Some(
            line.split('\t')
                .skip(2)
                .collect::<Vec<_>>()
                .join(" ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        )
    }

    /// (encoding, bytes, what GNU objdump prints for them).
    #[test]
    fn golden_encodings() {
        let rows: Vec<(String, &str, &str)> = vec![
            (
                hex(|a| a.alu_rr(true, Alu::Add, RAX, RDI)),
                "48 01 f8",
                "add %rdi,%rax",
            ),
            (
                hex(|a| a.alu_rr(false, Alu::Sub, R13, R8)),
                "45 29 c5",
                "sub %r8d,%r13d",
            ),
            (
                hex(|a| a.alu_ri(true, Alu::Cmp, R15, -1)),
                "49 81 ff ff ff ff ff",
                "cmp $0xffffffffffffffff,%r15",
            ),
            (
                hex(|a| a.mov_ri64(RSI, 0x1_0000_0000)),
                "48 be 00 00 00 00 01 00 00 00",
                "movabs $0x100000000,%rsi",
            ),
            (
                hex(|a| a.mov_ri64(R14, 7)),
                "41 be 07 00 00 00",
                "mov $0x7,%r14d",
            ),
            (
                hex(|a| a.mov_ri64(RBX, u64::MAX)),
                "48 c7 c3 ff ff ff ff",
                "mov $0xffffffffffffffff,%rbx",
            ),
            (
                hex(|a| a.imul_rr(true, RDX, R15)),
                "49 0f af d7",
                "imul %r15,%rdx",
            ),
            (
                hex(|a| a.shift_cl(true, Shift::Sar, R13)),
                "49 d3 fd",
                "sar %cl,%r13",
            ),
            (
                hex(|a| a.shift_imm(false, Shift::Shl, RDI, 3)),
                "c1 e7 03",
                "shl $0x3,%edi",
            ),
            (hex(|a| a.div(true, R11)), "49 f7 f3", "div %r11"),
            (
                hex(|a| a.load(Width::B8, RAX, R13, -4)),
                "41 0f b6 85 fc ff ff ff",
                "movzbl -0x4(%r13),%eax",
            ),
            (
                hex(|a| a.load(Width::B64, R8, RBP, 16)),
                "4c 8b 85 10 00 00 00",
                "mov 0x10(%rbp),%r8",
            ),
            (
                hex(|a| a.store(Width::B8, RBP, -8, RSI)),
                "40 88 b5 f8 ff ff ff",
                "mov %sil,-0x8(%rbp)",
            ),
            (
                hex(|a| a.store(Width::B16, RDI, 2, R14)),
                "66 44 89 b7 02 00 00 00",
                "mov %r14w,0x2(%rdi)",
            ),
            (
                hex(|a| a.store_imm(Width::B64, RSP, 8, 5)),
                "48 c7 84 24 08 00 00 00 05 00 00 00",
                "movq $0x5,0x8(%rsp)",
            ),
            (
                hex(|a| a.lock_xadd(true, RAX, 8, RDI)),
                "f0 48 0f c1 b8 08 00 00 00",
                "lock xadd %rdi,0x8(%rax)",
            ),
            (
                hex(|a| a.lock_cmpxchg(false, RSI, 0, RDX)),
                "f0 0f b1 96 00 00 00 00",
                "lock cmpxchg %edx,0x0(%rsi)",
            ),
            (
                hex(|a| a.xchg(true, RBX, 0, R15)),
                "4c 87 bb 00 00 00 00",
                "xchg %r15,0x0(%rbx)",
            ),
            (hex(|a| a.push(R15)), "41 57", "push %r15"),
            (hex(|a| a.bswap(true, R13)), "49 0f cd", "bswap %r13"),
            (hex(|a| a.rol16_8(RCX)), "66 c1 c1 08", "rol $0x8,%cx"),
            (hex(|a| a.idiv(true, R11)), "49 f7 fb", "idiv %r11"),
            (hex(|a| a.idiv(false, R11)), "41 f7 fb", "idiv %r11d"),
            (hex(|a| a.cqo(true)), "48 99", "cqto"),
            (hex(|a| a.cqo(false)), "99", "cltd"),
            (
                hex(|a| a.movsx_rr(true, 8, RAX, RSI)),
                "48 0f be c6",
                "movsbq %sil,%rax",
            ),
            (
                hex(|a| a.movsx_rr(false, 8, R13, RDI)),
                "44 0f be ef",
                "movsbl %dil,%r13d",
            ),
            (
                hex(|a| a.movsx_rr(true, 16, RDX, R15)),
                "49 0f bf d7",
                "movswq %r15w,%rdx",
            ),
            (
                hex(|a| a.movsx_rr(false, 16, RCX, RBX)),
                "0f bf cb",
                "movswl %bx,%ecx",
            ),
            (
                hex(|a| a.movsx_rr(true, 32, R14, RAX)),
                "4c 63 f0",
                "movslq %eax,%r14",
            ),
            (
                hex(|a| a.load_sx(Width::B8, RAX, RBP, -1)),
                "48 0f be 85 ff ff ff ff",
                "movsbq -0x1(%rbp),%rax",
            ),
            (
                hex(|a| a.load_sx(Width::B16, R8, RDI, 2)),
                "4c 0f bf 87 02 00 00 00",
                "movswq 0x2(%rdi),%r8",
            ),
            (
                hex(|a| a.load_sx(Width::B32, RBX, R13, 8)),
                "49 63 9d 08 00 00 00",
                "movslq 0x8(%r13),%rbx",
            ),
        ];
        let mut bad = vec![];
        for (got, want, asm) in &rows {
            if got != want {
                bad.push(format!("{asm}: got {got}, want {want}"));
            }
            // Where GNU objdump is installed, an independent disassembler checks the text.
            if let Some(text) = objdump(want)
                && text.replace(' ', "") != asm.replace(' ', "")
            {
                bad.push(format!(
                    "{want}: objdump says '{text}', the table says '{asm}'"
                ));
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
