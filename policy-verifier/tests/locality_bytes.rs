//! The locality rule per byte and per pointer target (issue 38, parts 1 and 8; hand-made
//! bytecode; names as in locality_attack2.rs).
//!
//! * `hole_*`: a decision that depends on a rank-local value; rejected with `rank_local`
//!   naming where the value came from.
//! * `precision_*`: ordinary shapes whose decision is agreed; accepted.
//! * `rejected_*`: near-misses of the precision cases that must stay refused.
//! * `conservative_*`: refusals kept on purpose.

use policy_object::Insn;
use policy_object::insn::build::{
    alu64_imm, atomic, call, call_local, exit, jmp_imm, ld_map, ld_map_value, ldx, mov64_imm,
    mov64_reg, st, stx,
};
use policy_object::insn::{self as op, ADD, ATOMIC_ADD, B, DW, H, JEQ, JGT, RSH, W};

mod locality_common;
use locality_common::*;

/// Rejected in `section` with `rank_local`, the message naming `what`.
#[track_caller]
fn rejects_naming(section: &str, name: &str, insns: &[Insn], what: &str) {
    match verdict(section, insns) {
        Err((k, _, text)) => assert!(
            k == "rank_local" && text.contains(what),
            "{name}: want rank_local naming {what}, got {k}:\n{text}"
        ),
        Ok(()) => panic!("{name}: ACCEPTED, want rank_local naming {what}"),
    }
}

#[track_caller]
fn accepts_in(section: &str, name: &str, insns: &[Insn]) {
    if let Err((_, _, text)) = verdict(section, insns) {
        panic!("{name}: rejected:\n{text}");
    }
}

/// The program for `tuner/epoch`: its 4-byte decisions (`algo`, `proto`, `nchannels` at 40, 44,
/// 48 through the context in r8 or r9) become whole words of `state[]` (48, 56, 64).
fn epoch(p: &[Insn]) -> Vec<Insn> {
    p.iter()
        .map(|i| {
            let store = matches!(i.class(), op::ST | op::STX) && i.mode() == op::MEM;
            if store
                && (i.dst == 8 || i.dst == 9)
                && i.size_bits() == W
                && (40..=48).contains(&i.off)
            {
                Insn {
                    code: (i.code & !0x18) | DW,
                    off: 48 + (i.off - 40) * 2,
                    ..*i
                }
            } else {
                *i
            }
        })
        .collect()
}

/// `mov r0, 0; exit`.
fn ret0() -> [Insn; 2] {
    [mov64_imm(0, 0), exit()]
}

// =========================================================================================
// Part 1: a context load covering several fields takes the taint of each
// =========================================================================================

/// One 8-byte load at `nchannels` (48) also reads `usable` (52..56): its upper half decides.
#[test]
fn hole_ctx_dw_load_at_nchannels_reads_usable() {
    let mut p = program(&[
        ldx(DW, 2, 9, 48),
        alu64_imm(RSH, 2, 32),
        stx(W, 9, 40, 2), // algo = usable
    ]);
    p.extend(ret0());
    rejects_naming("tuner", "dw at 48", &p, "usable");
}

/// A struct copy of those 8 bytes onto the stack, then a decision on the copy's `usable`.
#[test]
fn hole_ctx_word_copied_to_the_stack_then_usable_read_back() {
    let mut p = program(&[
        ldx(DW, 2, 9, 48),
        stx(DW, 10, -8, 2),
        ldx(W, 3, 10, -4), // the copy's usable
        stx(W, 9, 44, 3),  // proto
    ]);
    p.extend(ret0());
    rejects_naming("tuner", "copy then read", &p, "usable");
}

/// A branch on the 8-byte load: the decision under it depends on `usable`.
#[test]
fn hole_ctx_dw_load_at_nchannels_in_a_branch() {
    let mut p = program(&[ldx(DW, 2, 9, 48), jmp_imm(JGT, 2, 100, 1), st(W, 9, 40, 1)]);
    p.extend(ret0());
    rejects_naming("tuner", "branch on dw at 48", &p, "usable");
}

/// `memcpy` of the whole context onto the stack (eight 8-byte words, as clang copies it), then
/// a decision on the copy's `usable`.
#[test]
fn hole_memcpy_of_the_context_then_decision_on_the_copy() {
    let mut body = vec![];
    for w in 0..8i16 {
        body.push(ldx(DW, 2, 9, 8 * w));
        body.push(stx(DW, 10, -64 + 8 * w, 2));
    }
    body.push(ldx(W, 3, 10, -64 + 52));
    body.push(stx(W, 9, 48, 3)); // nchannels = copy.usable
    let mut p = program(&body);
    p.extend(ret0());
    rejects_naming("tuner", "memcpy", &p, "usable");
}

