//! Narrow spills (issue 38, part 7; hand-made bytecode): a scalar stored through `r10` in 1, 2
//! or 4 naturally aligned bytes keeps its bounds for a fill of those bytes (a loop counter
//! whose address is taken lives in such a slot), and an 8-byte spill keeps them for a narrower
//! fill of its low bytes; what overwrites, widens or merges them loses them.
//!
//! * `accepted_*`: ordinary shapes refused before;
//! * `rejected_*`: where the bounds must not survive (each would access out of bounds or
//!   loop forever if they did).

use policy_object::Insn;
use policy_object::insn::build::{
    alu32_imm, alu64_imm, alu64_reg, call, exit, ja, jmp_imm, jmp32_imm, ld_map, lddw, ldx,
    mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{ADD, B, DW, H, JEQ, JLT, W};

mod locality_common;
use locality_common::*;

#[track_caller]
fn accepts_in(section: &str, name: &str, insns: &[Insn]) {
    if let Err((_, _, text)) = verdict(section, insns) {
        panic!("{name}: rejected:\n{text}");
    }
}

#[track_caller]
fn rejects_with(section: &str, name: &str, insns: &[Insn], kind: &str) {
    match verdict(section, insns) {
        // An offset with no bounds is refused where it is added.
        Err((k, _, text)) => assert!(
            k == kind || (kind == "map_out_of_bounds" && k == "unbounded_access"),
            "{name}: want {kind}, got {k}:\n{text}"
        ),
        Ok(()) => panic!("{name}: ACCEPTED, want {kind}"),
    }
}

const HOOKS: [&str; 3] = ["tuner", "tuner/epoch", "net/isend"];

/// `for (i = 0; i < 8; i++) lookup(&agreed, &key)` with `i` kept at `fp+off` in `size` bytes
/// (the key is the 4 bytes at fp-4 or fp-8 that hold it): clang's shape for an address-taken
/// counter.
fn counter_loop(size: u8, off: i16) -> Vec<Insn> {
    let key: i16 = if off < -4 { -8 } else { -4 };
    let mut p = program(&[
        st(W, 10, key, 0),    // 5: the key's other bytes
        st(size, 10, off, 0), // 6: i = 0
    ]);
    p.extend(ld_map(1, AGREED)); // 7, 8: loop head
    p.extend([
        mov64_reg(2, 10),              // 9
        alu64_imm(ADD, 2, key.into()), // 10
        call(1),                       // 11
        ldx(size, 1, 10, off),         // 12
        alu32_imm(ADD, 1, 1),          // 13
        stx(size, 10, off, 1),         // 14
        jmp32_imm(JLT, 1, 8, -9),      // 15 -> 7
        mov64_imm(0, 0),               // 16
        exit(),                        // 17
    ]);
    p
}

#[test]
fn accepted_address_taken_loop_counter() {
    for (size, off) in [
        (W, -4),
        (W, -8),
        (H, -2),
        (H, -4),
        (B, -1),
        (B, -3),
        (B, -8),
    ] {
        for hook in HOOKS {
            accepts_in(
                hook,
                &format!("{hook}: size {size:#x} at fp{off}"),
                &counter_loop(size, off),
            );
        }
    }
}

/// The loop body also stores a byte over the counter: the fill has no bounds, the loop none
/// (found when the budget runs out: each case in one hook, to keep the test quick).
#[test]
fn rejected_counter_overwritten_in_part() {
    for ((size, off, hit), hook) in [(W, -4, -3), (H, -2, -1), (W, -8, -5)]
        .into_iter()
        .zip(HOOKS)
    {
        let mut p = counter_loop(size, off);
        p.insert(15, st(B, 10, hit, 0));
        p[16] = jmp32_imm(JLT, 1, 8, -10);
        rejects_with(
            hook,
            &format!("{hook}: byte at {hit}"),
            &p,
            "unbounded_loop",
        );
    }
}

/// A store to the slot's other bytes keeps the counter: `fp-4` counts while `fp-8` is
/// rewritten every iteration.
#[test]
fn accepted_counter_beside_a_rewritten_neighbour() {
    let mut p = counter_loop(W, -4);
    p.insert(12, st(W, 10, -8, 7));
    p[16] = jmp32_imm(JLT, 1, 8, -10);
    for hook in HOOKS {
        accepts_in(hook, &format!("{hook}: neighbour"), &p);
    }
}

/// `r1 = 0x1_0000_0005; *(u32 *)(fp-4) = r1; r2 = *(u32 *)(fp-4)`: 5 (the stored bytes), a
/// valid offset into the 64-byte `.bss`; the same from an 8-byte spill read back narrower.
#[test]
fn accepted_truncating_spill_and_narrowing_fill() {
    let shapes: [(&str, [Insn; 2]); 4] = [
        ("u32 spill", [stx(W, 10, -4, 1), ldx(W, 2, 10, -4)]),
        (
            "u64 spill, u32 fill",
            [stx(DW, 10, -8, 1), ldx(W, 2, 10, -8)],
        ),
        (
            "u64 spill, u16 fill",
            [stx(DW, 10, -8, 1), ldx(H, 2, 10, -8)],
        ),
        ("u32 spill, u8 fill", [stx(W, 10, -8, 1), ldx(B, 2, 10, -8)]),
    ];
    for (name, [spill, fill]) in shapes {
        let mut p = program(&lddw(1, 0x1_0000_0005));
        p.extend([
            spill,
            fill,
            alu64_reg(ADD, 2, 6),
            ldx(DW, 0, 2, 0),
            mov64_imm(0, 0),
            exit(),
        ]);
        for hook in HOOKS {
            accepts_in(hook, &format!("{hook}: {name}"), &p);
        }
    }
}

/// Fills the narrow spill does not cover exactly: a wider read, a read of its upper bytes,
/// a read through another pointer. Each gets a value with no useful bounds.
#[test]
fn rejected_fills_the_spill_does_not_cover() {
    let cases: [(&str, Vec<Insn>); 3] = [
        (
            "wide fill",
            vec![
                st(W, 10, -8, 5),
                st(W, 10, -4, 0x7fff_0000),
                ldx(DW, 2, 10, -8),
            ],
        ),
        (
            "upper bytes",
            vec![st(W, 10, -8, 0x7fff_0005), ldx(H, 2, 10, -6)],
        ),
        (
            "through another pointer",
            vec![st(W, 10, -8, 0x7fff), mov64_reg(3, 10), ldx(W, 2, 3, -8)],
        ),
    ];
    for (name, body) in cases {
        let mut p = program(&body);
        p.extend([
            alu64_reg(ADD, 2, 6),
            ldx(DW, 0, 2, 0),
            mov64_imm(0, 0),
            exit(),
        ]);
        for hook in HOOKS {
            rejects_with(hook, &format!("{hook}: {name}"), &p, "map_out_of_bounds");
        }
    }
}

/// Two paths spill 0 and 60 into `fp-4`, meet at a pruning point where a store rewrites the
/// slot's other half, then index `.bss` (64 bytes) with the fill: 60 + 8 is out of bounds,
/// so the path with 60 may not be pruned against the one with 0.
#[test]
fn rejected_narrow_spill_kept_precise_across_a_store_beside_it() {
    let mut p = program(&[
        ldx(B, 1, 6, 0),       // 5
        jmp_imm(JEQ, 1, 0, 2), // 6 -> 9
        st(W, 10, -4, 0),      // 7
        ja(1),                 // 8 -> 10
        st(W, 10, -4, 60),     // 9
        st(W, 10, -8, 7),      // 10: pruning point
        ldx(W, 2, 10, -4),     // 11
        alu64_reg(ADD, 2, 6),  // 12
        ldx(DW, 0, 2, 0),      // 13
        mov64_imm(0, 0),       // 14
        exit(),                // 15
    ]);
    for hook in HOOKS {
        rejects_with(hook, &format!("{hook}: pruning"), &p, "map_out_of_bounds");
    }
    // Both paths in bounds: accepted.
    p[9] = st(W, 10, -4, 56);
    for hook in HOOKS {
        accepts_in(hook, &format!("{hook}: pruning, in bounds"), &p);
    }
}

/// Two paths spill 60 and 0 into `fp-4`, meet where a register holding 0 or 60 (the other
/// way round) is stored over those 4 bytes, then index `.bss` with the fill: the stored
/// register's value matters where the half's does, so the paths may not be pruned against
/// each other even though the half's old contents no longer matter.
#[test]
fn rejected_store_over_a_precise_half_keeps_the_register_precise() {
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5
        st(W, 10, -8, 0),      // 6
        jmp_imm(JEQ, 1, 0, 3), // 7 -> 11
        st(W, 10, -4, 60),     // 8: explored first, in bounds
        mov64_imm(3, 0),       // 9
        ja(2),                 // 10 -> 13
        st(W, 10, -4, 0),      // 11
        mov64_imm(3, 60),      // 12
        stx(W, 10, -4, 3),     // 13: pruning point
        ldx(W, 2, 10, -4),     // 14
        alu64_reg(ADD, 2, 6),  // 15
        ldx(DW, 0, 2, 0),      // 16
        mov64_imm(0, 0),       // 17
        exit(),                // 18
    ]);
    for hook in HOOKS {
        rejects_with(hook, &format!("{hook}: pruning"), &p, "map_out_of_bounds");
    }
}

