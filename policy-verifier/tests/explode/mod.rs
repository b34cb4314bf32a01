//! Programs built to make the verifier keep as many states, as large, for as long as it can
//! (the state-explosion generator of tests/explosion.rs).
//!
//! A program is a chain of `depth` BPF-to-BPF calls; every frame writes `slots` of its stack
//! slots before it calls the next, so each stored state carries full stacks. The deepest
//! frame runs a loop of `iters` iterations (or straight code when `iters` is 0) whose body is
//! `items` pieces, each followed by a pruning point, of these kinds:
//!
//! * a no-op jump (a pruning point where only the loop counter differs between iterations);
//! * a diamond on one bit of an unknown value that adds to an accumulator whose value decides
//!   a later branch (so states never prune: the paths double at each one);
//! * a store of the counter into one of the frame's own stack slots (a fresh stack per state);
//! * a store of the accumulator through a pointer into an ancestor's stack (a fresh stack of
//!   another frame per state).
//!
//! The loop counter decides the loop's back edge, so it is precise: each iteration's states
//! differ from the last's at every pruning point of the body, and every point fills up to the
//! per-point limit from a single path. The counter and accumulator are tested after the loop,
//! and the accumulator is returned up the chain, where every frame reads its slots back.
// Each test file uses part of it.
#![allow(dead_code)]

use policy_object::insn::build::{
    alu64_imm, alu64_reg, call_local, exit, ja, jmp_imm, ldx, mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{self as op, Insn};
use std::fmt;

/// What a generated program is made of (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `net/isend` (an observing hook) or `tuner` (a deciding one: locality flow too).
    pub hook: &'static str,
    /// Call frames, 1 ..= 8.
    pub depth: usize,
    /// Stack slots each frame writes, 0 ..= 63 (slot 63, fp-8, is left for the pointer that
    /// the next frame scribbles through).
    pub slots: usize,
    /// Loop iterations of the deepest frame's body; 0: the body runs once, straight.
    pub iters: i32,
    /// Pieces in the body.
    pub items: usize,
    /// The mix of pieces: weights of (no-op, diamond, own-stack store, ancestor store).
    pub mix: [u8; 4],
    /// The loop is the outermost frame's, around the call chain, and the deepest body runs
    /// once per iteration: states then differ only in the outermost frame, so every
    /// comparison of two looks at every frame.
    pub outer: bool,
}

pub const HOOKS: [&str; 2] = ["net/isend", "tuner"];

/// Instructions left to the body: the program must stay under the verifier's 4096.
const MAX_INSNS: usize = 4000;

impl Shape {
    /// A random shape, biased towards the expensive ends of every range.
    pub fn from_seed(seed: u64) -> Shape {
        let mut r = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        let pick = |r: &mut Rng, lo: u64, hi: u64| lo + r.next() % (hi - lo + 1);
        let depth = if r.next().is_multiple_of(2) {
            8
        } else {
            pick(&mut r, 1, 8) as usize
        };
        let slots = if r.next().is_multiple_of(2) {
            63
        } else {
            pick(&mut r, 0, 63) as usize
        };
        let iters = match r.next() % 4 {
            0 => 0,
            1 => pick(&mut r, 2, 64) as i32,
            2 => pick(&mut r, 64, 200) as i32,
            _ => pick(&mut r, 200, 5000) as i32,
        };
        let items = match r.next() % 3 {
            0 => pick(&mut r, 1, 64) as usize,
            1 => pick(&mut r, 64, 512) as usize,
            _ => pick(&mut r, 512, 1200) as usize,
        };
        let mut mix = [0u8; 4];
        for m in &mut mix {
            *m = if r.next().is_multiple_of(3) {
                0
            } else {
                pick(&mut r, 1, 8) as u8
            };
        }
        if mix == [0; 4] {
            mix[0] = 1;
        }
        Shape {
            hook: HOOKS[(r.next() % 2) as usize],
            depth,
            slots,
            iters,
            items,
            mix,
            outer: r.next().is_multiple_of(3),
        }
    }

