//! A generator of random BPF programs shaped like policies (context loads, stack spills, map
//! lookups with NULL checks, bounded loops, forward branches, atomics, context writes), so
//! that a good share of them pass the verifier. Used by the differential and soundness
//! properties and by the verifier fuzz test.

use policy_object::insn::build::{
    alu64_imm, atomic, call, exit, insn, jmp_imm, ldx, mov64_imm, mov64_reg, stx,
};
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, MapKind, Object, Program};

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^ (x >> 33)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// Scalar registers the generator plays with (r6 holds the context, r1-r5 die at calls).
const REGS: [u8; 8] = [0, 2, 3, 4, 5, 7, 8, 9];
const TUNER_READ: [(i16, u8); 8] = [
    (0, op::DW),
    (8, op::DW),
    (16, op::W),
    (20, op::W),
    (24, op::W),
    (36, op::W),
    (44, op::W),
    (48, op::W),
];
const TUNER_WRITE: [i16; 3] = [40, 44, 48];

enum Block {
    Plain(Vec<Insn>),
    /// A conditional jump to the start of a later block.
    Jump(Insn, usize),
}

pub fn maps() -> Vec<MapDef> {
    vec![
        MapDef {
            name: "garr".into(),
            kind: MapKind::Array,
            key_size: 4,
            value_size: 16,
            max_entries: 4,
            flags: 0,
            initial: None,
            read_only: false,
            scope: policy_object::Scope::Local,
            source: None,
            reduce: policy_object::Reduce::Sum,
        },
        MapDef {
            name: "ghash".into(),
            kind: MapKind::Hash,
            key_size: 4,
            value_size: 16,
            max_entries: 8,
            flags: 0,
            initial: None,
            read_only: false,
            scope: policy_object::Scope::Local,
            source: None,
            reduce: policy_object::Reduce::Sum,
        },
    ]
}

fn alu_op(r: &mut Rng) -> u8 {
    r.pick(&[
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
        op::NEG,
        op::MOV,
    ])
}

fn alu(r: &mut Rng, d: u8) -> Vec<Insn> {
    if r.below(16) == 0 {
        let order = if r.below(2) == 0 { op::K } else { op::X };
        return vec![insn(
            op::ALU | op::END | order,
            d,
            0,
            0,
            r.pick(&[16, 32, 64]),
        )];
    }
    let class = if r.below(3) == 0 { op::ALU } else { op::ALU64 };
    let o = alu_op(r);
    let bits = if class == op::ALU64 { 64 } else { 32 };
    if o == op::NEG {
        return vec![insn(class | o, d, 0, 0, 0)];
    }
    if matches!(o, op::LSH | op::RSH | op::ARSH) && r.below(2) == 0 {
        return vec![insn(class | o | op::K, d, 0, 0, r.below(bits) as i32)];
    }
    if matches!(o, op::DIV | op::MOD) {
        // Mostly safe divisors: a register or-ed with 1, or a non-zero constant.
        if r.below(4) == 0 {
            let s = r.pick(&REGS);
            return vec![insn(class | o | op::X, d, s, 0, 0)];
        }
        if r.below(2) == 0 {
            let s = r.pick(&REGS);
            return vec![alu64_imm(op::OR, s, 1), insn(class | o | op::X, d, s, 0, 0)];
        }
        return vec![insn(class | o | op::K, d, 0, 0, 1 + r.below(1000) as i32)];
    }
    if r.below(2) == 0 {
        let s = r.pick(&REGS);
        vec![insn(class | o | op::X, d, s, 0, 0)]
    } else {
        let imm = match r.below(4) {
            0 => r.next() as i32,
            1 => r.below(64) as i32,
            2 => -(r.below(64) as i32),
            _ => 1 << r.below(31),
        };
        vec![insn(class | o | op::K, d, 0, 0, imm)]
    }
}

fn lookup(r: &mut Rng) -> Vec<Insn> {
    let k = r.pick(&REGS);
    let map = r.below(2) as i32;
    let mut v = vec![
        mov64_reg(1, k),
        alu64_imm(op::AND, 1, if r.below(8) == 0 { 7 } else { 3 }),
        stx(op::W, 10, -4, 1),
        mov64_reg(2, 10),
        alu64_imm(op::ADD, 2, -4),
        insn(op::LDDW, 1, op::PSEUDO_MAP_FD, 0, map),
        insn(0, 0, 0, 0, 0),
    ];
    if map == 1 && r.below(2) == 0 {
        // Insert first (hash): value from the stack.
        let s = r.pick(&REGS);
        v.splice(
            5..5,
            [
                stx(op::DW, 10, -24, s),
                stx(op::DW, 10, -16, s),
                mov64_reg(3, 10),
                alu64_imm(op::ADD, 3, -24),
                mov64_imm(4, r.below(3) as i32),
                insn(op::LDDW, 1, op::PSEUDO_MAP_FD, 0, 1),
                insn(0, 0, 0, 0, 0),
                call(2),
                mov64_reg(2, 10),
                alu64_imm(op::ADD, 2, -4),
            ],
        );
    }
    v.push(call(1));
    let body_len = 1 + r.below(3) as usize;
    let mut body = vec![];
    for _ in 0..body_len {
        let off = if r.below(10) == 0 {
            16
        } else {
            r.pick(&[0i16, 8])
        };
        let s = r.pick(&[7u8, 8, 9]);
        body.push(match r.below(4) {
            0 => ldx(op::DW, s, 0, off),
            1 => stx(op::DW, 0, off, s),
            2 => atomic(op::DW, op::ATOMIC_ADD, 0, off, s),
            _ => atomic(op::DW, op::ATOMIC_ADD | op::FETCH, 0, off, s),
        });
    }
    let null_check = r.below(12) != 0;
    if null_check {
        v.push(jmp_imm(op::JEQ, 0, 0, body.len() as i16));
    }
    v.extend(body);
    // r1-r5 are dead after the call: give the ones the generator uses new values.
    v.push(mov64_imm(2, r.next() as i32));
    v.push(mov64_imm(3, r.below(100) as i32));
    v.push(mov64_imm(4, r.below(70) as i32));
    v.push(mov64_imm(5, r.next() as i32));
    v.push(mov64_imm(0, 0));
    v
}

