//! Second adversarial review of the locality rule (hand-made bytecode).
//!
//! * `hole_*`: programs whose decision depends on a rank-local value; each asserts REJECTED
//!   with `rank_local` (a failing one is a soundness bug).
//! * `precision_*`: programs whose decision is agreed; each asserts ACCEPTED.
//! * `rejected_*` / `accepted_*`: attacks (and near-misses) the rule already handles.

use policy_object::insn::build::{
    alu64_imm, alu64_reg, atomic, call_local, exit, gotol, ja, jmp_imm, jmp_reg, jmp32_imm,
    ld_map_value, ldx, mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{ADD, AND, ATOMIC_ADD, B, DW, FETCH, JEQ, JGT, JLT, JNE, JSET, W, XOR};

mod locality_common;
use locality_common::*;

// =========================================================================================
// Attacks the rule handles
// =========================================================================================

/// A subprogram called inside the caller's rank-local region writes the decision through the
/// context pointer it was passed: `st.control()` sees the caller's region in the callee.
#[test]
fn rejected_callee_writes_the_decision_inside_the_callers_region() {
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5
        jmp_imm(JGT, 1, 5, 2), // 6 -> 9
        mov64_reg(1, 9),       // 7
        call_local(2),         // 8 -> 11
        mov64_imm(0, 0),       // 9
        exit(),                // 10
        st(W, 1, 40, 1),       // 11: callee
        mov64_imm(0, 0),       // 12
        exit(),                // 13
    ]);
    rejects("callee decision in caller region", &p, "rank_local");
}

/// The callee returns early on a rank-local value, before storing into the caller's slot
/// through the pointer it was given; the caller decides from that slot.
#[test]
fn rejected_callee_early_return_skips_a_store_to_the_callers_stack() {
    let mut p = program(&[
        st(DW, 10, -8, 0),     // 5
        mov64_reg(1, 10),      // 6
        alu64_imm(ADD, 1, -8), // 7
        call_local(4),         // 8 -> 13
        ldx(DW, 2, 10, -8),    // 9
        stx(W, 9, 40, 2),      // 10
        mov64_imm(0, 0),       // 11
        exit(),                // 12
    ]);
    p.extend(ld_map_value(3, BSS, 0)); // 13, 14
    p.extend([
        ldx(B, 2, 3, 0),       // 15
        jmp_imm(JGT, 2, 5, 3), // 16 -> 20 (early return: no post-dominator)
        st(DW, 1, 0, 1),       // 17
        mov64_imm(0, 0),       // 18
        exit(),                // 19
        mov64_imm(0, 0),       // 20
        exit(),                // 21
    ]);
    rejects("callee early return", &p, "rank_local");
}

/// MayWrite's `any_stack`: the store's base is the context at the branch, but the region
/// reassigns it by filling a spilled stack pointer (an LDX: counted as a register write).
#[test]
fn rejected_store_base_refilled_from_a_spilled_stack_pointer() {
    let p = program(&[
        st(DW, 10, -8, 0),     // 5
        mov64_reg(2, 10),      // 6
        alu64_imm(ADD, 2, -8), // 7
        stx(DW, 10, -16, 2),   // 8: spill &fp-8
        mov64_reg(2, 9),       // 9: r2 = ctx at the branch
        ldx(B, 1, 6, 0),       // 10
        jmp_imm(JGT, 1, 5, 2), // 11 -> 14
        ldx(DW, 2, 10, -16),   // 12: r2 = &fp-8
        st(DW, 2, 0, 1),       // 13
        ldx(DW, 3, 10, -8),    // 14
        stx(W, 9, 40, 3),      // 15
        mov64_imm(0, 0),       // 16
        exit(),                // 17
    ]);
    rejects("refilled base", &p, "rank_local");
}

/// The same with the base reassigned by an atomic fetch (it becomes a scalar: the store
/// through it is refused for what it is, not for locality).
#[test]
fn rejected_store_base_clobbered_by_an_atomic_fetch() {
    let p = program(&[
        st(DW, 10, -8, 0),                       // 5
        mov64_reg(2, 6),                         // 6: r2 = &.bss
        ldx(B, 1, 6, 0),                         // 7
        jmp_imm(JGT, 1, 5, 2),                   // 8 -> 11
        atomic(DW, ATOMIC_ADD | FETCH, 6, 8, 2), // 9: r2 = old .bss[8] -- a pointer operand
        st(DW, 2, 0, 1),                         // 10
        mov64_imm(0, 0),                         // 11
        exit(),                                  // 12
    ]);
    // An atomic with a pointer operand is a pointer leak.
    rejects("atomic fetch base", &p, "pointer_leak");
}

