//! A generator of short BPF programs built around the places where verifiers go wrong: spills
//! and fills of every width and alignment (of pointers and of scalars), atomics on stack slots
//! and map values, pointer arithmetic of every kind, helper calls whose buffers hold spilled
//! pointers or are partly initialised, map pointers to read-only global data, BPF-to-BPF calls
//! passing and returning stack pointers, jumps at the edges of the program and of subprograms,
//! branches on values that were spilled and then changed, and loops.
//!
//! The generator keeps a rough model of what each register and stack slot holds, so most of
//! what it emits is legal and the hostile parts sit inside programs the verifier can accept.
//! Where a program relies on a belief (a slot still holds a constant, a pointer difference is
//! 0), it often adds a *tripwire*: an out-of-bounds load on the path the belief rules out, so a
//! wrong belief becomes a fault in the checking interpreter.

use super::progen::Rng;
use policy_object::insn::build::{
    alu32_imm, alu64_imm, alu64_reg, atomic, call, call_local, exit, insn, ja, jmp_imm, ldx,
    mov32_reg, mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, MapKind, Object, Program};

/// Map indices of [`maps`].
pub const ARR: i32 = 0;
pub const HASH: i32 = 1;
pub const ARR2: i32 = 2;
pub const RODATA: i32 = 3;
/// Value sizes of the maps, by index.
pub const VALUE_SIZE: [i32; 4] = [16, 16, 32, 16];
/// Key sizes of the maps, by index.
pub const KEY_SIZE: [i32; 4] = [4, 8, 4, 4];

/// The maps of every generated object: two arrays, a hash with 8-byte keys (room for a
/// pointer) and `.rodata` (read-only global data).
pub fn maps() -> Vec<MapDef> {
    let m = |name: &str, kind, key: i32, value: i32, n| MapDef {
        name: name.into(),
        kind,
        key_size: key as u32,
        value_size: value as u32,
        max_entries: n,
        flags: 0,
        initial: None,
        read_only: false,
        scope: policy_object::Scope::Local,
        source: None,
        reduce: policy_object::Reduce::Sum,
    };
    let mut ro = m(".rodata", MapKind::Array, 4, VALUE_SIZE[3], 1);
    ro.initial = Some(
        [7u64, u64::MAX]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect(),
    );
    ro.read_only = true;
    vec![
        m("sg_arr", MapKind::Array, 4, VALUE_SIZE[0], 4),
        m("sg_hash", MapKind::Hash, 8, VALUE_SIZE[1], 8),
        m("sg_arr2", MapKind::Array, 4, VALUE_SIZE[2], 2),
        ro,
    ]
}

fn size_bits(w: i16) -> u8 {
    match w {
        1 => op::B,
        2 => op::H,
        4 => op::W,
        _ => op::DW,
    }
}

/// What the generator believes a register or stack slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum K {
    Uninit,
    /// A scalar, with its value when known.
    Scalar(Option<i64>),
    Ctx,
    /// The stack at this offset from the frame pointer.
    Stack(i16),
    /// A map value at this offset.
    Value(i32, i32),
    ValueOrNull(i32),
    MapPtr(i32),
}

impl K {
    fn is_ptr(self) -> bool {
        !matches!(self, K::Uninit | K::Scalar(_))
    }
}

pub(crate) type Label = usize;

#[derive(Clone, Debug)]
pub(crate) enum Item {
    I(Insn),
    /// A jump whose offset is resolved to a label.
    Jmp(Insn, Label),
    /// A BPF-to-BPF call to a label.
    Call(Label),
    Mark(Label),
}

/// Features a program uses, for coverage counts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Features {
    pub spill_ptr: bool,
    pub misaligned: bool,
    pub partial: bool,
    pub atomic_stack: bool,
    pub atomic_value: bool,
    pub ptr_sub: bool,
    pub alu32_ptr: bool,
    pub helper_ptr_buf: bool,
    pub rodata_ptr: bool,
    pub bpf_call: bool,
    pub edge_jump: bool,
    pub tripwire: bool,
    pub loops: bool,
    pub narrow_fill: bool,
}

impl Features {
    pub fn names(&self) -> Vec<&'static str> {
        let all = [
            (self.spill_ptr, "spilled pointers"),
            (self.misaligned, "misaligned spills"),
            (self.partial, "partial overwrites"),
            (self.atomic_stack, "atomics on the stack"),
            (self.atomic_value, "atomics on map values"),
            (self.ptr_sub, "pointer - pointer"),
            (self.alu32_ptr, "32-bit ops on pointers"),
            (self.helper_ptr_buf, "helper buffers with pointers"),
            (self.rodata_ptr, ".rodata map pointer"),
            (self.bpf_call, "bpf-to-bpf calls"),
            (self.edge_jump, "edge jumps"),
            (self.tripwire, "tripwires"),
            (self.loops, "loops"),
            (self.narrow_fill, "narrow fills of constants"),
        ];
        all.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect()
    }
}

struct Gen {
    r: Rng,
    items: Vec<Item>,
    labels: usize,
    regs: [K; 11],
    /// Per 8-byte stack slot (index 0 is fp-8): what an aligned 8-byte fill would give.
    slots: [K; 64],
    ret: Label,
    tuner: bool,
    subs: Vec<(Label, Vec<Item>)>,
    f: Features,
    depth: u32,
    in_loop: bool,
}

/// Scratch scalar registers (r1-r5 die at calls; r0 is the result).
const SCRATCH: [u8; 5] = [0, 2, 3, 4, 5];
/// Tuner context fields a program may write.
const TUNER_WRITE: [i16; 3] = [40, 44, 48];

