//! A generator of tuner programs around the locality rule's weak spots: context loads of every
//! width at every aligned offset (8-byte loads that span an agreed and a rank-local field,
//! narrow loads inside one), stack stores and fills of every width and offset (through `r10`,
//! through other stack pointers, through a caller's pointer in a callee), copies between them,
//! lookups whose keys are stack bytes, branches on any of it that skip code writing registers,
//! stack bytes and map values, calls into subprograms up to four frames deep (given a stack
//! pointer or not), and decisions (`algo`, `proto`, `nchannels`; `state[]` in `tuner/epoch`)
//! from any register.
//!
//! Everything is read from agreed data (the context's agreed fields, `.rodata`, a config map) or
//! rank-local data (`reg_buff`, `usable`, `.bss`, a hash map filled per rank), so that a program
//! the verifier accepts must decide the same for every choice of the rank-local data
//! (`tests/locality_fuzz.rs`).

use super::progen::Rng;
use super::soundgen::{Item, Label, resolve};
use policy_object::insn::build::{
    alu32_imm, alu64_imm, alu64_reg, call, exit, insn, ld_map, ld_map_value, ldx, mov64_imm,
    mov64_reg, st, stx,
};
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, MapKind, Object, Program, Scope};

/// Map indices of [`maps`].
pub const RODATA: i32 = 0;
pub const BSS: i32 = 1;
pub const CFG: i32 = 2;
pub const SEEN: i32 = 3;
/// Value size of every map.
pub const VALUE: i16 = 16;

/// `.rodata` (config, fixed), `.bss` (rank-local), `cfg` (a config array, agreed in hooks with
/// the communicator's views), `seen` (a rank-local hash: whether a key is present is this
/// rank's own).
pub fn maps() -> Vec<MapDef> {
    let m = |name: &str, kind, scope, n| MapDef {
        name: name.into(),
        kind,
        key_size: 4,
        value_size: VALUE as u32,
        max_entries: n,
        flags: 0,
        initial: None,
        read_only: false,
        scope,
        source: None,
        reduce: policy_object::Reduce::Sum,
    };
    let mut ro = m(".rodata", MapKind::Array, Scope::Config, 1);
    ro.initial = Some((0..VALUE as u8).map(|b| b.wrapping_mul(37)).collect());
    ro.read_only = true;
    let mut bss = m(".bss", MapKind::Array, Scope::Local, 1);
    bss.initial = Some(vec![0; VALUE as usize]);
    vec![
        ro,
        bss,
        m("cfg", MapKind::Array, Scope::Config, 4),
        m("seen", MapKind::Hash, Scope::Local, 8),
    ]
}

/// The deciding hook a program is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hook {
    Tuner,
    Epoch,
}

impl Hook {
    pub fn section(self) -> &'static str {
        match self {
            Hook::Tuner => "tuner",
            Hook::Epoch => "tuner/epoch",
        }
    }
    /// Context bytes loads are drawn from.
    fn ctx_len(self) -> i16 {
        match self {
            Hook::Tuner => 64,
            Hook::Epoch => 112,
        }
    }
}

/// What a program contains, for coverage counts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shapes {
    pub wide_ctx: bool,
    pub partial_ctx: bool,
    pub deep: bool,
    pub region_call: bool,
    pub stack_via_ptr: bool,
}

struct Gen {
    r: Rng,
    hook: Hook,
    items: Vec<Item>,
    labels: usize,
    /// Subprograms still to emit: (label, depth, given a stack pointer).
    subs: Vec<(Label, usize, bool)>,
    /// Frame depth of the code being emitted (0: main).
    depth: usize,
    /// Whether `r9` holds a pointer to 8 bytes of the caller's stack (in a callee).
    r9_stack: bool,
    /// Open forward branches: their labels and how many snippets remain before each.
    open: Vec<(Label, u32)>,
    s: Shapes,
}

/// Registers that hold data (`r5` is the stack-pointer temporary, `r6` the context, `r7` and
/// `r8` `.rodata` and `.bss`, `r9` a callee's argument).
const DATA: [u8; 5] = [0, 1, 2, 3, 4];
const WIDTHS: [i16; 4] = [1, 2, 4, 8];

fn size_bits(w: i16) -> u8 {
    match w {
        1 => op::B,
        2 => op::H,
        4 => op::W,
        _ => op::DW,
    }
}