fn block(r: &mut Rng, tuner: bool) -> Block {
    let d = r.pick(&REGS);
    Block::Plain(match r.below(12) {
        0..=3 => alu(r, d),
        4 if tuner => {
            let (off, size) = r.pick(&TUNER_READ);
            vec![ldx(size, d, 6, off)]
        }
        4 => vec![ldx(op::DW, d, 6, r.pick(&[0i16, 8, 16, 40]))],
        5 => {
            let k = 1 + r.below(6) as i16;
            if r.below(2) == 0 {
                vec![stx(op::DW, 10, -8 * k - 8, d)]
            } else {
                vec![
                    stx(op::DW, 10, -8 * k - 8, d),
                    ldx(op::DW, r.pick(&REGS), 10, -8 * k - 8),
                ]
            }
        }
        6 => lookup(r),
        7 if tuner => vec![stx(op::W, 6, r.pick(&TUNER_WRITE), d)],
        8 => {
            // A counted loop: c = 0; body; c += 1; if c < K goto body.
            let c = r.pick(&[7u8, 8, 9]);
            let mut body = vec![];
            for _ in 0..1 + r.below(3) {
                let t = r.pick(&[0u8, 2, 3]);
                body.extend(alu(r, t));
            }
            let n = body.len() as i16;
            let mut v = vec![mov64_imm(c, 0)];
            v.extend(body);
            v.push(alu64_imm(op::ADD, c, 1));
            v.push(jmp_imm(op::JLT, c, 1 + r.below(20) as i32, -(n + 2)));
            v
        }
        _ => return Block::Jump(cond(r), 0),
    })
}

fn cond(r: &mut Rng) -> Insn {
    let o = r.pick(&[
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
    let class = if r.below(3) == 0 { op::JMP32 } else { op::JMP };
    let d = r.pick(&REGS);
    if r.below(2) == 0 {
        insn(class | o | op::X, d, r.pick(&REGS), 0, 0)
    } else {
        insn(class | o | op::K, d, 0, 0, r.below(200) as i32 - 50)
    }
}

/// A random program for `section` ("tuner" or a net hook).
pub fn program(seed: u64, section: &str) -> Object {
    let mut r = Rng(seed);
    let tuner = section == "tuner";
    let mut blocks = vec![Block::Plain(vec![mov64_reg(6, 1)])];
    for &reg in &REGS {
        let init = if r.below(3) == 0 {
            ldx(op::DW, reg, 1, if tuner { 0 } else { 8 })
        } else {
            mov64_imm(reg, r.below(1 << 20) as i32)
        };
        blocks.push(Block::Plain(vec![init]));
    }
    let n = 2 + r.below(14) as usize;
    for _ in 0..n {
        let mut b = block(&mut r, tuner);
        if let Block::Jump(_, t) = &mut b {
            *t = blocks.len() + 1 + r.below(3) as usize;
        }
        blocks.push(b);
    }
    let ret = r.pick(&REGS);
    blocks.push(Block::Plain(vec![mov64_reg(0, ret), exit()]));
    // Lay out, resolving jumps to block starts (clamped to the final block).
    let mut starts = vec![];
    let mut pos = 0usize;
    for b in &blocks {
        starts.push(pos);
        pos += match b {
            Block::Plain(v) => v.len(),
            Block::Jump(..) => 1,
        };
    }
    let last = blocks.len() - 1;
    let mut insns = vec![];
    for (k, b) in blocks.iter().enumerate() {
        match b {
            Block::Plain(v) => insns.extend_from_slice(v),
            Block::Jump(j, t) => {
                let t = starts[(*t).min(last)];
                let mut j = *j;
                j.off = (t as i64 - starts[k] as i64 - 1) as i16;
                insns.push(j);
            }
        }
    }
    Object {
        programs: vec![Program {
            name: "gen".into(),
            section: section.into(),
            insns,
            lines: vec![],
        }],
        maps: maps(),
    }
}