/// The copy's `usable` as a lookup key (a helper argument): whether the agreed array has the
/// entry depends on it.
#[test]
fn hole_ctx_word_copy_as_a_lookup_key() {
    let mut p = program(&[ldx(DW, 2, 9, 48), stx(DW, 10, -8, 2)]);
    p.extend(ld_map(1, AGREED));
    p.extend([
        mov64_reg(2, 10),
        alu64_imm(ADD, 2, -4), // key: the copy's usable
        call(1),
        jmp_imm(JEQ, 0, 0, 1),
        st(W, 9, 40, 1),
    ]);
    p.extend(ret0());
    rejects_naming("tuner", "key from copy", &p, "usable");
}

/// Narrower loads inside `usable` (2 and 1 bytes at its upper end) and a 4-byte one: each
/// is rank-local.
#[test]
fn rejected_narrow_loads_inside_usable() {
    for (size, off) in [(H, 54), (B, 55), (W, 52)] {
        let mut p = program(&[ldx(size, 2, 9, off), stx(W, 9, 40, 2)]);
        p.extend(ret0());
        rejects_naming("tuner", &format!("load {size:#x} at {off}"), &p, "usable");
    }
}

/// An 8-byte load of two agreed fields (`nccl_algo`, `nccl_proto`) decides freely.
#[test]
fn precision_ctx_dw_load_of_two_agreed_fields() {
    let mut p = program(&[ldx(DW, 2, 9, 56), stx(W, 9, 40, 2)]);
    p.extend(ret0());
    accepts("dw at 56", &p);
}

/// A register is tainted as a whole: after the 8-byte copy of `nchannels`/`usable`, the copy's
/// `nchannels` half is rank-local too.
#[test]
fn conservative_ctx_word_copy_taints_both_halves() {
    let mut p = program(&[
        ldx(DW, 2, 9, 48),
        stx(DW, 10, -8, 2),
        ldx(W, 3, 10, -8), // the copy's nchannels
        stx(W, 9, 48, 3),
    ]);
    p.extend(ret0());
    rejects_naming("tuner", "copy's nchannels", &p, "usable");
}

// =========================================================================================
// Part 8: taint per stack byte
// =========================================================================================

/// `slot = local; key = agreed` in the slot's first bytes (clang reuses the slot), stored
/// `stores` (1, 2 or 4 bytes each); then a lookup in the agreed array with that key decides.
fn agreed_key_over_local_slot(size: u8, decision: Insn) -> Vec<Insn> {
    let n = match size {
        B => 4,
        H => 2,
        _ => 1,
    };
    let width = 4 / n;
    let mut body = vec![ldx(DW, 1, 6, 0), stx(DW, 10, -8, 1)];
    for k in 0..n {
        body.push(st(size, 10, -8 + (k * width) as i16, 1));
    }
    let mut p = program(&body);
    p.extend(ld_map(1, AGREED));
    p.extend([
        mov64_reg(2, 10),
        alu64_imm(ADD, 2, -8),
        call(1),
        jmp_imm(JEQ, 0, 0, 2),
        ldx(DW, 1, 0, 0),
        decision,
    ]);
    p.extend(ret0());
    p
}

#[test]
fn precision_partial_store_of_an_agreed_key_over_a_local_slot() {
    for size in [W, H, B] {
        let p = agreed_key_over_local_slot(size, stx(W, 9, 40, 1));
        accepts_in("tuner", &format!("key of {size:#x} stores"), &p);
    }
}

#[test]
fn precision_partial_store_of_an_agreed_key_over_a_local_slot_epoch() {
    for size in [W, H, B] {
        let p = agreed_key_over_local_slot(size, stx(DW, 9, 48, 1)); // state[0]
        accepts_in("tuner/epoch", &format!("epoch key of {size:#x} stores"), &p);
    }
}

/// The same, with the key the slot's upper half, which still holds the rank-local bytes.
#[test]
fn rejected_key_from_the_untouched_bytes_of_a_local_slot() {
    let mut p = program(&[ldx(DW, 1, 6, 0), stx(DW, 10, -8, 1), st(W, 10, -8, 1)]);
    p.extend(ld_map(1, AGREED));
    p.extend([
        mov64_reg(2, 10),
        alu64_imm(ADD, 2, -4),
        call(1),
        jmp_imm(JEQ, 0, 0, 1),
        st(W, 9, 40, 1),
    ]);
    p.extend(ret0());
    rejects_naming("tuner", "untouched half", &p, ".bss");
    rejects_naming("tuner/epoch", "untouched half (epoch)", &epoch(&p), ".bss");
}