impl Gen {
    fn below(&mut self, n: u64) -> u64 {
        self.r.below(n)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.r.below(xs.len() as u64) as usize]
    }
    fn emit(&mut self, i: Insn) {
        self.items.push(Item::I(i));
    }
    fn emit2(&mut self, i: [Insn; 2]) {
        self.emit(i[0]);
        self.emit(i[1]);
    }
    fn label(&mut self) -> Label {
        self.labels += 1;
        self.labels - 1
    }
    fn reg(&mut self) -> u8 {
        self.pick(&DATA)
    }
    /// A naturally aligned offset for `w` bytes in `[lo, hi)`.
    fn aligned(&mut self, w: i16, lo: i16, hi: i16) -> i16 {
        let n = ((hi - lo) / w).max(1);
        lo + w * self.below(n as u64) as i16
    }
    fn zero_scratch(&mut self) {
        for r in 0..=5 {
            self.emit(mov64_imm(r, 0));
        }
    }

    fn prologue(&mut self, stack: i16) {
        self.emit2(ld_map_value(7, RODATA, 0));
        self.emit2(ld_map_value(8, BSS, 0));
        for k in 1..=stack / 8 {
            self.emit(st(op::DW, 10, -8 * k, 0));
        }
        self.zero_scratch();
    }

    fn ctx_load(&mut self) {
        let w = self.pick(&WIDTHS);
        let off = self.aligned(w, 0, self.hook.ctx_len());
        if w == 8 {
            self.s.wide_ctx = true;
        } else if w < 4 {
            self.s.partial_ctx = true;
        }
        let d = self.reg();
        self.emit(ldx(size_bits(w), d, 6, off));
    }

    fn value_load(&mut self) {
        let w = self.pick(&WIDTHS);
        let off = self.aligned(w, 0, VALUE);
        let base = self.pick(&[7u8, 8]);
        let d = self.reg();
        self.emit(ldx(size_bits(w), d, base, off));
    }

    fn value_store(&mut self) {
        let w = self.pick(&WIDTHS);
        let off = self.aligned(w, 0, VALUE);
        let s = self.reg();
        self.emit(stx(size_bits(w), 8, off, s));
    }

    /// A stack access in this frame (fp-32..fp-1), through r10 or another stack pointer.
    fn stack_access(&mut self) {
        let w = self.pick(&WIDTHS);
        let off = self.aligned(w, -32, 0);
        let r = self.reg();
        let (base, off) = if self.below(3) == 0 {
            self.s.stack_via_ptr = true;
            let k = 8 * self.below(4) as i16;
            self.emit(mov64_reg(5, 10));
            self.emit(alu64_imm(op::ADD, 5, -i32::from(k)));
            (5, off + k)
        } else {
            (10, off)
        };
        if self.below(2) == 0 {
            self.emit(stx(size_bits(w), base, off, r));
        } else {
            self.emit(ldx(size_bits(w), r, base, off));
        }
        if base == 5 {
            self.emit(mov64_imm(5, 0));
        }
    }

    /// In a callee given a stack pointer: an access to the caller's 8 bytes through it.
    fn caller_stack(&mut self) {
        let w = self.pick(&WIDTHS);
        let off = self.aligned(w, 0, 8);
        let r = self.reg();
        if self.below(2) == 0 {
            self.emit(stx(size_bits(w), 9, off, r));
        } else {
            self.emit(ldx(size_bits(w), r, 9, off));
        }
    }

    fn alu(&mut self) {
        let (d, s) = (self.reg(), self.reg());
        match self.below(5) {
            0 => {
                let k = self.pick(&[8, 16, 32]);
                self.emit(alu64_imm(op::RSH, d, k));
            }
            1 => {
                let m = self.pick(&[1, 0xff, 0xffff]);
                self.emit(alu32_imm(op::AND, d, m));
            }
            2 => self.emit(mov64_reg(d, s)),
            _ => {
                let o = self.pick(&[op::ADD, op::XOR, op::OR, op::AND, op::SUB]);
                self.emit(alu64_reg(o, d, s));
            }
        }
    }

    /// `r0 = lookup(map, fp+key)`; a value load through it into a data register when found.
    fn lookup(&mut self) {
        let map = self.pick(&[CFG, SEEN, CFG]);
        let key = self.aligned(4, -32, 0);
        let d = self.pick(&[1u8, 2, 3, 4]);
        let w = self.pick(&WIDTHS);
        let voff = self.aligned(w, 0, VALUE);
        self.emit2(ld_map(1, map));
        self.emit(mov64_reg(2, 10));
        self.emit(alu64_imm(op::ADD, 2, key.into()));
        self.emit(call(1));
        self.zero_scratch_but_r0();
        let skip = self.label();
        self.items
            .push(Item::Jmp(insn(op::JMP | op::JEQ | op::K, 0, 0, 0, 0), skip));
        if map == SEEN && self.below(2) == 0 {
            // A store through the lookup result (a rank-local counter).
            self.emit(stx(size_bits(w), 0, voff, d));
        } else {
            self.emit(ldx(size_bits(w), d, 0, voff));
        }
        self.items.push(Item::Mark(skip));
        self.emit(mov64_imm(0, 0));
    }

    fn zero_scratch_but_r0(&mut self) {
        for r in 1..=5 {
            self.emit(mov64_imm(r, 0));
        }
    }

    fn decision(&mut self) {
        let s = self.reg();
        match self.hook {
            Hook::Tuner => {
                let (size, off) = self.pick(&[(op::W, 40), (op::W, 44), (op::W, 48), (op::DW, 40)]);
                self.emit(stx(size, 6, off, s));
            }
            Hook::Epoch => {
                let k = self.below(4) as i16;
                self.emit(stx(op::DW, 6, 48 + 8 * k, s));
            }
        }
    }

    fn branch(&mut self) {
        let r = self.reg();
        let l = self.label();
        let cond = self.pick(&[op::JEQ, op::JGT, op::JSET, op::JNE]);
        let imm = self.pick(&[0, 1, 2, 7, 0x100]);
        self.items
            .push(Item::Jmp(insn(op::JMP | cond | op::K, r, 0, 0, imm), l));
        let n = 1 + self.below(4) as u32;
        self.open.push((l, n));
    }

    fn call(&mut self) {
        if self.depth >= 3 {
            return;
        }
        let l = self.label();
        let stack = self.below(2) == 0;
        if stack {
            self.emit(mov64_reg(1, 10));
            self.emit(alu64_imm(op::ADD, 1, -16));
        } else {
            let r = self.reg();
            self.emit(mov64_reg(1, r));
        }
        self.emit(mov64_reg(2, 6));
        self.items.push(Item::Call(l));
        if !self.open.is_empty() {
            self.s.region_call = true;
        }
        if self.depth >= 1 {
            self.s.deep = true;
        }
        self.zero_scratch();
        self.subs.push((l, self.depth + 1, stack));
    }

    fn snippet(&mut self) {
        match self.below(14) {
            0..=2 => self.ctx_load(),
            3 => self.value_load(),
            4 => self.value_store(),
            5 | 6 => self.stack_access(),
            7 if self.r9_stack => self.caller_stack(),
            7 | 8 => self.alu(),
            9 => self.lookup(),
            10 => self.decision(),
            11 | 12 => self.branch(),
            _ => self.call(),
        }
        // Close the branches whose code is complete.
        for o in &mut self.open {
            o.1 = o.1.saturating_sub(1);
        }
        while let Some(&(l, 0)) = self.open.last() {
            self.open.pop();
            self.items.push(Item::Mark(l));
        }
    }

    fn body(&mut self, n: u64) {
        for _ in 0..n {
            self.snippet();
        }
        while let Some((l, _)) = self.open.pop() {
            self.items.push(Item::Mark(l));
        }
        if self.below(2) == 0 {
            self.decision();
        }
        self.emit(mov64_imm(0, 0));
        self.emit(exit());
    }
}