    /// `hook=net/isend,depth=8,slots=63,iters=64,items=900,mix=1.0.0.0`, as [`fmt::Display`]
    /// writes it.
    pub fn parse(s: &str) -> Option<Shape> {
        let mut sh = Shape {
            hook: HOOKS[0],
            depth: 1,
            slots: 0,
            iters: 0,
            items: 1,
            mix: [1, 0, 0, 0],
            outer: false,
        };
        for kv in s.split(',') {
            let (k, v) = kv.split_once('=')?;
            match k {
                "hook" => sh.hook = HOOKS.into_iter().find(|h| *h == v)?,
                "depth" => sh.depth = v.parse().ok()?,
                "slots" => sh.slots = v.parse().ok()?,
                "iters" => sh.iters = v.parse().ok()?,
                "items" => sh.items = v.parse().ok()?,
                "outer" => sh.outer = v == "1",
                "mix" => {
                    let w: Vec<u8> = v
                        .split('.')
                        .map(|x| x.parse().ok())
                        .collect::<Option<_>>()?;
                    sh.mix = w.try_into().ok()?;
                }
                _ => return None,
            }
        }
        Some(sh)
    }

    /// The program. Its body is cut short where it would pass [`MAX_INSNS`].
    pub fn program(&self) -> Vec<Insn> {
        let depth = self.depth.clamp(1, 8);
        let slots = self.slots.min(63);
        // Frame k's code: write the slots, pass (unknown, own fp-8, the ancestors' pointers)
        // down, call the next, read the slots back into the result, exit.
        let mut frames: Vec<Vec<Insn>> = vec![];
        let outer = self.outer && depth > 1 && self.iters > 0;
        for k in 0..depth - 1 {
            let mut f = vec![];
            let mut head = 0;
            if k == 0 && outer {
                // r6 = ctx, r9 the loop's counter; each iteration loads the unknown anew.
                f.extend([mov64_reg(6, 1), mov64_imm(9, 0)]);
                head = f.len();
                f.push(ldx(op::DW, 1, 6, 0));
            } else if k == 0 {
                // r1 = ctx: the unknown is its first 8 bytes (msg_size, conn_id).
                f.push(ldx(op::DW, 1, 1, 0));
            }
            for j in 0..slots {
                f.push(st(op::DW, 10, -8 * (j as i16 + 2), j as i32));
            }
            f.push(st(op::DW, 10, -8, 0));
            // The ancestors' pointers (r2 .. r1+k, at most 4) shift up one register, dropping
            // the oldest; r2 becomes this frame's fp-8.
            for m in (2..2 + k.min(3) as u8).rev() {
                f.push(mov64_reg(m + 1, m));
            }
            f.extend([mov64_reg(2, 10), alu64_imm(op::ADD, 2, -8)]);
            f.push(call_local(0)); // patched below
            if k == 0 && outer {
                f.push(alu64_imm(op::ADD, 9, 1));
                let back = head as i64 - (f.len() as i64 + 1);
                f.push(jmp_imm(op::JLT, 9, self.iters, back as i16));
            }
            for j in 0..slots {
                f.push(ldx(op::DW, 1, 10, -8 * (j as i16 + 2)));
                f.push(alu64_reg(op::ADD, 0, 1));
            }
            f.push(exit());
            frames.push(f);
        }
        let used: usize = frames.iter().map(Vec::len).sum();
        let iters = if outer { 0 } else { self.iters };
        frames.push(self.deepest(
            depth,
            slots,
            iters,
            MAX_INSNS.saturating_sub(used + 2 * slots),
        ));
        // Patch each call to the start of the next frame's code.
        let mut out = vec![];
        let mut starts = vec![];
        let mut at = 0;
        for f in &frames {
            starts.push(at);
            at += f.len();
        }
        for (k, f) in frames.iter().enumerate() {
            for (i, insn) in f.iter().enumerate() {
                let pc = starts[k] + i;
                if insn.code == op::JMP | op::CALL && insn.src == op::PSEUDO_CALL {
                    out.push(call_local((starts[k + 1] as i64 - pc as i64 - 1) as i32));
                } else {
                    out.push(*insn);
                }
            }
        }
        out
    }

