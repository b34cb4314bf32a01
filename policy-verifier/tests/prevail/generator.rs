//! Random programs for the differential test, built from gadgets shaped like policy code
//! (context reads and writes, scalar and pointer spills, map lookups, updates and global
//! data, atomics, counted loops, forward branches, helper and BPF-to-BPF calls). Each gadget
//! is, with a small probability, bent at the edge of what is allowed (an offset one past a
//! field, a missing NULL check, a misaligned spill, a pointer in a map value, a loop with no
//! bound, ...), so that programs fall on both sides of both verifiers and near the border.
//!
//! Register discipline: r6 holds the context for the whole program; r7-r9 hold scalars
//! (initialized first); r0-r5 are temporaries that each gadget sets before use (calls
//! clobber them). Stack: fp-8..-64 scalar slots, fp-72..-128 pointer slots, fp-136..-144
//! keys, fp-160..-176 map values.

use policy_object::insn::build::{
    alu64_imm, alu64_reg, atomic, call, call_local, exit, insn, jmp_imm, ld_map, ld_map_value, ldx,
    mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, MapKind, Object, Program};

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
    fn of<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

fn size_of(bytes: u32) -> u8 {
    match bytes {
        1 => op::B,
        2 => op::H,
        4 => op::W,
        _ => op::DW,
    }
}

const SCALARS: [u8; 3] = [7, 8, 9];
/// (offset, size, writable) of `struct ncclbpf_tuner_ctx` / `struct ncclbpf_net_ctx`.
const TUNER: &[(i16, u32, bool)] = &[
    (0, 8, false),
    (8, 8, false),
    (16, 4, false),
    (20, 4, false),
    (24, 4, false),
    (28, 4, false),
    (32, 4, false),
    (36, 4, false),
    (40, 4, true),
    (44, 4, true),
    (48, 4, true),
];
const NET: &[(i16, u32, bool)] = &[
    (0, 8, false),
    (8, 8, false),
    (16, 8, false),
    (24, 4, false),
    (28, 4, false),
    (32, 4, false),
    (36, 4, false),
    (40, 8, false),
    (48, 4, false),
];
const NET_SECTIONS: [&str; 6] = [
    "net/connect",
    "net/accept",
    "net/isend",
    "net/irecv",
    "net/complete",
    "net/close",
];

/// Map indices (the `lddw` immediates) and their shapes.
const ARR: i32 = 0; // array, key 4, value 16, 4 entries
const HASH: i32 = 1; // hash, key 8, value 16
const PCPU: i32 = 2; // per-CPU array, key 4, value 8, 2 entries
const RODATA: i32 = 3; // .rodata, 16 bytes
const BSS: i32 = 4; // .bss, 8 bytes

fn maps() -> Vec<MapDef> {
    let m =
        |name: &str, kind, key_size, value_size, max_entries, initial: Option<Vec<u8>>| MapDef {
            name: name.into(),
            kind,
            key_size,
            value_size,
            max_entries,
            flags: 0,
            read_only: name == ".rodata",
            scope: if name == ".rodata" {
                policy_object::Scope::Config
            } else {
                policy_object::Scope::Local
            },
            source: None,
            reduce: policy_object::Reduce::Sum,
            initial,
        };
    vec![
        m("arr", MapKind::Array, 4, 16, 4, None),
        m("hash", MapKind::Hash, 8, 16, 8, None),
        m("pcpu", MapKind::PercpuArray, 4, 8, 2, None),
        m(
            ".rodata",
            MapKind::Array,
            4,
            16,
            1,
            Some((1..=16).collect()),
        ),
        m(".bss", MapKind::Array, 4, 8, 1, Some(vec![0; 8])),
    ]
}

fn key_size(map: i32) -> u32 {
    if map == HASH { 8 } else { 4 }
}
fn value_size(map: i32) -> u32 {
    match map {
        ARR | HASH | RODATA => 16,
        _ => 8,
    }
}

struct Gen {
    r: Rng,
    tuner: bool,
    /// One gadget in `bad` is bent.
    bad: u64,
}

