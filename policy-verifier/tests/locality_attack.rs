//! Adversarial review of the locality rule (hand-made bytecode).
//!
//! * `hole_*`: programs whose decision depends on a rank-local value. Each asserts the
//!   program is REJECTED with `rank_local`; a failing `hole_*` test is a soundness bug.
//! * `precision_*`: programs a reasonable policy author would write whose decision does not
//!   depend on a rank-local value. Each asserts ACCEPTED; a failing one is a precision issue.
//! * `conservative_*`: such programs the rule still refuses, on purpose or for now (each says
//!   why); they assert the refusal, so a change in either direction is noticed.
//! * `rejected_*` / `accepted_*`: attacks (and near-misses) the rule already handles.

use policy_object::insn::build::{
    alu32_imm, alu64_imm, alu64_reg, atomic, bswap, call, call_local, exit, ja, jmp_imm, jmp_reg,
    jmp32_imm, ld_map, ld_map_value, ldx, mov32_reg, mov64_imm, mov64_reg, movsx64, neg64, st, stx,
};
use policy_object::insn::{
    ADD, AND, ATOMIC_ADD, ATOMIC_CMPXCHG, B, DIV, DW, FETCH, JEQ, JGT, JLT, JNE, OR, RSH, W,
};

mod locality_common;
use locality_common::*;

// =========================================================================================
// Holes
// =========================================================================================

// --- H1: `both_or_merged` (branch.rs) runs the fall-through of a short forward jump with
// `step` only: no `flow`, no `check_decision`, no `apply_flow`, no region for the branch and
// no control taint for what it writes. When the two edges' states then merge exactly, the
// skipped block was never seen by the locality rule at all.

/// `if (bss[0] == bss[8]) ctx->algo = 1;` JNE of two unknowns refines nothing, the store
/// changes no state, so the edges' states are equal and merge: the store is never checked.
#[test]
fn hole_merge_skips_a_ctx_store_under_a_rank_local_branch() {
    let p = program(&[
        ldx(DW, 1, 6, 0),      // 5: r1 = .bss[0]
        ldx(DW, 3, 6, 8),      // 6: r3 = .bss[8]
        jmp_reg(JNE, 1, 3, 1), // 7: if r1 != r3 goto 9   (rank-local, both edges)
        st(W, 9, 40, 1),       // 8: ctx->algo = 1         never checked
        mov64_imm(0, 0),       // 9
        exit(),
    ]);
    rejects("store skipped by the merge", &p, "rank_local");
}

/// The shape clang emits for `if (*lat > 1000) ctx->algo = RING;` when the constant is
/// materialized before the branch: the two states differ only in r1 ([0,1000] vs
/// [1001,max]), whose union is exact, so they merge.
#[test]
fn hole_merge_clang_shape_threshold() {
    let p = program(&[
        ldx(DW, 1, 6, 0),         // 5: r1 = .bss[0]
        mov64_imm(2, 1),          // 6: r2 = 1
        jmp_imm(JLT, 1, 1001, 1), // 7: if r1 < 1001 goto 9
        stx(W, 9, 40, 2),         // 8: ctx->algo = r2       never checked
        mov64_imm(0, 0),          // 9
        exit(),
    ]);
    rejects("clang threshold shape", &p, "rank_local");
}

/// policies/unsafe/rank_local_branch.c as clang-19 -O2 -mcpu=v4 compiles it (the constant
/// is a `BPF_ST` store): `if (!lat) return 0; if (*lat > 1000) ctx->algo = RING;`. The
/// shipped corpus file is accepted in that build (so is rank_local_merge.c, whose skipped
/// block is `*(u32 *)(r10 -8) = 1`).
#[test]
fn hole_merge_clang19_rank_local_branch() {
    let mut body = lookup_net(); // 5..=10
    body.extend([
        jmp_imm(JEQ, 0, 0, 3),    // 11: if r0 == 0 goto 15
        ldx(DW, 1, 0, 0),         // 12: r1 = *lat
        jmp_imm(JLT, 1, 1001, 1), // 13: if r1 < 1001 goto 15   merged
        st(W, 9, 40, 1),          // 14: ctx->algo = RING       never checked
        mov64_imm(0, 0),          // 15
        exit(),                   // 16
    ]);
    rejects(
        "rank_local_branch.c, clang-19 v4",
        &program(&body),
        "rank_local",
    );
}