    /// The deepest frame: r1 the unknown, r2..r5 pointers to the ancestors' fp-8 (as many as
    /// there are ancestors, up to 4).
    fn deepest(&self, depth: usize, slots: usize, iters: i32, budget: usize) -> Vec<Insn> {
        let mut f = vec![];
        let ptrs = (depth - 1).min(4) as u8;
        if depth == 1 {
            f.push(ldx(op::DW, 1, 1, 0));
        }
        for j in 0..slots {
            f.push(st(op::DW, 10, -8 * (j as i16 + 2), j as i32));
        }
        f.extend([mov64_reg(7, 1), mov64_imm(6, 0), mov64_imm(9, 0)]);
        let head = f.len();
        let total: u32 = self.mix.iter().map(|&w| u32::from(w)).sum::<u32>().max(1);
        let mut r = Rng(self.items as u64 * 31 + u64::from(total));
        // Room: the loop's back edge and the tail take 12.
        for i in 0..self.items {
            let mut w = (r.next() % u64::from(total)) as u32;
            let mut kind = 0;
            while kind < 3 && w >= u32::from(self.mix[kind]) {
                w -= u32::from(self.mix[kind]);
                kind += 1;
            }
            let piece: Vec<Insn> = match kind {
                1 => vec![
                    mov64_reg(8, 7),
                    alu64_imm(op::RSH, 8, (i % 64) as i32),
                    alu64_imm(op::AND, 8, 1),
                    jmp_imm(op::JEQ, 8, 0, 1),
                    alu64_imm(op::ADD, 6, 1 + (i % 7) as i32),
                ],
                2 if slots > 0 => vec![stx(op::DW, 10, -8 * ((i % slots) as i16 + 2), 9)],
                3 if ptrs > 0 => vec![stx(op::DW, 2 + (i as u8 % ptrs), 0, 6)],
                _ => vec![],
            };
            if f.len() + piece.len() + 1 + 12 > budget {
                break;
            }
            f.extend(piece);
            f.push(ja(0));
        }
        if iters > 0 {
            f.push(alu64_imm(op::ADD, 9, 1));
            let back = head as i64 - (f.len() as i64 + 1);
            f.push(jmp_imm(op::JLT, 9, iters, back as i16));
        }
        // The counter and the accumulator decide a branch: both are precise.
        f.extend([
            mov64_reg(0, 6),
            jmp_imm(op::JGT, 6, 1000, 1),
            alu64_reg(op::ADD, 0, 9),
        ]);
        for j in 0..slots {
            f.push(ldx(op::DW, 1, 10, -8 * (j as i16 + 2)));
            f.push(alu64_reg(op::ADD, 0, 1));
        }
        f.push(exit());
        f
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.mix;
        write!(
            f,
            "hook={},depth={},slots={},iters={},items={},mix={}.{}.{}.{},outer={}",
            self.hook,
            self.depth,
            self.slots,
            self.iters,
            self.items,
            m[0],
            m[1],
            m[2],
            m[3],
            u8::from(self.outer)
        )
    }
}

/// The shapes found worst so far (kept so that CI runs them every time).
pub fn worst_known() -> Vec<Shape> {
    [
        // Many pruning points, each filled from one path by the loop counter, 8 frames of
        // full stacks: the most states held, the largest.
        "hook=net/isend,depth=8,slots=63,iters=100,items=1200,mix=1.0.0.0",
        // The same with a fresh own stack and fresh ancestor stacks in every state.
        "hook=net/isend,depth=8,slots=63,iters=100,items=600,mix=0.0.1.1",
        // Paths that double at every diamond, in a loop: the processed-instruction budget.
        "hook=net/isend,depth=8,slots=63,iters=200,items=400,mix=1.1.1.1",
        // A deciding hook: the locality flow on top.
        "hook=tuner,depth=8,slots=63,iters=100,items=900,mix=2.1.1.1",
        // States that differ only in the outermost frame: comparisons look at every frame.
        "hook=net/isend,depth=8,slots=63,iters=100,items=1200,mix=1.0.0.0,outer=1",
        // Every piece a store into the frame's own stack: each comparison of two states
        // misses the cache on both (the most time per unit of work found: 1.8 to 2.2 s).
        "hook=net/isend,depth=5,slots=10,iters=2356,items=187,mix=0.0.4.0,outer=0",
    ]
    .into_iter()
    .map(|s| Shape::parse(s).expect("a valid shape"))
    .collect()
}

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
}