/// Precision per 4-byte half: ten diamonds each spill 0 or 1 into the low half of their own
/// slot (`fp-8k-8`), beside a counter in its high half (`fp-8k-4`); at the end a 4-byte store
/// rewrites each low half, then each counter is filled and used as an offset. The low halves'
/// old contents never matter, so the paths are pruned where the diamonds meet (not 2^10 of
/// them: each slot is precise only in its high half).
#[test]
fn pruned_across_a_store_over_the_other_half() {
    let mut body = Vec::new();
    for k in 0..10i16 {
        body.extend([st(W, 10, -8 * k - 4, 8), st(W, 10, -8 * k - 8, 0)]);
    }
    for k in 0..10i16 {
        body.extend([
            ldx(B, 1, 6, k),       // the byte that decides
            jmp_imm(JEQ, 1, 0, 2), // -> the second store
            st(W, 10, -8 * k - 8, 0),
            ja(1), // -> the meeting point
            st(W, 10, -8 * k - 8, 1),
        ]);
    }
    for k in 0..10i16 {
        body.push(st(W, 10, -8 * k - 8, 2)); // the low half, rewritten
    }
    for k in 0..10i16 {
        body.extend([
            ldx(W, 2, 10, -8 * k - 4),
            alu64_reg(ADD, 2, 6),
            ldx(DW, 0, 2, 0),
        ]);
    }
    body.extend([mov64_imm(0, 0), exit()]);
    let p = program(&body);
    for hook in HOOKS {
        let h = policy_verifier::platform::hook(hook).unwrap();
        let s = policy_verifier::verify_insns(&p, h, &maps(), policy_verifier::Limits::default())
            .unwrap_or_else(|e| panic!("{hook}: rejected: {e}"));
        assert!(s.processed < 1_000, "{hook}: {} processed", s.processed);
    }
}