impl Gen {
    fn below(&mut self, n: u64) -> u64 {
        self.r.below(n)
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.r.below(one_in) == 0
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.r.below(xs.len() as u64) as usize]
    }
    fn label(&mut self) -> Label {
        self.labels += 1;
        self.labels - 1
    }
    fn emit(&mut self, i: Insn) {
        self.items.push(Item::I(i));
    }
    fn jmp(&mut self, i: Insn, l: Label) {
        self.items.push(Item::Jmp(i, l));
    }
    fn mark(&mut self, l: Label) {
        self.items.push(Item::Mark(l));
    }

    /// An interesting constant.
    fn konst(&mut self) -> i64 {
        match self.below(8) {
            0 => 0,
            1 => 1,
            2 => -1,
            3 => self.pick(&[8, 16, 4096, 0x7fff_ffff, i32::MIN as i64, 512, 56]),
            4 => self.r.next() as i32 as i64,
            _ => self.below(64) as i64,
        }
    }

    fn set_const(&mut self, d: u8, c: i64) {
        self.emit(mov64_imm(d, c as i32));
        self.regs[d as usize] = K::Scalar(Some(c as i32 as i64));
    }

    /// A register holding something of this description, if any.
    fn find(&mut self, want: impl Fn(K) -> bool) -> Option<u8> {
        let c: Vec<u8> = (0..=10u8)
            .filter(|&r| want(self.regs[r as usize]))
            .collect();
        if c.is_empty() {
            None
        } else {
            Some(self.pick(&c))
        }
    }

    /// A pointer register (ctx, stack, map value), if any; r10 always qualifies.
    fn any_ptr(&mut self) -> u8 {
        self.find(|k| matches!(k, K::Ctx | K::Stack(_) | K::Value(..)))
            .unwrap_or(10)
    }

    /// A scalar register, making one if needed.
    fn scalar(&mut self) -> u8 {
        match self.find(|k| matches!(k, K::Scalar(_))) {
            Some(r) => r,
            None => {
                let d = self.pick(&SCRATCH);
                let c = self.konst();
                self.set_const(d, c);
                d
            }
        }
    }

    /// A scratch register to overwrite (never r6-r9, which hold the program's pointers).
    fn scratch(&mut self) -> u8 {
        self.pick(&SCRATCH)
    }

    /// The stack slot offset of slot `k`.
    fn slot_off(k: usize) -> i16 {
        -8 * (k as i16 + 1)
    }

    fn pick_slot(&mut self) -> usize {
        // Slots 0..16 (fp-8 .. fp-128): enough room, and reuse makes interactions.
        self.below(16) as usize
    }

    fn clear_caller_saved(&mut self) {
        for r in 1..=5 {
            self.regs[r] = K::Uninit;
        }
    }

    /// Forgets what the stack bytes covering `[off, off + w)` hold.
    fn touch_stack(&mut self, off: i16, w: i16, now: K) {
        let lo = off as i32;
        let hi = off as i32 + w as i32;
        for k in 0..64usize {
            let s = Self::slot_off(k) as i32;
            if s < hi && s + 8 > lo {
                self.slots[k] = if s == lo && w == 8 {
                    now
                } else if s >= lo && s + 8 <= hi {
                    K::Scalar(None)
                } else if self.slots[k] == K::Uninit {
                    // Partly initialised: fills of the whole slot are not allowed.
                    K::Uninit
                } else {
                    K::Scalar(None)
                };
            }
        }
    }

    // --------------------------------------------------------------- uses

    /// A tripwire: if `r` does not hold `c`, load through a NULL pointer. A verifier that is
    /// right about `c` never explores it; one that is wrong lets it run, and it faults.
    fn tripwire(&mut self, r: u8, c: i64) {
        if c as i32 as i64 != c {
            return;
        }
        self.f.tripwire = true;
        let ok = self.label();
        self.jmp(jmp_imm(op::JEQ, r, c as i32, 0), ok);
        let d = if r == 0 { 2 } else { 0 };
        self.emit(mov64_imm(d, 0));
        self.emit(ldx(op::B, d, d, 0));
        self.mark(ok);
    }

    /// A destination register from `cands`, never the loop counter inside a loop.
    fn dst(&mut self, cands: &[u8]) -> u8 {
        let c: Vec<u8> = cands
            .iter()
            .copied()
            .filter(|&r| !(self.in_loop && r == 9))
            .collect();
        self.pick(&c)
    }

    /// Uses the value in `r` the way the generator believes it may be used.
    fn use_reg(&mut self, r: u8) {
        let k = self.regs[r as usize];
        match k {
            K::Ctx => {
                let off = self.pick(&[0i16, 8, 16, 24, 48]);
                let d = self.scratch();
                self.emit(ldx(if off < 24 { op::DW } else { op::W }, d, r, off));
                self.regs[d as usize] = K::Scalar(None);
            }
            K::Stack(o) => {
                let d = self.scratch();
                if o <= -8 && o % 8 == 0 && self.chance(2) {
                    let v = self.scalar();
                    self.emit(stx(op::DW, r, 0, v));
                    let kv = self.regs[v as usize];
                    self.touch_stack(o, 8, kv);
                } else if o <= -8 {
                    // Read what the slot holds (legal when initialised).
                    self.emit(ldx(op::DW, d, r, 0));
                    let idx = ((-(o as i32)) / 8 - 1) as usize;
                    self.regs[d as usize] = if o % 8 == 0 && idx < 64 {
                        match self.slots[idx] {
                            K::Uninit => K::Scalar(None),
                            s => s,
                        }
                    } else {
                        K::Scalar(None)
                    };
                }
            }
            K::Value(m, off) => {
                let room = VALUE_SIZE[m as usize] - off;
                if room >= 8 {
                    let d = self.scratch();
                    if m != RODATA && self.chance(2) {
                        let v = self.scalar();
                        self.emit(stx(op::DW, r, 0, v));
                    } else {
                        self.emit(ldx(op::DW, d, r, 0));
                        self.regs[d as usize] = K::Scalar(None);
                    }
                } else {
                    let d = self.scratch();
                    self.emit(ldx(op::B, d, r, 0));
                    self.regs[d as usize] = K::Scalar(None);
                }
            }
            K::Scalar(c) => match self.below(5) {
                0 => {
                    // Into a map value (a leak of a pointer shows there).
                    if let Some(v) = self.find(|k| matches!(k, K::Value(m, 0) if m != RODATA)) {
                        let off = self.pick(&[0i16, 8]);
                        self.emit(stx(op::DW, v, off, r));
                    }
                }
                1 if self.tuner && self.regs[6] == K::Ctx => {
                    let off = self.pick(&TUNER_WRITE);
                    self.emit(stx(op::W, 6, off, r));
                }
                2 => {
                    if let Some(c) = c {
                        self.tripwire(r, c);
                    }
                }
                3 => {
                    // As an offset into a map value, bounded first.
                    if let Some(v) = self.find(|k| matches!(k, K::Value(_, 0))) {
                        let t = self.scratch();
                        let d = self.scratch();
                        if t == v || d == v || t == d {
                            return;
                        }
                        if t != r {
                            self.emit(mov64_reg(t, r));
                        }
                        self.emit(alu64_imm(op::AND, t, 7));
                        self.emit(mov64_reg(d, v));
                        self.emit(alu64_reg(op::ADD, d, t));
                        self.emit(ldx(op::B, d, d, 0));
                        self.regs[t as usize] = K::Scalar(None);
                        self.regs[d as usize] = K::Scalar(None);
                    }
                }
                _ => {
                    if r != 9 && !self.in_loop {
                        self.emit(mov64_reg(9, r));
                        self.regs[9] = k;
                    }
                }
            },
            K::MapPtr(_) | K::ValueOrNull(_) | K::Uninit => {}
        }
    }

    // --------------------------------------------------------------- snippets

    fn scalar_alu(&mut self) {
        let d = self.dst(&[0u8, 2, 3, 4, 5, 9]);
        if !matches!(self.regs[d as usize], K::Scalar(_)) {
            let c = self.konst();
            self.set_const(d, c);
        }
        let o = self.pick(&[
            op::ADD,
            op::SUB,
            op::MUL,
            op::AND,
            op::OR,
            op::XOR,
            op::LSH,
            op::RSH,
            op::ARSH,
            op::MOV,
        ]);
        let class = if self.chance(3) { op::ALU } else { op::ALU64 };
        let imm = if matches!(o, op::LSH | op::RSH | op::ARSH) {
            self.below(if class == op::ALU { 32 } else { 64 }) as i32
        } else {
            self.konst() as i32
        };
        self.emit(insn(class | o | op::K, d, 0, 0, imm));
        self.regs[d as usize] = K::Scalar(None);
    }

    /// A spill of any register at any width and alignment, then (usually) a fill.
    fn spill_fill(&mut self) {
        let src = if self.chance(2) {
            self.any_ptr()
        } else {
            self.scalar()
        };
        let ks = self.regs[src as usize];
        if ks.is_ptr() {
            self.f.spill_ptr = true;
        }
        let narrow = if ks.is_ptr() {
            self.chance(10)
        } else {
            self.chance(3)
        };
        let w = if narrow { self.pick(&[1i16, 2, 4]) } else { 8 };
        let slot = self.pick_slot();
        let mut off = Self::slot_off(slot);
        if self.chance(if ks.is_ptr() { 6 } else { 4 }) {
            off += self.below(8) as i16;
            self.f.misaligned = true;
        } else if w < 8 && self.chance(2) {
            off += self.pick(&[0i16, 4, 6, 7]).min(8 - w);
        }
        if off + w > 0 {
            off = -8;
        }
        self.emit(stx(size_bits(w), 10, off, src));
        let now = if w == 8 && off % 8 == 0 {
            ks
        } else {
            K::Scalar(None)
        };
        self.touch_stack(off, w, now);
        // A constant spilled through r10: a fill of its low bytes knows them (narrow spills).
        let mut known = match ks {
            K::Scalar(Some(c)) if off % w == 0 => Some(c),
            _ => None,
        };
        if self.chance(if ks.is_ptr() { 8 } else { 5 }) {
            known = None;
            // Overwrite part of it.
            self.f.partial = true;
            let pw = self.pick(&[1i16, 2, 4]);
            let po = off + self.below(8 - pw as u64 + 1) as i16;
            if po + pw <= 0 {
                let imm = self.konst() as i32;
                self.emit(st(size_bits(pw), 10, po, imm));
                self.touch_stack(po, pw, K::Scalar(None));
            }
        }
        if self.chance(5) {
            return;
        }
        // Fill: mostly the same place and width, sometimes another width or a neighbour.
        let whole = self.slots[slot] != K::Uninit;
        let odd_fill = if self.slots[slot].is_ptr() { 8 } else { 4 };
        let (fo, fw) = match self.below(odd_fill) {
            0 if whole => {
                let fw = self.pick(&[1i16, 2, 4, 8]);
                (
                    Self::slot_off(slot) + self.below(8 - fw as u64 + 1) as i16,
                    fw,
                )
            }
            1 if whole => (Self::slot_off(slot), 8),
            _ => (off, w),
        };
        let d = self.dst(&[0u8, 2, 3, 4, 5, 7, 8, 9]);
        // Keep r6 (ctx) and the lookups in r7/r8 most of the time.
        let d = if matches!(d, 7 | 8) && self.regs[d as usize].is_ptr() && !self.chance(4) {
            self.scratch()
        } else {
            d
        };
        self.emit(ldx(size_bits(fw), d, 10, fo));
        let idx = ((-(fo as i32) + 7) / 8 - 1) as usize;
        self.regs[d as usize] = if fw == 8 && fo % 8 == 0 {
            match self.slots[idx] {
                K::Uninit => K::Scalar(None),
                s => s,
            }
        } else {
            K::Scalar(None)
        };
        if let Some(c) = known
            && fo == off
            && fw <= w
        {
            // The low `fw` bytes of the constant, zero-extended: a verifier that keeps the
            // wrong bytes (not truncated, another spill's) runs into the tripwire.
            let v = if fw == 8 {
                c
            } else {
                c & ((1i64 << (8 * fw)) - 1)
            };
            self.regs[d as usize] = K::Scalar(Some(v));
            self.f.narrow_fill = true;
            self.tripwire(d, v);
        }
        self.use_reg(d);
    }

    fn atomic_op(&mut self) -> i32 {
        if self.chance(20) {
            return self.pick(&[
                op::ATOMIC_OR | op::FETCH,
                op::ATOMIC_AND | op::FETCH,
                op::ATOMIC_XOR | op::FETCH,
            ]);
        }
        self.pick(&[
            op::ATOMIC_ADD,
            op::ATOMIC_ADD | op::FETCH,
            op::ATOMIC_OR,
            op::ATOMIC_AND,
            op::ATOMIC_XOR,
            op::ATOMIC_XCHG,
            op::ATOMIC_CMPXCHG,
        ])
    }

    /// A spill of a pointer or constant, an atomic on its slot, a fill and a use.
    fn atomic_stack(&mut self) {
        self.f.atomic_stack = true;
        let slot = self.pick_slot();
        let off = Self::slot_off(slot);
        // What goes in the slot first.
        let src = match self.below(5) {
            0 => self.any_ptr(),
            1 | 2 => {
                let c = self.pick(&[0i64, 0, 1, 8]);
                let d = self.scratch();
                self.set_const(d, c);
                d
            }
            _ => self.scalar(),
        };
        let ks = self.regs[src as usize];
        self.emit(stx(op::DW, 10, off, src));
        self.touch_stack(off, 8, ks);
        let w: i16 = if self.chance(3) { 4 } else { 8 };
        let aoff = off + if w == 4 { self.pick(&[0i16, 4]) } else { 0 };
        let aop = self.atomic_op();
        let v = self.pick(&[2u8, 3, 4, 5]);
        let c = self.pick(&[1i64, 0x1000, -1, 0x100_0000, 8]);
        self.set_const(v, c);
        if aop == op::ATOMIC_CMPXCHG {
            // r0 is the expected value: make it match sometimes.
            let e = match ks {
                K::Scalar(Some(x)) if self.chance(2) => x,
                _ => 0,
            };
            self.set_const(0, e);
        }
        self.emit(atomic(size_bits(w), aop, 10, aoff, v));
        if aop == op::ATOMIC_CMPXCHG {
            self.regs[0] = K::Scalar(None);
        } else if aop & op::FETCH != 0 {
            self.regs[v as usize] = K::Scalar(None);
        }
        // The generator, like the buggy verifier, goes on believing the old content: that
        // makes the program use it as what it was, and the checking interpreter judge.
        let d = self.dst(&[0u8, 2, 3, 4, 5, 9]);
        self.emit(ldx(op::DW, d, 10, off));
        // Half the time the program acts on the old belief (a verifier that shares it lets
        // that run); otherwise it treats the value as unknown, as a right verifier does.
        let hostile = self.chance(3);
        self.regs[d as usize] = if hostile { ks } else { K::Scalar(None) };
        match ks {
            K::Scalar(Some(c)) if hostile => {
                // Use the believed constant as an offset into a map value.
                if let Some(m) = self.find(|k| matches!(k, K::Value(_, 0))) {
                    self.emit(alu64_reg(op::ADD, m, d));
                    let t = self.scratch();
                    self.emit(ldx(op::B, t, m, 0));
                    self.emit(alu64_reg(op::SUB, m, d));
                    self.regs[t as usize] = K::Scalar(None);
                } else {
                    self.tripwire(d, c);
                }
            }
            _ => self.use_reg(d),
        }
    }

    fn atomic_value(&mut self) {
        let Some(m) = self.find(|k| matches!(k, K::Value(_, 0))) else {
            return self.spill_fill();
        };
        self.f.atomic_value = true;
        let K::Value(map, _) = self.regs[m as usize] else {
            return;
        };
        let w: i16 = if self.chance(3) { 4 } else { 8 };
        let room = VALUE_SIZE[map as usize] as i16 - w;
        let mut off = self.below(room as u64 / w as u64 + 1) as i16 * w;
        if self.chance(8) {
            off += self.pick(&[1i16, 2, 4, 8, 16]);
        }
        let aop = self.atomic_op();
        let v = self.pick(&[2u8, 3, 4, 5]);
        let c = self.konst();
        self.set_const(v, c);
        if aop == op::ATOMIC_CMPXCHG {
            self.set_const(0, 0);
        }
        self.emit(atomic(size_bits(w), aop, m, off, v));
        if aop == op::ATOMIC_CMPXCHG {
            self.regs[0] = K::Scalar(None);
        } else if aop & op::FETCH != 0 {
            self.regs[v as usize] = K::Scalar(None);
        }
        let d = self.scratch();
        self.emit(ldx(size_bits(w), d, m, off));
        self.regs[d as usize] = K::Scalar(None);
        self.use_reg(d);
    }

    fn ptr_arith(&mut self) {
        let p = self.any_ptr();
        let kp = self.regs[p as usize];
        let d = self.pick(&[0u8, 2, 3, 4, 5]);
        match self.below(14) {
            0..=3 | 12 | 13 => {
                // ptr += const, then a use.
                self.emit(mov64_reg(d, p));
                let c = match kp {
                    K::Value(m, off) => {
                        let room = VALUE_SIZE[m as usize] - off;
                        if self.chance(4) {
                            self.pick(&[room, -1, room - 7, 1 << 20])
                        } else {
                            self.below(room.max(1) as u64) as i32 & !7
                        }
                    }
                    K::Stack(o) => {
                        if self.chance(4) {
                            self.pick(&[-(o as i32), -513, 8])
                        } else {
                            -(8 * (1 + self.below(8) as i32))
                        }
                    }
                    _ => self.pick(&[0, 8, 16, 48, 56, -8]),
                };
                let sub = self.chance(3);
                self.emit(alu64_imm(if sub { op::SUB } else { op::ADD }, d, c));
                let c = if sub { -c } else { c };
                self.regs[d as usize] = match kp {
                    K::Value(m, off) => K::Value(m, off + c),
                    K::Stack(o) => K::Stack((o as i32 + c) as i16),
                    k => k,
                };
                if let K::Ctx = kp {
                    let t = self.scratch();
                    self.emit(ldx(op::W, t, d, 0));
                    self.regs[t as usize] = K::Scalar(None);
                } else {
                    self.use_reg(d);
                }
            }
            4 | 5 => {
                // ptr += bounded variable.
                let s = self.scalar();
                let t = self.scratch();
                self.emit(mov64_reg(t, s));
                let mask = self.pick(&[7, 7, 15, 255, -1]);
                self.emit(alu64_imm(op::AND, t, mask));
                if t == d {
                    return;
                }
                self.emit(mov64_reg(d, p));
                self.emit(alu64_reg(op::ADD, d, t));
                let sz = self.pick(&[op::B, op::W]);
                self.emit(ldx(sz, t, d, 0));
                self.regs[d as usize] = K::Scalar(None);
                self.regs[t as usize] = K::Scalar(None);
            }
            6 => {
                // scalar += ptr.
                let s = self.scalar();
                if s == p {
                    return;
                }
                self.emit(mov64_reg(d, s));
                self.emit(alu64_reg(op::ADD, d, p));
                self.regs[d as usize] = kp;
                self.use_reg(d);
            }
            7..=9 => {
                // ptr - ptr: the same object, another element of the same map, or another
                // object altogether; then the difference used as believed.
                self.f.ptr_sub = true;
                let same_map = matches!(
                    (self.regs[7], self.regs[8]),
                    (K::Value(a, _), K::Value(b, _)) if a == b
                );
                let (p, kp, q) = if same_map && self.chance(3) {
                    (7, self.regs[7], 8)
                } else {
                    let q = match self.below(3) {
                        0 => p,
                        _ => self.any_ptr(),
                    };
                    (p, kp, q)
                };
                let kq = self.regs[q as usize];
                self.emit(mov64_reg(d, p));
                self.emit(alu64_reg(op::SUB, d, q));
                let believed = match (kp, kq) {
                    (K::Value(a, x), K::Value(b, y)) if a == b => Some((x - y) as i64),
                    (K::Stack(x), K::Stack(y)) => Some(x as i64 - y as i64),
                    (K::Ctx, K::Ctx) => Some(0),
                    _ => None,
                };
                self.regs[d as usize] = K::Scalar(believed);
                match believed {
                    Some(c) if self.chance(2) => {
                        // Scale it: a wrong belief of 0 becomes a far access.
                        self.emit(alu64_imm(op::MUL, d, 4096));
                        let x = self.scratch();
                        if x == d {
                            return;
                        }
                        self.emit(mov64_reg(x, p));
                        self.emit(alu64_reg(op::ADD, x, d));
                        self.regs[d as usize] = K::Scalar(None);
                        let d = x;
                        self.regs[d as usize] = match kp {
                            K::Value(m, o) => K::Value(m, o + (c * 4096) as i32),
                            K::Stack(o) => K::Stack((o as i64 + c * 4096) as i16),
                            _ => kp,
                        };
                        let t = self.scratch();
                        self.emit(ldx(op::B, t, d, 0));
                        self.regs[t as usize] = K::Scalar(None);
                    }
                    _ => self.use_reg(d),
                }
            }
            10 => {
                // 32-bit arithmetic on a pointer.
                self.f.alu32_ptr = true;
                self.emit(mov64_reg(d, p));
                let o = self.pick(&[op::ADD, op::MOV, op::SUB, op::AND]);
                if o == op::MOV {
                    self.emit(mov32_reg(d, p));
                } else {
                    let imm = self.pick(&[0, 8, -1]);
                    self.emit(alu32_imm(o, d, imm));
                }
                self.regs[d as usize] = kp;
                self.use_reg(d);
            }
            _ => {
                // Other operations on a pointer.
                self.emit(mov64_reg(d, p));
                let o = self.pick(&[op::AND, op::OR, op::XOR, op::LSH, op::NEG, op::MUL]);
                let imm = if o == op::LSH { 1 } else { self.konst() as i32 };
                self.emit(alu64_imm(o, d, imm));
                self.regs[d as usize] = K::Scalar(None);
                self.use_reg(d);
            }
        }
    }

    fn lddw_map(&mut self, d: u8, map: i32) {
        self.emit(insn(op::LDDW, d, op::PSEUDO_MAP_FD, 0, map));
        self.emit(insn(0, 0, 0, 0, 0));
        self.regs[d as usize] = K::MapPtr(map);
    }

    /// Fills `len` bytes of stack at `off` for a helper buffer: constants, spilled pointers,
    /// or (sometimes) gaps.
    fn buffer(&mut self, off: i16, len: i32) {
        let mut b = 0;
        while b < len {
            let at = off + b as i16;
            let left = len - b;
            match self.below(16) {
                0 | 1 if left >= 8 && at % 8 == 0 => {
                    self.f.helper_ptr_buf = true;
                    let p = self.any_ptr();
                    let kp = self.regs[p as usize];
                    self.emit(stx(op::DW, 10, at, p));
                    self.touch_stack(at, 8, kp);
                    b += 8;
                }
                4 if self.chance(4) => {
                    // A gap: a partly initialised buffer.
                    b += 4;
                }
                _ => {
                    let w = if left >= 8 && at % 8 == 0 { 8 } else { 4 };
                    let c = self.konst() as i32;
                    self.emit(st(size_bits(w), 10, at, c));
                    self.touch_stack(at, w, K::Scalar(Some(c as i64)));
                    b += w as i32;
                }
            }
        }
    }

    fn helper(&mut self) {
        let map = match self.below(8) {
            0 => {
                self.f.rodata_ptr = true;
                RODATA
            }
            1 | 2 => HASH,
            3 => ARR2,
            _ => ARR,
        };
        let id = if map == RODATA && self.chance(2) {
            2
        } else {
            self.pick(&[1, 1, 2, 2, 3])
        };
        let koff: i16 = -8 * (1 + self.below(6) as i16);
        let koff = koff
            - if KEY_SIZE[map as usize] == 4 && self.chance(3) {
                4
            } else {
                0
            };
        self.buffer(koff, KEY_SIZE[map as usize]);
        let voff = -64 - 8 * self.below(4) as i16;
        if id == 2 {
            self.buffer(voff, VALUE_SIZE[map as usize]);
        }
        self.lddw_map(1, map);
        self.emit(mov64_reg(2, 10));
        self.emit(alu64_imm(op::ADD, 2, koff as i32));
        if id == 2 {
            // The value from the stack, sometimes from a map value.
            match self.find(|k| matches!(k, K::Value(m, 0) if VALUE_SIZE[m as usize] >= VALUE_SIZE[map as usize])) {
                Some(v) if self.chance(3) => self.emit(mov64_reg(3, v)),
                _ => {
                    self.emit(mov64_reg(3, 10));
                    self.emit(alu64_imm(op::ADD, 3, voff as i32));
                }
            }
            let flags = self.pick(&[0, 0, 1, 2]);
            self.emit(mov64_imm(4, flags));
        }
        self.emit(call(id));
        self.clear_caller_saved();
        if id != 1 {
            self.regs[0] = K::Scalar(None);
            return;
        }
        self.regs[0] = K::ValueOrNull(map);
        let skip = self.label();
        if !self.chance(12) {
            self.jmp(jmp_imm(op::JEQ, 0, 0, 0), skip);
        }
        self.regs[0] = K::Value(map, 0);
        let keep = self.pick(&[0u8, 0, 7, 8]);
        if keep != 0 && self.chance(2) {
            self.emit(mov64_reg(keep, 0));
            self.regs[keep as usize] = K::Value(map, 0);
        }
        self.use_reg(keep);
        if self.chance(3) {
            self.atomic_value();
        }
        self.mark(skip);
        // After the join r0 may be NULL or anything the uses left.
        for r in [0u8, 2, 3, 4, 5] {
            if self.regs[r as usize].is_ptr() || self.regs[r as usize] == K::Uninit {
                self.regs[r as usize] = K::Uninit;
            }
        }
        if keep != 0 && self.regs[keep as usize] == K::Value(map, 0) {
            // The register was only set on the found path.
            self.regs[keep as usize] = K::Uninit;
            self.emit(mov64_imm(keep, 0));
            self.regs[keep as usize] = K::Scalar(Some(0));
        }
        self.set_const(0, 0);
    }

    /// A BPF-to-BPF call: the callee gets a pointer to the caller's stack (or another
    /// pointer) in r1 and a scalar in r2, and returns a scalar or, sometimes, its own stack.
    fn call(&mut self) {
        if self.depth > 0 || self.subs.len() > 2 {
            return self.spill_fill();
        }
        self.f.bpf_call = true;
        let slot = self.pick_slot();
        let off = Self::slot_off(slot);
        if self.chance(2) {
            let s = self.scalar();
            let ks = self.regs[s as usize];
            self.emit(stx(op::DW, 10, off, s));
            self.touch_stack(off, 8, ks);
        }
        let arg = self.below(4);
        match arg {
            0 => {
                let p = self.any_ptr();
                self.emit(mov64_reg(1, p));
            }
            _ => {
                self.emit(mov64_reg(1, 10));
                self.emit(alu64_imm(op::ADD, 1, off as i32));
            }
        }
        let s = self.scalar();
        self.emit(mov64_reg(2, s));
        let l = self.label();
        self.items.push(Item::Call(l));
        // The callee's body, generated in a fresh frame.
        let saved_items = std::mem::take(&mut self.items);
        let saved_regs = self.regs;
        let saved_slots = self.slots;
        // r1 is used only by the callee's own patterns below (its target is the caller's).
        self.regs = [K::Uninit; 11];
        self.regs[2] = K::Scalar(None);
        self.regs[10] = K::Stack(0);
        self.slots = [K::Uninit; 64];
        self.depth += 1;
        let ret = self.label();
        let old_ret = std::mem::replace(&mut self.ret, ret);
        match self.below(6) {
            0 => {
                // Write through the caller's pointer.
                self.emit(stx(op::DW, 1, 0, 2));
            }
            1 => {
                // Read the caller's slot.
                self.emit(ldx(op::DW, 0, 1, 0));
                self.regs[0] = K::Scalar(None);
            }
            2 => {
                // An atomic on the caller's slot.
                let aop = self.atomic_op();
                if aop == op::ATOMIC_CMPXCHG {
                    self.emit(mov64_imm(0, 0));
                }
                self.emit(atomic(op::DW, aop, 1, 0, 2));
            }
            3 => {
                // Spill our own stack pointer into the caller's frame.
                self.emit(stx(op::DW, 1, 0, 10));
            }
            _ => {
                self.regs[6] = K::Uninit;
                for _ in 0..1 + self.below(3) {
                    self.spill_fill();
                }
            }
        }
        let returns_stack = self.chance(6);
        if returns_stack {
            self.emit(mov64_reg(0, 10));
            self.emit(alu64_imm(op::ADD, 0, -8));
        } else if !matches!(self.regs[0], K::Scalar(_)) || self.chance(2) {
            let c = self.konst() as i32;
            self.emit(mov64_imm(0, c));
        }
        self.mark(ret);
        self.emit(exit());
        self.ret = old_ret;
        self.depth -= 1;
        let body = std::mem::replace(&mut self.items, saved_items);
        self.subs.push((l, body));
        self.regs = saved_regs;
        self.slots = saved_slots;
        self.clear_caller_saved();
        // The callee may have changed the slot it was given.
        if arg != 0 {
            self.touch_stack(off, 8, K::Scalar(None));
        }
        if returns_stack {
            self.regs[0] = K::Stack(-8);
            let d = self.scratch();
            self.emit(ldx(op::DW, d, 0, 0));
            self.regs[0] = K::Scalar(None);
            self.regs[d as usize] = K::Scalar(None);
        } else {
            self.regs[0] = K::Scalar(None);
            if arg != 0 && self.chance(2) {
                let d = self.scratch();
                self.emit(ldx(op::DW, d, 10, off));
                self.regs[d as usize] = K::Scalar(None);
                self.use_reg(d);
            }
        }
    }

    /// A value spilled, changed in memory (byte store or atomic), filled and branched on.
    fn branch_on_spilled(&mut self) {
        let slot = self.pick_slot();
        let off = Self::slot_off(slot);
        let c = self.pick(&[0i64, 1, 7, 100]);
        let r = self.scratch();
        self.set_const(r, c);
        self.emit(stx(op::DW, 10, off, r));
        self.touch_stack(off, 8, K::Scalar(Some(c)));
        // Changed in memory half the time (the tripwire then must be explored and rejected).
        match self.below(4) {
            0 => {
                let b = self.below(8) as i16;
                let imm = self.pick(&[1, 0x80, 0xff]);
                self.emit(st(op::B, 10, off + b, imm));
                self.f.partial = true;
            }
            1 => {
                self.f.atomic_stack = true;
                let v = self.pick(&[2u8, 3, 4, 5]);
                self.set_const(v, 1);
                let aop = self.pick(&[op::ATOMIC_ADD, op::ATOMIC_XOR, op::ATOMIC_OR]);
                self.emit(atomic(op::DW, aop, 10, off, v));
            }
            _ => {}
        }
        let d = self.scratch();
        self.emit(ldx(op::DW, d, 10, off));
        self.regs[d as usize] = K::Scalar(Some(c));
        self.tripwire(d, c);
        self.regs[d as usize] = K::Scalar(None);
        self.slots[slot] = K::Scalar(None);
    }

    fn ctx_access(&mut self) {
        let d = self.dst(&[0u8, 2, 3, 4, 5, 9]);
        let off = self.pick(&[0i16, 8, 16, 20, 24, 36, 40, 48]);
        let size = if off < 16 { op::DW } else { op::W };
        self.emit(ldx(size, d, 6, off));
        self.regs[d as usize] = K::Scalar(None);
        self.use_reg(d);
    }

    fn counted_loop(&mut self) {
        if self.depth > 0 {
            return self.scalar_alu();
        }
        self.f.loops = true;
        self.in_loop = true;
        let c = 9;
        self.emit(mov64_imm(c, 0));
        let head = self.label();
        self.mark(head);
        self.depth += 1;
        for _ in 0..1 + self.below(2) {
            match self.below(3) {
                0 => self.spill_fill(),
                1 => self.atomic_value(),
                _ => self.scalar_alu(),
            }
        }
        self.depth -= 1;
        self.regs[c as usize] = K::Scalar(None);
        self.emit(alu64_imm(op::ADD, c, 1));
        let n = 1 + self.below(8) as i32;
        self.jmp(jmp_imm(op::JLT, c, n, 0), head);
        self.in_loop = false;
    }

    fn snippet(&mut self) {
        match self.below(23) {
            0..=4 => self.spill_fill(),
            5..=7 => self.atomic_stack(),
            8 | 9 => self.atomic_value(),
            10..=12 => self.ptr_arith(),
            13 | 14 => self.helper(),
            15 => self.call(),
            16 => self.branch_on_spilled(),
            17 => self.counted_loop(),
            18..=20 => self.ctx_access(),
            _ => self.scalar_alu(),
        }
    }

    fn lookup_into(&mut self, d: u8, map: i32, key: i32) {
        let ks = KEY_SIZE[map as usize];
        self.emit(st(if ks == 8 { op::DW } else { op::W }, 10, -8, key));
        self.touch_stack(-8, ks as i16, K::Scalar(Some(key as i64)));
        self.lddw_map(1, map);
        self.emit(mov64_reg(2, 10));
        self.emit(alu64_imm(op::ADD, 2, -8));
        self.emit(call(1));
        self.clear_caller_saved();
        let ret = self.ret;
        self.jmp(jmp_imm(op::JEQ, 0, 0, 0), ret);
        self.emit(mov64_reg(d, 0));
        self.regs[d as usize] = K::Value(map, 0);
        self.regs[0] = K::Value(map, 0);
    }
}