/// A rank-local byte stored into the middle of an agreed slot: an 8-byte read over it is
/// rank-local, whatever the width of the store.
#[test]
fn rejected_local_byte_inside_an_agreed_slot() {
    for (size, off) in [(B, -5), (H, -6), (W, -4)] {
        let mut p = program(&[
            st(DW, 10, -8, 3),
            ldx(size, 1, 6, 0),
            stx(size, 10, off, 1),
            ldx(DW, 2, 10, -8),
            stx(W, 9, 40, 2),
        ]);
        p.extend(ret0());
        rejects_naming("tuner", &format!("local {size:#x} at {off}"), &p, ".bss");
    }
}

// =========================================================================================
// Part 8: a region writes only what its stores and calls can reach
// =========================================================================================

/// `fp-8 = 3; if (local) f(1); algo = fp-8`: the callee gets no stack pointer, so it cannot
/// write `fp-8`.
#[test]
fn precision_call_in_a_rank_local_branch_without_a_stack_pointer() {
    let mut p = program(&[
        st(DW, 10, -8, 3),     // 5
        ldx(B, 1, 6, 0),       // 6
        jmp_imm(JEQ, 1, 0, 2), // 7 -> 10
        mov64_imm(1, 1),       // 8
        call_local(4),         // 9 -> 14
        ldx(DW, 2, 10, -8),    // 10
        stx(W, 9, 40, 2),      // 11
    ]);
    p.extend(ret0()); // 12, 13
    p.extend([st(DW, 10, -8, 9), mov64_imm(0, 0), exit()]); // 14: writes its own frame
    accepts("call without stack pointer", &p);
    accepts_in(
        "tuner/epoch",
        "call without stack pointer (epoch)",
        &epoch(&p),
    );
}

/// Deep frames: main keeps an agreed value on its stack and calls `g(ctx)`; `g` keeps one on
/// its own, calls `h()` under a rank-local branch, then decides from its slot, and main from
/// its own after the return.
#[test]
fn precision_call_in_a_rank_local_branch_in_a_callee() {
    let mut p = program(&[
        st(DW, 10, -8, 3), // 5
        mov64_reg(1, 9),   // 6
        call_local(4),     // 7 -> 12
        ldx(DW, 2, 10, -8),
        stx(W, 9, 44, 2), // 9: proto from main's slot
        mov64_imm(0, 0),  // 10
        exit(),           // 11
        // g(ctx), frame 1
        mov64_reg(8, 1),    // 12
        st(DW, 10, -16, 2), // 13
    ]);
    p.extend(ld_map_value(2, BSS, 0)); // 14, 15
    p.extend([
        ldx(B, 2, 2, 0),       // 16
        jmp_imm(JEQ, 2, 0, 1), // 17 -> 19
        call_local(4),         // 18 -> 23
        ldx(DW, 3, 10, -16),   // 19
        stx(W, 8, 40, 3),      // 20: algo from g's slot
        mov64_imm(0, 0),       // 21
        exit(),                // 22
        // h(), frame 2
        mov64_imm(0, 0), // 23
        exit(),          // 24
    ]);
    accepts("call in a callee's region", &p);
    accepts_in(
        "tuner/epoch",
        "call in a callee's region (epoch)",
        &epoch(&p),
    );
}

/// The callee is handed a pointer to the slot and writes it: still rank-local.
#[test]
fn rejected_call_in_a_rank_local_branch_with_a_stack_pointer() {
    let mut p = program(&[
        st(DW, 10, -8, 3),     // 5
        ldx(B, 1, 6, 0),       // 6
        jmp_imm(JEQ, 1, 0, 3), // 7 -> 11
        mov64_reg(1, 10),      // 8
        alu64_imm(ADD, 1, -8), // 9
        call_local(4),         // 10 -> 15
        ldx(DW, 2, 10, -8),    // 11
        stx(W, 9, 40, 2),      // 12
    ]);
    p.extend(ret0()); // 13, 14
    p.extend([st(DW, 1, 0, 9), mov64_imm(0, 0), exit()]); // 15
    rejects_naming("tuner", "callee writes through its argument", &p, ".bss");
}