enum Block {
    Code(Vec<Insn>),
    /// A conditional forward jump over the next `skip` blocks.
    Skip(Insn, usize),
    /// A BPF-to-BPF call of the subprogram.
    CallSub,
}

impl Gen {
    fn bent(&mut self) -> bool {
        self.r.one_in(self.bad)
    }
    fn scalar(&mut self) -> u8 {
        self.r.of(&SCALARS)
    }
    fn fields(&self) -> &'static [(i16, u32, bool)] {
        if self.tuner { TUNER } else { NET }
    }

    fn ctx_read(&mut self) -> Vec<Insn> {
        let d = self.scalar();
        let (off, size, _) = self.r.of(self.fields());
        if !self.bent() {
            return vec![ldx(size_of(size), d, 6, off)];
        }
        match self.r.below(6) {
            0 => vec![ldx(op::B, d, 6, off)],     // narrow read at the start
            1 => vec![ldx(op::W, d, 6, off + 2)], // straddles a field
            2 => vec![ldx(op::W, d, 6, 52)],      // padding
            3 => vec![ldx(op::DW, d, 6, 56)],     // past the end
            4 => vec![ldx(op::DW, d, 6, off.max(4))], // wide read
            _ => vec![ldx(op::W, d, 6, -4)],      // before the start
        }
    }

    fn ctx_write(&mut self) -> Vec<Insn> {
        let s = self.scalar();
        if self.tuner && !self.bent() {
            let off = self.r.of(&[40i16, 44, 48]);
            return if self.r.one_in(2) {
                vec![stx(op::W, 6, off, s)]
            } else {
                vec![st(op::W, 6, off, self.r.below(4) as i32 - 1)]
            };
        }
        if !self.tuner && !self.r.one_in(4) {
            // Net contexts are read-only: keep most net programs clean.
            return self.ctx_read();
        }
        match self.r.below(4) {
            0 => vec![stx(op::DW, 6, 0, s)],   // read-only field
            1 => vec![stx(op::DW, 6, 40, 10)], // a pointer into the context
            2 => vec![stx(op::DW, 6, 40, s)],  // 8 bytes over algo+proto
            _ => vec![st(op::W, 6, 52, 0)],    // padding
        }
    }

    fn alu(&mut self) -> Vec<Insn> {
        let d = self.scalar();
        let s = self.scalar();
        let class = if self.r.one_in(3) { op::ALU } else { op::ALU64 };
        let o = self.r.of(&[
            op::ADD,
            op::SUB,
            op::MUL,
            op::AND,
            op::OR,
            op::XOR,
            op::LSH,
            op::RSH,
            op::ARSH,
            op::DIV,
            op::MOD,
            op::MOV,
            op::NEG,
        ]);
        let bits = if class == op::ALU64 { 64 } else { 32 };
        match o {
            op::NEG => vec![insn(class | o, d, 0, 0, 0)],
            op::LSH | op::RSH | op::ARSH => {
                if self.r.one_in(2) {
                    vec![insn(class | o | op::K, d, 0, 0, self.r.below(bits) as i32)]
                } else {
                    vec![
                        alu64_imm(op::AND, s, bits as i32 - 1),
                        insn(class | o | op::X, d, s, 0, 0),
                    ]
                }
            }
            op::DIV | op::MOD => {
                if self.bent() {
                    vec![insn(class | o | op::X, d, s, 0, 0)] // divisor may be zero
                } else if self.r.one_in(2) {
                    vec![alu64_imm(op::OR, s, 1), insn(class | o | op::X, d, s, 0, 0)]
                } else {
                    vec![insn(
                        class | o | op::K,
                        d,
                        0,
                        0,
                        1 + self.r.below(999) as i32,
                    )]
                }
            }
            _ => {
                if self.r.one_in(2) {
                    vec![insn(class | o | op::X, d, s, 0, 0)]
                } else {
                    let imm = match self.r.below(3) {
                        0 => self.r.next() as i32,
                        1 => self.r.below(64) as i32 - 16,
                        _ => 1 << self.r.below(31),
                    };
                    vec![insn(class | o | op::K, d, 0, 0, imm)]
                }
            }
        }
    }

    fn scalar_spill(&mut self) -> Vec<Insn> {
        let s = self.scalar();
        let d = self.scalar();
        let slot = -8 * (1 + self.r.below(8) as i16);
        if !self.bent() {
            return vec![stx(op::DW, 10, slot, s), ldx(op::DW, d, 10, slot)];
        }
        match self.r.below(3) {
            0 => vec![ldx(op::DW, d, 10, slot)], // maybe never written
            1 => vec![stx(op::W, 10, slot, s), ldx(op::DW, d, 10, slot)], // half written
            _ => vec![stx(op::DW, 10, slot - 4, s), ldx(op::W, d, 10, slot)], // misaligned
        }
    }

    /// Spills a pointer, fills it back and uses it.
    fn pointer_spill(&mut self) -> Vec<Insn> {
        let slot = -72 - 8 * self.r.below(8) as i16;
        let d = self.scalar();
        let (f, sz, _) = self.r.of(self.fields());
        let mut v = vec![stx(op::DW, 10, slot, 6)];
        // Bent more often than other gadgets: spills are where verifiers go wrong.
        if !self.r.one_in(3) {
            v.push(ldx(op::DW, 2, 10, slot));
            v.push(ldx(size_of(sz), d, 2, f));
            return v;
        }
        match self.r.below(5) {
            0 => {
                // Misaligned spill and fill.
                v[0] = stx(op::DW, 10, slot - 4, 6);
                v.push(ldx(op::DW, 2, 10, slot - 4));
                v.push(ldx(size_of(sz), d, 2, f));
            }
            1 => v.push(ldx(op::W, d, 10, slot)), // half of a pointer as a number
            2 => {
                // One byte overwritten, then dereferenced.
                v.push(st(op::B, 10, slot, 0));
                v.push(ldx(op::DW, 2, 10, slot));
                v.push(ldx(size_of(sz), d, 2, f));
            }
            3 => {
                // An atomic add on the spilled pointer, then dereferenced.
                v.push(mov64_imm(1, 4096));
                v.push(atomic(op::DW, op::ATOMIC_ADD, 10, slot, 1));
                v.push(ldx(op::DW, 2, 10, slot));
                v.push(ldx(size_of(sz), d, 2, f));
            }
            _ => {
                // A stack pointer spilled and filled, then dereferenced below the frame.
                v[0] = mov64_reg(3, 10);
                v.push(alu64_imm(op::ADD, 3, -8));
                v.push(stx(op::DW, 10, slot, 3));
                v.push(ldx(op::DW, 2, 10, slot));
                v.push(ldx(op::DW, d, 2, -512));
            }
        }
        v
    }

    /// Writes a key for `map` at fp-136 (from a scalar, masked for arrays).
    fn key(&mut self, map: i32) -> Vec<Insn> {
        let s = self.scalar();
        let mut v = vec![mov64_reg(1, s)];
        if map != HASH {
            v.push(alu64_imm(op::AND, 1, 3));
        }
        v.push(stx(size_of(key_size(map)), 10, -136, 1));
        v.push(mov64_reg(2, 10));
        v.push(alu64_imm(op::ADD, 2, -136));
        v
    }

    fn lookup(&mut self) -> Vec<Insn> {
        let map = self.r.of(&[ARR, HASH, PCPU, ARR]);
        let vs = value_size(map) as i16;
        let mut v = self.key(map);
        v.extend(ld_map(1, map));
        v.push(call(1));
        let mut body = vec![];
        let d = self.scalar();
        let s = self.scalar();
        let checked = !self.bent() || !self.r.one_in(3);
        let kind = if checked { self.r.below(7) } else { 0 };
        let bend = checked && self.bent();
        match kind {
            0 | 1 => {
                let off = if bend {
                    vs - 4
                } else {
                    8 * self.r.below(vs as u64 / 8) as i16
                };
                body.push(ldx(op::DW, d, 0, off));
            }
            2 => {
                let off = if bend { -8 } else { 0 };
                body.push(atomic(op::DW, op::ATOMIC_ADD, 0, off, s));
            }
            3 => {
                // A variable offset, masked to the value (or not).
                body.push(mov64_reg(3, s));
                body.push(alu64_imm(op::AND, 3, if bend { 15 } else { vs as i32 - 8 }));
                body.push(alu64_reg(op::ADD, 0, 3));
                body.push(ldx(op::DW, d, 0, 0));
            }
            4 => {
                // A pointer stored into the value (a leak) or a scalar.
                body.push(stx(op::DW, 0, 0, if bend { 6 } else { s }));
            }
            5 => {
                // Pointer minus pointer within one value: a number.
                body.push(mov64_reg(4, 0));
                body.push(alu64_imm(op::ADD, 4, 8));
                body.push(alu64_reg(op::SUB, 4, if bend { 10 } else { 0 }));
                body.push(mov64_reg(d, 4));
            }
            _ => {
                // The value pointer spilled, filled and written through.
                let slot = -72 - 8 * self.r.below(8) as i16;
                body.push(stx(op::DW, 10, if bend { slot - 4 } else { slot }, 0));
                body.push(ldx(op::DW, 3, 10, if bend { slot - 4 } else { slot }));
                body.push(stx(op::DW, 3, 0, s));
            }
        }
        if checked {
            v.push(jmp_imm(op::JEQ, 0, 0, body.len() as i16));
        }
        v.extend(body);
        v
    }

    fn update(&mut self) -> Vec<Insn> {
        let map = self.r.of(&[ARR, HASH, PCPU]);
        let vs = value_size(map) as i16;
        let s = self.scalar();
        let mut v = vec![];
        // The value at fp-176 (16 bytes) or fp-168 (8 bytes).
        let base = -160 - vs;
        let bend = self.bent();
        let how = if bend { self.r.below(4) } else { 4 };
        for k in 0..vs / 8 {
            if how == 0 && k == 1 {
                continue; // half initialized
            }
            let src = if how == 1 && k == 0 { 6 } else { s }; // a spilled pointer in the value
            v.push(stx(op::DW, 10, base + 8 * k, src));
        }
        v.extend(self.key(map));
        if how == 2 {
            // The value pointer itself spilled and filled.
            v.push(mov64_reg(3, 10));
            v.push(alu64_imm(op::ADD, 3, base as i32));
            v.push(stx(op::DW, 10, -128, 3));
            v.push(ldx(op::DW, 3, 10, -128));
        } else if how == 3 {
            v.push(mov64_reg(3, 6)); // the context as the value
        } else {
            v.push(mov64_reg(3, 10));
            v.push(alu64_imm(op::ADD, 3, base as i32));
        }
        v.extend(ld_map(1, map));
        v.push(mov64_imm(4, self.r.below(3) as i32));
        v.push(call(2));
        if self.r.one_in(3) {
            v.extend(self.key(map));
            v.extend(ld_map(1, map));
            v.push(call(3));
        }
        v
    }

    /// Global data: `.rodata` read, `.bss` updated.
    fn globals(&mut self) -> Vec<Insn> {
        let d = self.scalar();
        let s = self.scalar();
        if !self.bent() {
            let mut v = ld_map_value(1, RODATA, 8 * self.r.below(2) as i32).to_vec();
            v.push(ldx(op::DW, d, 1, 0));
            v.extend(ld_map_value(2, BSS, 0));
            v.push(atomic(op::DW, op::ATOMIC_ADD, 2, 0, s));
            return v;
        }
        match self.r.below(4) {
            0 => {
                // A store into .rodata.
                let mut v = ld_map_value(1, RODATA, 0).to_vec();
                v.push(stx(op::DW, 1, 0, s));
                v
            }
            1 => {
                // .rodata looked up through the helper, and written.
                let mut v = self.key(RODATA);
                v.push(st(op::W, 10, -136, 0));
                v.extend(ld_map(1, RODATA));
                v.push(call(1));
                v.push(jmp_imm(op::JEQ, 0, 0, 1));
                v.push(stx(op::DW, 0, 0, s));
                v
            }
            2 => {
                // .rodata as the value of an update of itself.
                let mut v = self.key(RODATA);
                v.push(st(op::W, 10, -136, 0));
                v.extend(ld_map_value(3, BSS, 0));
                v.extend(ld_map(1, RODATA));
                v.push(mov64_imm(4, 0));
                v.push(call(2));
                v
            }
            _ => {
                // Past the end of .bss.
                let mut v = ld_map_value(1, BSS, 4).to_vec();
                v.push(ldx(op::DW, d, 1, 0));
                v
            }
        }
    }

    fn stack_atomic(&mut self) -> Vec<Insn> {
        let s = self.scalar();
        let slot = -8 * (1 + self.r.below(8) as i16);
        let o = self.r.of(&[
            op::ATOMIC_ADD,
            op::ATOMIC_ADD | op::FETCH,
            op::ATOMIC_OR,
            op::ATOMIC_XOR | op::FETCH,
            op::ATOMIC_XCHG,
        ]);
        let mut v = vec![st(op::DW, 10, slot, 1)];
        if self.bent() {
            match self.r.below(2) {
                0 => v.push(atomic(op::DW, o, 10, slot + 4, s)), // misaligned
                _ => v.push(atomic(op::DW, o, 6, 0, s)),         // on ctx
            }
        } else {
            v.push(atomic(op::DW, o, 10, slot, s));
        }
        v.push(ldx(op::DW, self.scalar(), 10, slot));
        v
    }

    /// c = 0; body; c += 1; if c < N goto body (r4 or w4 as the counter).
    fn counted_loop(&mut self) -> Vec<Insn> {
        let mut body = vec![];
        for _ in 0..1 + self.r.below(2) {
            body.extend(self.alu());
        }
        let n = 1 + self.r.below(16) as i32;
        let bend = self.bent();
        let narrow = self.r.one_in(3);
        let (alu, jmp) = if narrow {
            (op::ALU, op::JMP32)
        } else {
            (op::ALU64, op::JMP)
        };
        let mut v = vec![insn(alu | op::MOV | op::K, 4, 0, 0, 0)];
        let len = body.len() as i16;
        v.extend(body);
        if bend && self.r.one_in(2) {
            // Counts by two towards an odd bound with !=: never exits.
            v.push(insn(alu | op::ADD | op::K, 4, 0, 0, 2));
            v.push(insn(jmp | op::JNE | op::K, 4, 0, -(len + 2), 2 * n + 1));
        } else if bend {
            // The bound is a context field: nothing bounds the loop.
            v.insert(0, ldx(op::W, 5, 6, 16));
            v.push(insn(alu | op::ADD | op::K, 4, 0, 0, 1));
            v.push(insn(jmp | op::JLT | op::X, 4, 5, -(len + 2), 0));
        } else if self.r.one_in(3) {
            // Counting down with !=.
            v[0] = insn(alu | op::MOV | op::K, 4, 0, 0, n);
            v.push(insn(alu | op::ADD | op::K, 4, 0, 0, -1));
            v.push(insn(jmp | op::JNE | op::K, 4, 0, -(len + 2), 0));
        } else {
            v.push(insn(alu | op::ADD | op::K, 4, 0, 0, 1));
            v.push(insn(jmp | op::JLT | op::K, 4, 0, -(len + 2), n));
        }
        v
    }

    fn helper(&mut self) -> Vec<Insn> {
        let d = self.scalar();
        let bend = self.bent();
        let id = match (self.tuner, bend) {
            (true, false) => return self.alu(),
            (true, true) => self.r.of(&[5, 8]), // clocks and CPU ids: not for tuners
            (false, true) => self.r.of(&[4, 6, 9999]), // not ours
            (false, false) => self.r.of(&[5, 8]),
        };
        vec![call(id), mov64_reg(d, 0)]
    }

    fn cond(&mut self) -> Insn {
        let o = self.r.of(&[
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
        ]);
        let class = if self.r.one_in(3) { op::JMP32 } else { op::JMP };
        let d = if self.bent() { 6 } else { self.scalar() }; // a pointer compared
        if self.r.one_in(2) {
            insn(class | o | op::X, d, self.scalar(), 0, 0)
        } else {
            insn(class | o | op::K, d, 0, 0, self.r.below(200) as i32 - 50)
        }
    }

    fn block(&mut self) -> Block {
        Block::Code(match self.r.below(20) {
            0..=2 => self.ctx_read(),
            3 | 4 => self.ctx_write(),
            5..=7 => self.alu(),
            8 => self.scalar_spill(),
            9 => self.pointer_spill(),
            10 | 11 => self.lookup(),
            12 => self.update(),
            13 => self.globals(),
            14 => self.stack_atomic(),
            15 => self.counted_loop(),
            16 => self.helper(),
            17 => return Block::CallSub,
            _ => {
                let c = self.cond();
                return Block::Skip(c, 1 + self.r.below(3) as usize);
            }
        })
    }
}