/// The branch is agreed, but the skipped block stores a rank-local value into the context:
/// `check_decision` never runs for it.
#[test]
fn hole_merge_skips_a_rank_local_store_under_an_agreed_branch() {
    let p = program(&[
        ldx(DW, 2, 6, 0),      // 5: r2 = .bss[0]      rank-local
        ldx(W, 3, 9, 16),      // 6: coll_type
        ldx(W, 4, 9, 20),      // 7: nranks
        jmp_reg(JNE, 3, 4, 1), // 8: agreed branch, merges
        stx(W, 9, 40, 2),      // 9: ctx->algo = r2    never checked
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("tainted store skipped by the merge", &p, "rank_local");
}

/// The skipped block loads a rank-local value: `step` alone gives it no taint, the merged
/// state holds an untainted r2, and the (checked) store after the meeting point passes.
#[test]
fn hole_merge_drops_the_taint_of_a_load_in_the_skipped_block() {
    let p = program(&[
        ldx(B, 2, 9, 16),      // 5: r2 = low byte of coll_type (agreed, [0,255])
        ldx(W, 3, 9, 20),      // 6
        ldx(W, 4, 9, 24),      // 7
        jmp_reg(JNE, 3, 4, 1), // 8: agreed branch
        ldx(B, 2, 6, 0),       // 9: r2 = .bss[0]  ([0,255], but the taint is never set)
        stx(W, 9, 44, 2),      // 10: ctx->proto = r2
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("load in the skipped block", &p, "rank_local");
}

/// The same through the stack: a partial store of a rank-local value in the skipped block
/// leaves the slot's taint as it was.
#[test]
fn hole_merge_drops_the_taint_of_a_stack_store_in_the_skipped_block() {
    let p = program(&[
        ldx(DW, 2, 6, 0),      // 5: r2 = .bss[0]
        st(W, 10, -8, 0),      // 6: plain bytes
        st(W, 10, -4, 0),      // 7
        ldx(W, 3, 9, 16),      // 8
        ldx(W, 4, 9, 20),      // 9
        jmp_reg(JNE, 3, 4, 1), // 10: agreed branch
        stx(W, 10, -8, 2),     // 11: *(u32 *)(fp-8) = r2   slot taint not updated
        ldx(W, 5, 10, -8),     // 12
        stx(W, 9, 48, 5),      // 13: ctx->nchannels = r5
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("stack store in the skipped block", &p, "rank_local");
}

/// Inside an open rank-local region, an agreed short branch merges: what its skipped block
/// writes gets no control taint, so the value survives the region untainted.
#[test]
fn hole_merge_inside_a_region_loses_the_control_taint() {
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5: r1 = .bss[0]
        mov64_imm(2, 0),       // 6: r2 = 0 (agreed)
        ldx(W, 3, 9, 16),      // 7
        ldx(W, 4, 9, 20),      // 8
        jmp_imm(JGT, 1, 5, 3), // 9: if r1 > 5 goto 13   rank-local region until 13
        jmp_reg(JNE, 3, 4, 1), // 10: agreed branch, merged: taken r2 = 0, fall r2 = 1
        mov64_imm(2, 1),       // 11: r2 = 1  (under the region, but untainted)
        mov64_imm(5, 0),       // 12
        stx(W, 9, 40, 2),      // 13: ctx->algo = r2 in [0,1]: 1 only on some ranks
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("merge inside a region", &p, "rank_local");
}

// --- H2: implicit flow through a decided branch. A constant written under a rank-local
// region carries the taint, but a later branch on it is "decided" (one edge) on each path,
// so it opens no region; the paths then write different (untainted) decisions. The rule's
// premise "a branch decided for every value does not depend on it" only holds for values
// whose abstract range covers every rank; a path-local constant or refined range does not.

/// `flag = 0; if (local > 5) flag = 1; if (!flag) ctx->algo = 1;`
#[test]
fn hole_decided_branch_on_a_constant_assigned_under_a_region() {
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5: r1 = .bss[0]
        mov64_imm(2, 0),       // 6: r2 = 0
        jmp_imm(JGT, 1, 5, 1), // 7: if r1 > 5 goto 9  (region until 9; no merge: r1, r2 differ)
        mov64_imm(2, 1),       // 8: r2 = 1  tainted on this path
        jmp_imm(JNE, 2, 0, 1), // 9: decided on each path (r2 is 0 or 1): no region
        st(W, 9, 40, 1),       // 10: ctx->algo = 1  only where .bss[0] > 5
        mov64_imm(0, 0),       // 11
        exit(),                // 12
    ]);
    rejects("decided branch on a path constant", &p, "rank_local");
}

/// The same through the bounds a rank-local branch refined: after the region closes, r1 is
/// [0,5] on one path and [6,255] on the other, and the second test of r1 is decided on each.
#[test]
fn hole_decided_branch_on_bounds_refined_by_a_rank_local_branch() {
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5: r1 = .bss[0]
        jmp_imm(JGT, 1, 5, 0), // 6: if r1 > 5 goto 7  (both edges; region ends at 7 at once)
        jmp_imm(JGT, 1, 5, 2), // 7: decided on each path
        st(W, 9, 40, 1),       // 8: ctx->algo = 1
        ja(1),                 // 9
        st(W, 9, 40, 2),       // 10: ctx->algo = 2
        mov64_imm(0, 0),       // 11
        exit(),                // 12
    ]);
    rejects("decided branch on refined bounds", &p, "rank_local");
}

/// The same through a NULL check: `v = lookup(local); if (v) (*v)++; if (v) ctx->algo = 1;`
/// The first check opens a region (presence is rank-local) that ends at insn 14; there the
/// copy r8 is the scalar 0 on one path and a map value on the other, so `if r8 == 0` is
/// decided on each (`mark_ptr` turned it into a constant / a never-NULL pointer).
#[test]
fn hole_second_null_check_of_a_rank_local_lookup() {
    let mut body = lookup_net(); // 5..=10
    body.extend([
        mov64_reg(8, 0),                 // 11: r8 = r0 (same id)
        jmp_imm(JEQ, 0, 0, 2),           // 12: if r0 == 0 goto 15  (rank-local, region to 15)
        mov64_imm(1, 1),                 // 13
        atomic(DW, ATOMIC_ADD, 0, 0, 1), // 14: lock *(u64 *)r0 += 1
        jmp_imm(JEQ, 8, 0, 1),           // 15: decided on each path
        st(W, 9, 40, 1),                 // 16: ctx->algo = 1  only where the entry exists
        mov64_imm(0, 0),                 // 17
        exit(),                          // 18
    ]);
    rejects("second null check", &program(&body), "rank_local");
}

// --- H3: cmpxchg writes memory only when memory equals r0: what memory holds afterwards
// depends on r0, but `flow` stamps the slot with `join(ctrl, join(src, old))`, not r0's taint.

#[test]
fn hole_cmpxchg_comparand_is_not_a_source_of_the_memory_written() {
    let p = program(&[
        st(DW, 10, -8, 0),                     // 5: fp-8 = 0 (agreed)
        ldx(DW, 0, 6, 0),                      // 6: r0 = .bss[0]   rank-local comparand
        mov64_imm(1, 1),                       // 7
        atomic(DW, ATOMIC_CMPXCHG, 10, -8, 1), // 8: if fp-8 == r0 then fp-8 = 1
        ldx(DW, 2, 10, -8),                    // 9: 1 iff .bss[0] == 0
        stx(W, 9, 40, 2),                      // 10: ctx->algo = r2
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("cmpxchg comparand", &p, "rank_local");
}

// --- H4: implicit flow of "not written". The path that assigns under the region gets the
// taint, the path that does not keeps its old, untainted value: sound only if every use
// that matters on one path is checked on the other too. Here the register holds the
// context on one path and a stack pointer on the other, so the (allowed) tainted store
// goes to the stack and the untainted one decides.
//
// `__u32 dummy, *dst = &ctx->algo; if (local > 5) dst = &dummy; *dst = 1;`

#[test]
fn hole_pointer_swapped_under_a_region() {
    let p = program(&[
        ldx(B, 1, 6, 0),        // 5: r1 = .bss[0]
        mov64_reg(2, 9),        // 6: r2 = ctx
        jmp_imm(JGT, 1, 5, 2),  // 7: if r1 > 5 goto 10   (region until 10; no merge)
        mov64_reg(2, 10),       // 8: r2 = fp              tainted stack pointer
        alu64_imm(ADD, 2, -64), // 9: r2 = fp-64
        st(W, 2, 40, 1),        // 10: ctx->algo = 1 on one path, fp-24 = 1 on the other
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("pointer swap", &p, "rank_local");
}

// =========================================================================================
// Precision
// =========================================================================================

/// A per-rank call counter in an array map, with the usual `if (!cnt) return 0;`. Whether an
/// array lookup finds an entry depends on the key alone (agreed here), so the NULL check is
/// agreed and the decision after it stands. (The same in a hash map is rank-local: see
/// `hole_second_null_check_of_a_rank_local_lookup`.)
#[test]
fn precision_null_check_of_a_local_array_counter_covers_the_decision() {
    let mut body = lookup_net();
    body[1] = ld_map(1, COUNTS)[0];
    body[2] = ld_map(1, COUNTS)[1]; // 5..=10, in the counter array
    body.extend([
        jmp_imm(JEQ, 0, 0, 3),           // 11: if (!cnt) goto 15 (return 0)
        mov64_imm(1, 1),                 // 12
        atomic(DW, ATOMIC_ADD, 0, 0, 1), // 13: (*cnt)++
        st(W, 9, 40, 1),                 // 14: ctx->algo = RING (agreed)
        mov64_imm(0, 0),                 // 15
        exit(),                          // 16
    ]);
    accepts("array counter then decision", &program(&body));
}

/// clang combines two adjacent 4-byte context loads into one 8-byte load at 32 when both
/// fields are used (say reg_buff is logged into .bss); the load is tainted as a whole, so
/// max_channels taken from its high half is rank-local too. Kept: taint is per register, not
/// per bit, and the fix (load the fields apart) is the author's.
#[test]
fn conservative_combined_load_taints_max_channels() {
    let p = program(&[
        ldx(DW, 2, 9, 32),     // 5: reg_buff | max_channels << 32
        stx(W, 6, 0, 2),       // 6: .bss[0] = reg_buff (bookkeeping)
        alu64_imm(RSH, 2, 32), // 7: r2 = max_channels
        stx(W, 9, 48, 2),      // 8: ctx->nchannels = max_channels
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("combined ctx load", &p, "rank_local");
}

/// Both arms of a rank-local branch set the same register to the (agreed) context pointer;
/// the copies are tainted by control, so the store through it after the meeting point is
/// refused. Kept: the region taints what its code may write, whatever it writes.
#[test]
fn conservative_same_pointer_assigned_on_both_arms() {
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5
        jmp_imm(JGT, 1, 5, 3), // 6: if r1 > 5 goto 10
        mov64_reg(2, 9),       // 7: r2 = ctx
        st(DW, 6, 8, 1),       // 8: .bss[8] = 1 (bookkeeping)
        ja(2),                 // 9: goto 12
        mov64_reg(2, 9),       // 10: r2 = ctx
        st(DW, 6, 8, 2),       // 11: .bss[8] = 2
        st(W, 2, 40, 1),       // 12: ctx->algo = 1
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("same pointer on both arms", &p, "rank_local");
}

// =========================================================================================
// Attacks the rule handles (these pass)
// =========================================================================================

#[test]
fn rejected_reg_buff_through_wide_narrow_and_moved_loads() {
    // 8 bytes at 32: reg_buff and max_channels.
    let p = program(&[ldx(DW, 2, 9, 32), stx(W, 9, 48, 2), mov64_imm(0, 0), exit()]);
    rejects("8-byte load at 32", &p, "rank_local");
    // The last byte of reg_buff alone.
    let p = program(&[ldx(B, 2, 9, 35), stx(W, 9, 48, 2), mov64_imm(0, 0), exit()]);
    rejects("1-byte load at 35", &p, "rank_local");
    // Through a moved context pointer: (ctx + 36) - 4.
    let p = program(&[
        mov64_reg(3, 9),
        alu64_imm(ADD, 3, 36),
        ldx(W, 2, 3, -4),
        stx(W, 9, 48, 2),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("moved ctx pointer", &p, "rank_local");
}

#[test]
fn rejected_alu_forms_keep_the_taint() {
    // movsx, mov32, bswap64, neg, 32-bit and with 0 ... all keep it.
    let p = program(&[
        ldx(DW, 1, 6, 0),
        movsx64(2, 1, 8),
        mov32_reg(3, 2),
        bswap(3, 64),
        neg64(3),
        alu32_imm(AND, 3, 0),
        stx(W, 9, 40, 3),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("alu chain", &p, "rank_local");
    // Division by a rank-local (non-zero) divisor.
    let p = program(&[
        ldx(B, 1, 6, 0),
        alu64_imm(OR, 1, 1),
        mov64_imm(2, 64),
        alu64_reg(DIV, 2, 1),
        stx(W, 9, 48, 2),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("division", &p, "rank_local");
}

#[test]
fn rejected_atomics_returning_rank_local_memory() {
    // cmpxchg returns the old (rank-local) slot in r0.
    let p = program(&[
        ldx(DW, 1, 6, 0),
        stx(DW, 10, -8, 1),
        mov64_imm(0, 0),
        mov64_imm(2, 1),
        atomic(DW, ATOMIC_CMPXCHG, 10, -8, 2),
        stx(W, 9, 40, 0),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("cmpxchg r0", &p, "rank_local");
    // fetch_add returns it in src.
    let p = program(&[
        ldx(DW, 1, 6, 0),
        stx(DW, 10, -8, 1),
        mov64_imm(2, 1),
        atomic(DW, ATOMIC_ADD | FETCH, 10, -8, 2),
        stx(W, 9, 40, 2),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("fetch_add", &p, "rank_local");
}

#[test]
fn rejected_variable_offset_stack_accesses() {
    // A store at a rank-local offset taints every slot it may hit.
    let p = program(&[
        st(DW, 10, -8, 0),
        st(DW, 10, -16, 0),
        ldx(B, 1, 6, 0),
        alu64_imm(AND, 1, 8),
        mov64_reg(2, 10),
        alu64_imm(ADD, 2, -16),
        alu64_reg(ADD, 2, 1),
        st(DW, 2, 0, 7), // agreed value, rank-local place
        ldx(DW, 3, 10, -8),
        stx(W, 9, 40, 3),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("var-offset store", &p, "rank_local");
    // A read at an agreed variable offset over a range holding one tainted slot.
    let p = program(&[
        st(DW, 10, -8, 0),
        ldx(DW, 1, 6, 0),
        stx(DW, 10, -16, 1),
        ldx(B, 4, 9, 16),
        alu64_imm(AND, 4, 8),
        mov64_reg(2, 10),
        alu64_imm(ADD, 2, -16),
        alu64_reg(ADD, 2, 4),
        ldx(DW, 3, 2, 0),
        stx(W, 9, 40, 3),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("var-offset read", &p, "rank_local");
}

#[test]
fn rejected_callee_writing_the_callers_stack_at_a_rank_local_offset() {
    let p = program(&[
        st(DW, 10, -8, 0),          // 5
        st(DW, 10, -16, 0),         // 6
        mov64_reg(1, 10),           // 7
        alu64_imm(ADD, 1, -16),     // 8
        call_local(4),              // 9: f (14)
        ldx(DW, 2, 10, -8),         // 10
        stx(W, 9, 40, 2),           // 11
        mov64_imm(0, 0),            // 12
        exit(),                     // 13
        ld_map_value(3, BSS, 0)[0], // 14
        ld_map_value(3, BSS, 0)[1], // 15
        ldx(B, 4, 3, 0),            // 16
        alu64_imm(AND, 4, 8),       // 17
        alu64_reg(ADD, 1, 4),       // 18: fp-16 or fp-8 of the caller
        st(DW, 1, 0, 7),            // 19
        mov64_imm(0, 0),            // 20
        exit(),                     // 21
    ]);
    rejects("callee var-offset store", &p, "rank_local");
}

#[test]
fn rejected_callee_branching_on_a_rank_local_value() {
    let p = program(&[
        call_local(3),              // 5: f (9)
        stx(W, 9, 44, 0),           // 6: ctx->proto = f()
        mov64_imm(0, 0),            // 7
        exit(),                     // 8
        ld_map_value(3, BSS, 0)[0], // 9
        ld_map_value(3, BSS, 0)[1], // 10
        ldx(B, 4, 3, 0),            // 11
        mov64_imm(0, 1),            // 12
        jmp_imm(JGT, 4, 5, 1),      // 13
        mov64_imm(0, 2),            // 14
        exit(),                     // 15
    ]);
    rejects("callee branch", &p, "rank_local");
}

#[test]
fn rejected_map_helpers() {
    // A rank-local buffer copied into a config map: a write to a config map.
    let p = program(&[
        st(W, 10, -4, 0),       // 5: key
        ldx(DW, 1, 6, 0),       // 6
        stx(DW, 10, -16, 1),    // 7: value (rank-local)
        ld_map(1, CFG)[0],      // 8
        ld_map(1, CFG)[1],      // 9
        mov64_reg(2, 10),       // 10
        alu64_imm(ADD, 2, -4),  // 11
        mov64_reg(3, 10),       // 12
        alu64_imm(ADD, 3, -16), // 13
        mov64_imm(4, 0),        // 14
        call(2),                // 15: update
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("update of a config map", &p, "map_read_only");
    // Into a local map and back: still rank-local (the lookup result is, whatever it holds).
    let p = program(&[
        st(W, 10, -4, 0),       // 5
        st(DW, 10, -16, 3),     // 6: an agreed value
        ld_map(1, NET)[0],      // 7
        ld_map(1, NET)[1],      // 8
        mov64_reg(2, 10),       // 9
        alu64_imm(ADD, 2, -4),  // 10
        mov64_reg(3, 10),       // 11
        alu64_imm(ADD, 3, -16), // 12
        mov64_imm(4, 0),        // 13
        call(2),                // 14
        ld_map(1, NET)[0],      // 15
        ld_map(1, NET)[1],      // 16
        mov64_reg(2, 10),       // 17
        alu64_imm(ADD, 2, -4),  // 18
        call(1),                // 19
        jmp_imm(JEQ, 0, 0, 3),  // 20
        ldx(DW, 3, 0, 0),       // 21
        stx(W, 9, 40, 3),       // 22
        ja(0),                  // 23
        mov64_imm(0, 0),        // 24
        exit(),                 // 25
    ]);
    rejects("round trip through a local map", &p, "rank_local");
    // The key of an agreed lookup read from .bss: the result (and its presence) is rank-local.
    let p = program(&[
        ld_map(1, AGREED)[0],  // 5
        ld_map(1, AGREED)[1],  // 6
        mov64_reg(2, 6),       // 7: key = &.bss[0]
        call(1),               // 8
        jmp_imm(JEQ, 0, 0, 3), // 9
        ldx(W, 3, 0, 0),       // 10: an agreed map's value
        stx(W, 9, 40, 3),      // 11
        ja(0),                 // 12
        mov64_imm(0, 0),       // 13
        exit(),                // 14
    ]);
    rejects("agreed lookup with a local key", &p, "rank_local");
}

#[test]
fn rejected_decision_writes_and_reads() {
    // Written agreed, then written again rank-local.
    let p = program(&[
        st(W, 9, 40, 1),
        ldx(DW, 1, 6, 0),
        stx(W, 9, 40, 1),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("second write", &p, "rank_local");
    // A decision read back after an agreed write is agreed.
    let p = program(&[
        st(W, 9, 40, 1),
        ldx(W, 2, 9, 40),
        stx(W, 9, 44, 2),
        mov64_imm(0, 0),
        exit(),
    ]);
    accepts("read back", &p);
    // A rank-local constant offset into the context (`ctx + (local & 0)`).
    let p = program(&[
        ldx(DW, 1, 6, 0),
        alu64_imm(AND, 1, 0),
        mov64_reg(2, 9),
        alu64_reg(ADD, 2, 1),
        st(W, 2, 40, 1),
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("tainted ctx pointer", &p, "rank_local");
}

#[test]
fn rejected_control_dependence_shapes() {
    // Two rank-local branches sharing a post-dominator (the region is deduplicated).
    let p = program(&[
        ldx(B, 1, 6, 0),       // 5
        ldx(B, 3, 6, 1),       // 6
        mov64_imm(2, 0),       // 7
        jmp_imm(JGT, 1, 5, 3), // 8 -> 12
        jmp_imm(JGT, 3, 5, 2), // 9 -> 12
        mov64_imm(2, 1),       // 10
        mov64_imm(4, 0),       // 11
        stx(W, 9, 40, 2),      // 12
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("shared post-dominator", &p, "rank_local");
    // A rank-local branch in a loop body, the loop itself agreed.
    let p = program(&[
        mov64_imm(2, 0),        // 5
        mov64_imm(5, 0),        // 6
        ldx(B, 1, 6, 0),        // 7
        jmp_imm(JGT, 1, 5, 1),  // 8 -> 10
        alu64_imm(ADD, 2, 1),   // 9
        alu64_imm(ADD, 5, 1),   // 10
        jmp_imm(JLT, 5, 4, -4), // 11 -> 8
        stx(W, 9, 48, 2),       // 12
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("branch in a loop", &p, "rank_local");
    // Comparing stack pointers, one at a rank-local offset.
    let p = program(&[
        ldx(B, 1, 6, 0),        // 5
        alu64_imm(AND, 1, 8),   // 6
        mov64_reg(2, 10),       // 7
        alu64_imm(ADD, 2, -16), // 8
        alu64_reg(ADD, 2, 1),   // 9
        mov64_reg(3, 10),       // 10
        alu64_imm(ADD, 3, -8),  // 11
        jmp_reg(JEQ, 2, 3, 2),  // 12 -> 15
        st(W, 9, 40, 1),        // 13
        ja(0),                  // 14
        mov64_imm(0, 0),        // 15
        exit(),
    ]);
    rejects("pointer comparison", &p, "rank_local");
    // A 32-bit compare (kept out of reach of the merge with a `ja` in the arm).
    let p = program(&[
        ldx(DW, 1, 6, 0),        // 5
        jmp32_imm(JGT, 1, 5, 2), // 6 -> 9
        st(W, 9, 40, 1),         // 7
        ja(0),                   // 8
        mov64_imm(0, 0),         // 9
        exit(),
    ]);
    rejects("jmp32", &p, "rank_local");
    // Early return.
    let p = program(&[
        ldx(DW, 1, 6, 0),      // 5
        jmp_imm(JGT, 1, 5, 3), // 6 -> 10
        st(W, 9, 40, 1),       // 7
        mov64_imm(0, 0),       // 8
        exit(),                // 9
        mov64_imm(0, 1),       // 10
        exit(),                // 11
    ]);
    rejects("early return", &p, "rank_local");
    // Presence through equality with a valid pointer.
    let mut body = lookup_net();
    body.extend([
        jmp_reg(JEQ, 0, 6, 2), // 11 -> 14
        st(W, 9, 40, 1),       // 12
        ja(0),                 // 13
        mov64_imm(0, 0),       // 14
        exit(),
    ]);
    rejects("pointer equality", &program(&body), "rank_local");
}

#[test]
fn rejected_pruning_by_slot_taint() {
    let p = program(&[
        ldx(W, 3, 9, 16),      // 5
        jmp_imm(JEQ, 3, 0, 3), // 6 -> 10
        ldx(DW, 2, 6, 0),      // 7: rank-local
        stx(DW, 10, -8, 2),    // 8
        ja(2),                 // 9 -> 12
        ldx(W, 2, 9, 20),      // 10: agreed
        stx(DW, 10, -8, 2),    // 11
        ldx(DW, 4, 10, -8),    // 12
        stx(W, 9, 48, 4),      // 13
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects("slot taint at a prune point", &p, "rank_local");
}

#[test]
fn rejected_in_the_other_deciding_hooks() {
    let p = program(&[ldx(DW, 1, 6, 0), stx(DW, 9, 40, 1), mov64_imm(0, 0), exit()]);
    rejects_in("tuner/chunk", "chunk_size", &p, "rank_local");
    let p = program(&[ldx(DW, 1, 6, 0), stx(DW, 9, 32, 1), mov64_imm(0, 0), exit()]);
    rejects_in("tuner/init", "base_latencies[0]", &p, "rank_local");
}

#[test]
fn accepted_bookkeeping_before_an_agreed_decision() {
    // `if (cnt) (*cnt)++; ctx->algo = 1;` the region ends at the meeting point.
    let mut body = lookup_net();
    body.extend([
        jmp_imm(JEQ, 0, 0, 2),           // 11 -> 14
        mov64_imm(1, 1),                 // 12
        atomic(DW, ATOMIC_ADD, 0, 0, 1), // 13
        st(W, 9, 40, 1),                 // 14
        mov64_imm(0, 0),
        exit(),
    ]);
    accepts("counter then decision", &program(&body));
    // A loop of rank-local length that only writes .bss, then an agreed decision.
    let p = program(&[
        ldx(B, 1, 6, 0),        // 5
        mov64_imm(2, 0),        // 6
        jmp_reg(JGE_, 2, 1, 3), // 7 -> 11
        stx(B, 6, 8, 2),        // 8
        alu64_imm(ADD, 2, 1),   // 9
        jmp_imm(JLT, 2, 8, -4), // 10 -> 7
        ldx(W, 3, 9, 20),       // 11
        stx(W, 9, 48, 3),       // 12
        mov64_imm(0, 0),
        exit(),
    ]);
    accepts("rank-local loop, agreed decision", &p);
}

const JGE_: u8 = policy_object::insn::JGE;