/// `fp-8 = 3; if (local) { v = lookup(counts, 0); if (v) *v += 1 (or v[0] = 1); }
/// algo = fp-8`: the lookup result is a map value, not the stack.
fn store_through_lookup_in_region(store: Insn) -> Vec<Insn> {
    let mut p = program(&[
        st(DW, 10, -8, 3),     // 5
        ldx(B, 1, 6, 0),       // 6
        jmp_imm(JEQ, 1, 0, 9), // 7 -> 17
        st(W, 10, -12, 0),     // 8
    ]);
    p.extend(ld_map(1, COUNTS)); // 9, 10
    p.extend([
        mov64_reg(2, 10),       // 11
        alu64_imm(ADD, 2, -12), // 12
        call(1),                // 13
        jmp_imm(JEQ, 0, 0, 2),  // 14 -> 17
        mov64_imm(1, 1),        // 15
        store,                  // 16
        ldx(DW, 2, 10, -8),     // 17
        stx(W, 9, 40, 2),       // 18
    ]);
    p.extend(ret0());
    p
}

#[test]
fn precision_store_through_a_lookup_result_assigned_in_the_branch() {
    let p = store_through_lookup_in_region(stx(DW, 0, 0, 1));
    accepts("store through lookup", &p);
    let p = store_through_lookup_in_region(atomic(DW, ATOMIC_ADD, 0, 0, 1));
    accepts("atomic add through lookup", &p);
    let p = store_through_lookup_in_region(stx(W, 0, 4, 1));
    accepts("u32 store through lookup", &p);
}

/// The same in `tuner/epoch`, deciding `state[1]`.
#[test]
fn precision_store_through_a_lookup_result_assigned_in_the_branch_epoch() {
    let mut p = store_through_lookup_in_region(atomic(DW, ATOMIC_ADD, 0, 0, 1));
    p[18] = stx(DW, 9, 56, 2);
    accepts_in("tuner/epoch", "epoch: atomic add through lookup", &p);
}

/// A stack pointer of known offset made in the branch writes only its bytes: `fp-16`, not the
/// decision's `fp-8`.
#[test]
fn precision_store_through_a_stack_pointer_of_known_offset_in_the_branch() {
    let mut p = program(&[
        st(DW, 10, -8, 3),      // 5
        ldx(B, 1, 6, 0),        // 6
        jmp_imm(JEQ, 1, 0, 3),  // 7 -> 11
        mov64_reg(3, 10),       // 8
        alu64_imm(ADD, 3, -16), // 9
        st(DW, 3, 0, 1),        // 10
        ldx(DW, 2, 10, -8),     // 11
        stx(W, 9, 40, 2),       // 12
    ]);
    p.extend(ret0());
    accepts("known stack target", &p);
}

/// ... and the bytes it does write are rank-local.
#[test]
fn rejected_store_through_a_stack_pointer_made_in_the_branch() {
    for (size, off) in [(DW, 8), (W, 12), (H, 14), (B, 15)] {
        let mut p = program(&[
            st(DW, 10, -8, 3),      // 5
            ldx(B, 1, 6, 0),        // 6
            jmp_imm(JEQ, 1, 0, 3),  // 7 -> 11
            mov64_reg(3, 10),       // 8
            alu64_imm(ADD, 3, -16), // 9
            st(size, 3, off, 1),    // 10: into fp-8
            ldx(DW, 2, 10, -8),     // 11
            stx(W, 9, 40, 2),       // 12
        ]);
        p.extend(ret0());
        rejects_naming("tuner", &format!("{size:#x} at fp-16+{off}"), &p, ".bss");
    }
}

/// A base filled from the stack may be any spilled stack pointer: every byte is rank-local.
#[test]
fn rejected_store_through_a_base_filled_in_the_branch() {
    let mut p = program(&[
        st(DW, 10, -8, 3),     // 5
        mov64_reg(3, 10),      // 6
        alu64_imm(ADD, 3, -8), // 7
        stx(DW, 10, -16, 3),   // 8: spill &fp-8
        ldx(B, 1, 6, 0),       // 9
        jmp_imm(JEQ, 1, 0, 2), // 10 -> 13
        ldx(DW, 4, 10, -16),   // 11
        st(B, 4, 3, 1),        // 12
        ldx(DW, 2, 10, -8),    // 13
        stx(W, 9, 40, 2),      // 14
    ]);
    p.extend(ret0());
    rejects_naming("tuner", "filled base", &p, ".bss");
}