/// A random program for `hook`, and what it contains.
pub fn program(seed: u64, hook: Hook) -> (Object, Shapes) {
    let mut g = Gen {
        r: Rng(seed),
        hook,
        items: vec![],
        labels: 0,
        subs: vec![],
        depth: 0,
        r9_stack: false,
        open: vec![],
        s: Shapes::default(),
    };
    g.emit(mov64_reg(6, 1));
    g.prologue(32);
    g.emit(mov64_imm(9, 0));
    let n = 4 + g.below(14);
    g.body(n);
    // Subprograms: `r1` a pointer to 8 bytes of the caller's stack or a scalar, `r2` the context.
    let mut k = 0;
    while k < g.subs.len() {
        let (l, depth, stack) = g.subs[k];
        g.items.push(Item::Mark(l));
        g.depth = depth;
        g.r9_stack = stack;
        g.emit(mov64_reg(6, 2));
        g.emit(mov64_reg(9, 1));
        g.prologue(32);
        let n = 2 + g.below(8);
        g.body(n);
        k += 1;
    }
    let insns = resolve(&g.items, g.labels);
    (
        Object {
            programs: vec![Program {
                name: "local".into(),
                section: hook.section().into(),
                insns,
                lines: vec![],
            }],
            maps: maps(),
        },
        g.s,
    )
}