/// A loop's back edge jumps into the middle of a region after its post-dominator: the first
/// pass through the region's code is tainted, the pass the back edge makes is not (and need
/// not be: every rank makes it). Here the back edge is never taken, so `r2` differs.
#[test]
fn rejected_back_edge_into_the_region_not_taken() {
    let p = program(&[
        mov64_imm(2, 0),        // 5
        mov64_imm(5, 0),        // 6
        ldx(B, 1, 6, 0),        // 7
        jmp_imm(JGT, 1, 5, 1),  // 8 -> 10
        mov64_imm(2, 1),        // 9
        alu64_imm(ADD, 5, 1),   // 10 (post-dominator of 8)
        jmp_imm(JLT, 5, 1, -3), // 11 -> 9
        stx(W, 9, 48, 2),       // 12
        mov64_imm(0, 0),        // 13
        exit(),                 // 14
    ]);
    rejects("back edge into region, not taken", &p, "rank_local");
}

/// `gotol` (JMP32 JA) inside a region, and a 32-bit rank-local compare.
#[test]
fn rejected_gotol_and_jmp32_region() {
    let p = program(&[
        ldx(DW, 1, 6, 0),        // 5
        jmp32_imm(JGT, 1, 5, 2), // 6 -> 9
        st(W, 9, 40, 1),         // 7
        gotol(0),                // 8
        mov64_imm(0, 0),         // 9
        exit(),                  // 10
    ]);
    rejects("gotol region", &p, "rank_local");
    // gotol as the arm's jump over the increment, in an agreed loop.
    let p = program(&[
        mov64_imm(2, 0),         // 5
        mov64_imm(5, 0),         // 6
        ldx(DW, 1, 6, 0),        // 7
        jmp32_imm(JGT, 1, 5, 1), // 8 -> 10
        gotol(1),                // 9 -> 11
        alu64_imm(ADD, 2, 1),    // 10
        alu64_imm(ADD, 5, 1),    // 11 (post-dominator of 8)
        jmp_imm(JLT, 5, 3, -5),  // 12 -> 8
        stx(W, 9, 48, 2),        // 13
        mov64_imm(0, 0),         // 14
        exit(),                  // 15
    ]);
    rejects("gotol loop", &p, "rank_local");
}

/// `tuner/init`: a constant far into the large context written under a rank-local branch.
#[test]
fn rejected_tuner_init_last_constant_under_a_region() {
    let p = program(&[
        ldx(DW, 1, 6, 0),      // 5
        jmp_imm(JGT, 1, 5, 2), // 6 -> 9
        st(DW, 9, 1176, 1),    // 7: the last per_ch_max_nvls_tree_bws entry
        ja(0),                 // 8
        mov64_imm(0, 0),       // 9
        exit(),                // 10
    ]);
    rejects_in("tuner/init", "init region", &p, "rank_local");
    // Through a callee, with the context pointer moved to the entry first.
    let p = program(&[
        ldx(DW, 1, 6, 0),        // 5
        mov64_reg(2, 9),         // 6
        alu64_imm(ADD, 2, 1176), // 7
        jmp_imm(JGT, 1, 5, 2),   // 8 -> 11
        mov64_reg(1, 2),         // 9
        call_local(2),           // 10 -> 13
        mov64_imm(0, 0),         // 11
        exit(),                  // 12
        st(DW, 1, 0, 7),         // 13
        mov64_imm(0, 0),         // 14
        exit(),                  // 15
    ]);
    rejects_in("tuner/init", "init region through callee", &p, "rank_local");
}

/// Pruning: the decision store at 7 is first verified without a region (agreed path); the
/// same instruction is then reached inside a rank-local region that never closes (two exits).
/// `regions_cover` keeps the second state from being pruned.
#[test]
fn rejected_pruning_a_region_state_against_a_regionless_one() {
    let p = program(&[
        ldx(W, 3, 9, 16),      // 5: coll_type (agreed)
        jmp_imm(JNE, 3, 0, 3), // 6 -> 10
        st(W, 9, 40, 1),       // 7 (prune point)
        mov64_imm(0, 0),       // 8
        exit(),                // 9
        ldx(B, 1, 6, 0),       // 10
        jmp_imm(JGT, 1, 5, 1), // 11 -> 13
        ja(-6),                // 12 -> 7
        mov64_imm(0, 0),       // 13
        exit(),                // 14
    ]);
    rejects("pruned into a region", &p, "rank_local");
}

/// Pointers into `.bss` compared, one moved by a rank-local offset.
#[test]
fn rejected_map_value_pointer_comparison() {
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5
        alu64_imm(AND, 1, 8),  // 6
        mov64_reg(2, 6),       // 7
        alu64_reg(ADD, 2, 1),  // 8
        jmp_reg(JEQ, 2, 6, 2), // 9 -> 12
        st(W, 9, 40, 1),       // 10
        ja(0),                 // 11
        mov64_imm(0, 0),       // 12
        exit(),                // 13
    ]);
    rejects("map value pointer compare", &p, "rank_local");
}