/// How the program ends; most end plainly, some probe the edges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Plain,
    /// The main program has no exit and runs into its first subprogram.
    FallIntoSub,
    /// The last instruction is a conditional jump.
    CondJumpLast,
    /// A jump to the second half of an `lddw`.
    IntoLddw,
    /// A jump to `len`.
    JumpToLen,
    /// A call with reserved bits set (`0x8d`, or src 2).
    OddCall,
}

/// A generated program with what it exercises.
pub struct Generated {
    pub obj: Object,
    pub features: Features,
    pub ending: Ending,
}

/// A random program for `section` ("tuner" or a net hook).
pub fn program(seed: u64, section: &str) -> Generated {
    let mut g = Gen {
        r: Rng(seed),
        items: vec![],
        labels: 0,
        regs: [K::Uninit; 11],
        slots: [K::Uninit; 64],
        ret: 0,
        tuner: section == "tuner",
        subs: vec![],
        f: Features::default(),
        depth: 0,
        in_loop: false,
    };
    g.ret = g.label();
    g.regs[1] = K::Ctx;
    g.regs[10] = K::Stack(0);
    g.emit(mov64_reg(6, 1));
    g.regs[6] = K::Ctx;
    // Map values in r7 and r8 (NULL: straight to the exit with r0 = 0).
    match g.below(4) {
        0 => {}
        1 => {
            let k = g.below(4) as i32;
            g.lookup_into(7, ARR, k)
        }
        2 => {
            g.lookup_into(7, ARR, 0);
            let k = g.pick(&[1, 1, 3]);
            g.lookup_into(8, ARR, k);
        }
        _ => {
            let k = g.below(4) as i32;
            g.lookup_into(7, ARR, k);
            let m = g.pick(&[ARR2, HASH]);
            g.lookup_into(8, m, 0);
        }
    }
    if g.chance(6) {
        // A direct reference into .rodata, as clang emits for constants.
        g.emit(insn(op::LDDW, 8, op::PSEUDO_MAP_VALUE, 0, RODATA));
        g.emit(insn(0, 0, 0, 0, 0));
        g.regs[8] = K::Value(RODATA, 0);
    }
    let c = g.konst();
    g.set_const(9, c);
    let n = 1 + g.below(6);
    for _ in 0..n {
        g.snippet();
    }
    let ending = match g.below(70) {
        0 => Ending::FallIntoSub,
        1 => Ending::CondJumpLast,
        2 => Ending::IntoLddw,
        3 => Ending::JumpToLen,
        4 => Ending::OddCall,
        _ => Ending::Plain,
    };
    // Return a scalar (sometimes whatever r9 holds, pointers included).
    if !matches!(g.regs[9], K::Scalar(_)) && !g.chance(8) {
        g.set_const(9, 0);
    }
    g.emit(mov64_reg(0, 9));
    let ret = g.ret;
    g.mark(ret);
    let mut items = std::mem::take(&mut g.items);
    match ending {
        Ending::FallIntoSub if !g.subs.is_empty() => {}
        _ => items.push(Item::I(exit())),
    }
    for (l, body) in std::mem::take(&mut g.subs) {
        items.push(Item::Mark(l));
        items.extend(body);
    }
    let mut insns = resolve(&items, g.labels);
    edge(&mut insns, ending, &mut g.r);
    if ending != Ending::Plain {
        g.f.edge_jump = true;
    }
    Generated {
        obj: Object {
            programs: vec![Program {
                name: "sound".into(),
                section: section.into(),
                insns,
                lines: vec![],
            }],
            maps: maps(),
        },
        features: g.f,
        ending,
    }
}