/// A random program (tuner or net hook, picked by the seed) and its maps.
pub fn program(seed: u64) -> Object {
    let mut r = Rng(seed);
    let section = if r.one_in(2) {
        "tuner"
    } else {
        NET_SECTIONS[r.below(6) as usize]
    };
    let bad = 10 + r.below(30);
    let mut g = Gen {
        r,
        tuner: section == "tuner",
        bad,
    };
    let mut blocks = vec![Block::Code(vec![mov64_reg(6, 1)])];
    for s in SCALARS {
        blocks.push(Block::Code(if g.r.one_in(2) {
            let (off, size, _) = g.r.of(g.fields());
            vec![ldx(size_of(size), s, 6, off)]
        } else {
            vec![mov64_imm(s, g.r.below(1 << 16) as i32)]
        }));
    }
    for _ in 0..2 + g.r.below(12) {
        let b = g.block();
        blocks.push(b);
    }
    let ret = if g.bent() {
        g.r.of(&[6, 10])
    } else {
        g.scalar()
    };
    let fall_through = g.bent();
    let mut tail = vec![mov64_reg(0, ret)];
    if !fall_through {
        tail.push(exit());
    }
    blocks.push(Block::Code(tail));

    // Lay out: block starts, then jumps and calls resolved.
    let size = |b: &Block| match b {
        Block::Code(v) => v.len(),
        Block::Skip(..) => 1,
        Block::CallSub => 3,
    };
    let mut starts = vec![];
    let mut pos = 0;
    for b in &blocks {
        starts.push(pos);
        pos += size(b);
    }
    let end = pos;
    let last = blocks.len() - 1;
    let mut insns = vec![];
    for (k, b) in blocks.iter().enumerate() {
        match b {
            Block::Code(v) => insns.extend_from_slice(v),
            Block::Skip(c, n) => {
                let mut c = *c;
                c.off = (starts[(k + n + 1).min(last)] - starts[k] - 1) as i16;
                insns.push(c);
            }
            Block::CallSub => {
                let s = g.scalar();
                let here = starts[k] + 1;
                insns.push(mov64_reg(1, s));
                insns.push(call_local((end - here - 1) as i32));
                insns.push(mov64_reg(s, 0));
            }
        }
    }
    // The subprogram: r0 = r1 * 3 + (its own stack slot); exit.
    insns.extend([
        st(op::DW, 10, -8, 5),
        ldx(op::DW, 0, 10, -8),
        alu64_imm(op::MUL, 1, 3),
        alu64_reg(op::ADD, 0, 1),
        exit(),
    ]);
    Object {
        programs: vec![Program {
            name: format!("gen{seed}"),
            section: section.into(),
            insns,
            lines: vec![],
        }],
        maps: maps(),
    }
}