/// A region inside a region with the same post-dominator, the inner one on a different
/// rank-local value, each arm writing a different register; the decision from the inner's.
#[test]
fn rejected_nested_regions_same_end() {
    let p = program(&[
        mov64_imm(2, 0),       // 5
        mov64_imm(3, 0),       // 6
        ldx(B, 1, 6, 0),       // 7
        ldx(B, 4, 6, 1),       // 8
        jmp_imm(JGT, 1, 5, 3), // 9 -> 13
        jmp_imm(JGT, 4, 5, 1), // 10 -> 12
        mov64_imm(3, 1),       // 11
        ja(0),                 // 12
        stx(W, 9, 40, 3),      // 13
        mov64_imm(0, 0),       // 14
        exit(),                // 15
    ]);
    rejects("nested same end", &p, "rank_local");
}

// =========================================================================================
// Precision
// =========================================================================================

/// A back edge into a region's arm that every rank takes: the store there runs on every
/// rank after the region closed, so `r2 == 1` everywhere. Accepted (the rule does not taint
/// the second pass).
#[test]
fn precision_back_edge_into_the_region_taken_by_every_rank() {
    let p = program(&[
        mov64_imm(2, 0),        // 5
        mov64_imm(5, 0),        // 6
        ldx(B, 1, 6, 0),        // 7
        jmp_imm(JGT, 1, 5, 1),  // 8 -> 10
        mov64_imm(2, 1),        // 9
        alu64_imm(ADD, 5, 1),   // 10
        jmp_imm(JLT, 5, 2, -3), // 11 -> 9
        stx(W, 9, 48, 2),       // 12
        mov64_imm(0, 0),        // 13
        exit(),                 // 14
    ]);
    accepts("back edge taken by every rank", &p);
}

/// Linked ids: `r2 = r1` (agreed msg_size); a region may overwrite r2; a branch on the
/// (tainted) r2 refines the untainted r1 through the shared id; a later branch on r1 alone
/// decides. The decision depends on r1 only.
#[test]
fn precision_untainted_copy_refined_through_a_tainted_one() {
    let p = program(&[
        ldx(DW, 1, 9, 0),      // 5: msg_size
        mov64_reg(2, 1),       // 6: linked
        ldx(B, 3, 6, 0),       // 7
        jmp_imm(JGT, 3, 5, 1), // 8 -> 10
        mov64_imm(2, 100),     // 9
        jmp_imm(JGT, 2, 5, 1), // 10 -> 12 (tainted r2: region to 12)
        ja(0),                 // 11
        jmp_imm(JGT, 1, 5, 1), // 12 -> 14 (r1: agreed)
        st(W, 9, 40, 1),       // 13
        mov64_imm(0, 0),       // 14
        exit(),                // 15
    ]);
    accepts("linked copy", &p);
}

/// `r1 ^= r1` zeroes a rank-local value; the taint stays.
#[test]
fn conservative_xor_self_keeps_the_taint() {
    let p = program(&[
        ldx(DW, 1, 6, 0),     // 5
        alu64_reg(XOR, 1, 1), // 6
        stx(W, 9, 40, 1),     // 7
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("xor self", &p, "rank_local");
}

/// JSET of two stack pointers: the verifier allows it (one object) and explores both edges
/// with the test on the addresses' bits as agreed. Noted: the outcome is a function of the
/// stack's address, not of the offsets.
#[test]
fn rejected_jset_of_two_stack_pointers() {
    let p = program(&[
        mov64_reg(2, 10),       // 5
        alu64_imm(ADD, 2, -8),  // 6
        mov64_reg(3, 10),       // 7
        alu64_imm(ADD, 3, -16), // 8
        jmp_reg(JSET, 2, 3, 2), // 9 -> 12
        st(W, 9, 40, 1),        // 10
        ja(0),                  // 11
        mov64_imm(0, 0),        // 12
        exit(),                 // 13
    ]);
    // A bit test reads the addresses themselves (rank-local, and a leak of where the stack
    // lies): refused for pointers in every hook.
    for hook in ["tuner", "net/complete"] {
        let v = verdict(hook, &p).unwrap_err();
        assert_eq!(v.0, "pointer_arithmetic", "{hook}: {}", v.2);
    }
}

/// The same subprogram (it writes the decision through the context pointer it is given)
/// called first outside any region, then inside a rank-local one: the second call's entry
/// state is not pruned against the first's (the caller's region is not covered).
#[test]
fn rejected_second_call_inside_a_region_not_pruned_at_the_entry() {
    let p = program(&[
        mov64_reg(1, 9),       // 5
        call_local(7),         // 6 -> 14
        ldx(B, 1, 6, 0),       // 7
        jmp_imm(JGT, 1, 5, 2), // 8 -> 11
        mov64_reg(1, 9),       // 9
        call_local(3),         // 10 -> 14
        mov64_imm(0, 0),       // 11
        exit(),                // 12
        ja(-1),                // 13 (unreached filler) -> 13
        st(W, 1, 40, 1),       // 14: callee
        mov64_imm(0, 0),       // 15
        exit(),                // 16
    ]);
    rejects("second call in region", &p, "rank_local");
}