/// The instructions of `items`, with every label resolved to its offset.
pub(crate) fn resolve(items: &[Item], nlabels: usize) -> Vec<Insn> {
    let mut at = vec![0usize; nlabels];
    let mut pc = 0;
    for it in items {
        match it {
            Item::Mark(l) => at[*l] = pc,
            _ => pc += 1,
        }
    }
    let mut out = vec![];
    for it in items {
        let pc = out.len() as i64;
        match it {
            Item::I(i) => out.push(*i),
            Item::Jmp(i, l) => out.push(Insn {
                off: (at[*l] as i64 - pc - 1) as i16,
                ..*i
            }),
            Item::Call(l) => out.push(call_local((at[*l] as i64 - pc - 1) as i32)),
            Item::Mark(_) => {}
        }
    }
    out
}

/// Applies an edge-probing ending to a laid-out program.
fn edge(insns: &mut Vec<Insn>, ending: Ending, r: &mut Rng) {
    let n = insns.len();
    match ending {
        Ending::CondJumpLast => {
            // The last exit becomes a conditional jump back (to another exit when there is
            // one): the path that does not jump runs off the end.
            let o = if r.below(2) == 0 { op::JEQ } else { op::JGT };
            let t = insns[..n - 1]
                .iter()
                .rposition(|i| i.code == op::JMP | op::EXIT)
                .unwrap_or(r.below(n as u64) as usize);
            insns[n - 1] = jmp_imm(o, 0, 0, (t as i64 - n as i64) as i16);
        }
        Ending::IntoLddw => {
            if let Some(k) = insns.iter().position(|i| i.is_lddw()) {
                // A jump over the first half of the first lddw, placed before it.
                insns.insert(k, ja(1));
                fix_after_insert(insns, k);
            }
        }
        Ending::JumpToLen => {
            let k = r.below(n as u64) as usize;
            let j = jmp_imm(op::JEQ, 9, 0, 0);
            insns.insert(k, j);
            fix_after_insert(insns, k);
            let len = insns.len() as i64;
            insns[k].off = (len - k as i64 - 1) as i16;
        }
        Ending::OddCall => {
            if let Some(i) = insns.iter_mut().find(|i| i.code == op::JMP | op::CALL) {
                match r.below(3) {
                    0 => i.code |= op::X,
                    1 => i.src = if i.src == op::PSEUDO_CALL { 2 } else { 1 },
                    _ => i.dst = 1,
                }
            }
        }
        Ending::Plain | Ending::FallIntoSub => {}
    }
}

/// Keeps jumps and calls pointing at the same instructions after an insertion at `k`.
fn fix_after_insert(insns: &mut [Insn], k: usize) {
    for pc in 0..insns.len() {
        if pc == k {
            continue;
        }
        let i = insns[pc];
        let is_jump = matches!(i.class(), op::JMP | op::JMP32)
            && !matches!(i.op(), op::EXIT)
            && (i.op() != op::CALL || i.src == op::PSEUDO_CALL);
        if !is_jump || (pc > 0 && insns[pc - 1].is_lddw()) {
            continue;
        }
        let old_pc = if pc > k { pc - 1 } else { pc } as i64;
        let rel = if i.op() == op::CALL {
            i.imm as i64
        } else {
            i.off as i64
        };
        let old_t = old_pc + 1 + rel;
        let new_t = if old_t >= k as i64 { old_t + 1 } else { old_t };
        let new_rel = new_t - pc as i64 - 1;
        if i.op() == op::CALL {
            insns[pc].imm = new_rel as i32;
        } else {
            insns[pc].off = new_rel as i16;
        }
    }
}

/// Removes instruction `k` (both halves of an `lddw`), keeping the other jumps pointing at the
/// same instructions (a jump to a removed one goes to its successor). For minimising.
pub fn remove(insns: &[Insn], k: usize) -> Vec<Insn> {
    let width = if insns[k].is_lddw() && k + 1 < insns.len() {
        2
    } else {
        1
    };
    let new_index = |old: i64| -> i64 {
        if old > k as i64 {
            old - (width as i64).min(old - k as i64)
        } else {
            old
        }
    };
    let mut out = vec![];
    for (pc, i) in insns.iter().enumerate() {
        if pc >= k && pc < k + width {
            continue;
        }
        let mut i = *i;
        let is_jump = matches!(i.class(), op::JMP | op::JMP32)
            && i.op() != op::EXIT
            && (i.op() != op::CALL || i.src == op::PSEUDO_CALL)
            && !(pc > 0 && insns[pc - 1].is_lddw());
        if is_jump {
            let rel = if i.op() == op::CALL {
                i.imm as i64
            } else {
                i.off as i64
            };
            let t = pc as i64 + 1 + rel;
            let nt = new_index(t);
            let np = new_index(pc as i64);
            let nrel = nt - np - 1;
            if i.op() == op::CALL {
                i.imm = nrel as i32;
            } else {
                i.off = nrel as i16;
            }
        }
        out.push(i);
    }
    out
}
