//! The locality rule on hand-made bytecode: shapes clang does not emit (stack copies through
//! other pointers, atomics, a callee writing its caller's stack, tainted pointer offsets), the
//! precision the rule keeps (decided branches, byte swaps, regions that end), and pruning that
//! must not hide a rank-local path behind an agreed one.

use policy_object::Insn;
use policy_object::insn::build::{
    alu64_imm, alu64_reg, atomic, call, call_local, exit, ja, jmp_imm, jmp_reg, ld_map,
    ld_map_value, ldx, mov64_imm, mov64_reg, st, stx, to_be,
};
use policy_object::insn::{ADD, AND, ATOMIC_XCHG, B, DW, JEQ, JGE, JGT, JLT, W};

mod locality_common;
use locality_common::*;

#[test]
fn a_spill_through_another_stack_pointer_keeps_the_taint() {
    let p = program(&[
        ldx(DW, 1, 6, 0),       // 5: r1 = .bss[0]            rank-local
        mov64_reg(2, 10),       // 6
        alu64_imm(ADD, 2, -16), // 7: r2 = fp-16
        stx(DW, 2, 0, 1),       // 8: *(u64 *)(r2 + 0) = r1
        ldx(DW, 3, 10, -16),    // 9: r3 = *(u64 *)(r10 - 16)
        stx(W, 9, 48, 3),       // 10: ctx->nchannels = r3
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_at("spill via r2", &p, "rank_local", PRELUDE + 5);
    // Byte by byte: one tainted byte taints the slot.
    let p = program(&[
        ldx(B, 1, 6, 3),   // 5: r1 = .bss[3]
        st(DW, 10, -8, 0), // 6: *(u64 *)(r10 - 8) = 0
        stx(B, 10, -5, 1), // 7: *(u8 *)(r10 - 5) = r1
        ldx(W, 3, 10, -8), // 8: r3 = *(u32 *)(r10 - 8)
        stx(W, 9, 44, 3),  // 9: ctx->proto = r3
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_at("byte store", &p, "rank_local", PRELUDE + 4);
    // An agreed 8-byte store over the whole slot replaces the taint.
    let p = program(&[
        ldx(B, 1, 6, 3),
        stx(DW, 10, -8, 1), // 6: tainted spill
        ldx(W, 2, 9, 20),   // 7: r2 = ctx->nranks
        stx(DW, 10, -8, 2), // 8: overwritten whole
        ldx(DW, 3, 10, -8), // 9
        stx(W, 9, 48, 3),   // 10: ctx->nchannels = nranks
        mov64_imm(0, 0),
        exit(),
    ]);
    accepts("overwritten spill", &p);
}

#[test]
fn an_atomic_exchange_moves_the_taint_into_the_slot() {
    let p = program(&[
        ldx(DW, 1, 6, 0),                   // 5: r1 = .bss[0]
        st(DW, 10, -8, 0),                  // 6
        atomic(DW, ATOMIC_XCHG, 10, -8, 1), // 7: r1 = xchg(fp-8, r1)
        ldx(DW, 4, 10, -8),                 // 8: r4 = fp-8, now the rank-local value
        stx(W, 9, 40, 4),                   // 9: ctx->algo = r4
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_at("xchg", &p, "rank_local", PRELUDE + 4);
}

#[test]
fn a_callee_writing_its_callers_stack_taints_it() {
    let p = program(&[
        st(DW, 10, -8, 0),     // 5
        mov64_reg(1, 10),      // 6
        alu64_imm(ADD, 1, -8), // 7: r1 = fp-8
        call_local(4),         // 8: f (insn 13)
        ldx(DW, 2, 10, -8),    // 9
        stx(W, 9, 44, 2),      // 10: ctx->proto = what f stored
        mov64_imm(0, 0),       // 11
        exit(),                // 12
        // f: *(u64 *)r1 = .bss[0]
        ld_map_value(3, BSS, 0)[0], // 13
        ld_map_value(3, BSS, 0)[1], // 14
        ldx(DW, 4, 3, 0),           // 15
        stx(DW, 1, 0, 4),           // 16
        mov64_imm(0, 0),            // 17
        exit(),                     // 18
    ]);
    rejects_at("callee store", &p, "rank_local", PRELUDE + 5);
}

#[test]
fn a_rank_local_offset_into_config_is_rank_local() {
    let p = program(&[
        ldx(B, 1, 6, 0),      // 5: r1 = .bss[0]
        alu64_imm(AND, 1, 7), // 6
        alu64_reg(ADD, 7, 1), // 7: r7 = &.rodata + r1
        ldx(B, 2, 7, 0),      // 8: a config byte, but which one is rank-local
        stx(W, 9, 40, 2),     // 9
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_at("offset", &p, "rank_local", PRELUDE + 4);
    // The same read at a constant offset is config.
    let p = program(&[ldx(B, 2, 7, 5), stx(W, 9, 40, 2), mov64_imm(0, 0), exit()]);
    accepts("config byte", &p);
}

/// A branch the verifier decides one way still depends on its operand when that is rank-local:
/// what the verifier knows of it may hold on this path only (bounds an earlier rank-local branch
/// refined). So it opens a region on its one edge; on an agreed operand it does not.
#[test]
fn a_decided_branch_on_a_rank_local_value_still_opens_a_region() {
    let p = |load: Insn| {
        program(&[
            load,                    // 5: a byte
            jmp_imm(JGT, 1, 255, 2), // 6: never taken
            mov64_imm(2, 1),         // 7
            stx(W, 9, 40, 2),        // 8
            mov64_imm(0, 0),         // 9
            exit(),                  // 10
        ])
    };
    rejects_at(
        "rank-local byte",
        &p(ldx(B, 1, 6, 0)),
        "rank_local",
        PRELUDE + 3,
    );
    accepts("a byte of config", &p(ldx(B, 1, 7, 0)));
    // The case it is for: the second test of a value an earlier branch on it refined.
    let p = program(&[
        ldx(DW, 1, 6, 0),      // 5
        jmp_imm(JGT, 1, 5, 0), // 6: both edges go to 7, r1 <= 5 on one of them
        jmp_imm(JGT, 1, 5, 2), // 7: decided on each path, differently
        mov64_imm(2, 1),       // 8
        stx(W, 9, 40, 2),      // 9: ctx->algo on the paths where r1 <= 5
        mov64_imm(0, 0),       // 10
        exit(),                // 11
    ]);
    rejects_at("refined twice", &p, "rank_local", PRELUDE + 4);
}

#[test]
fn a_byte_swap_reads_no_source_register() {
    let p = program(&[
        ldx(DW, 0, 6, 0), // 5: r0 rank-local
        mov64_imm(2, 7),  // 6
        to_be(2, 16),     // 7: be16 r2 (the source field is 0: not r0)
        stx(W, 9, 44, 2), // 8
        mov64_imm(0, 0),
        exit(),
    ]);
    accepts("be16", &p);
}

/// `if (.bss[0] == 0) r2 = 1 else r2 = 1; r3 = 5`, then `store` (ctx->nchannels = r2 or r3).
fn diamond(store: u8) -> Vec<Insn> {
    program(&[
        ldx(DW, 1, 6, 0),      // 5
        jmp_imm(JEQ, 1, 0, 2), // 6 -> 9
        mov64_imm(2, 1),       // 7
        ja(1),                 // 8 -> 10
        mov64_imm(2, 1),       // 9
        mov64_imm(3, 5),       // 10: the meeting point
        stx(W, 9, 48, store),  // 11
        mov64_imm(0, 0),
        exit(),
    ])
}

#[test]
fn a_region_ends_where_the_paths_meet() {
    accepts("value computed after the meeting point", &diamond(3));
    rejects_at(
        "value assigned inside the region",
        &diamond(2),
        "rank_local",
        PRELUDE + 6,
    );
}

#[test]
fn a_loop_that_runs_a_rank_local_number_of_times() {
    // r2 counts up to min(.bss[0], 8); the loop exit is the post-dominator.
    let body = |store: u8| {
        program(&[
            ldx(B, 1, 6, 0),        // 5
            mov64_imm(2, 0),        // 6
            jmp_reg(JGE, 2, 1, 2),  // 7: loop: if r2 >= r1 goto out
            alu64_imm(ADD, 2, 1),   // 8
            jmp_imm(JLT, 2, 8, -3), // 9: if r2 < 8 goto loop
            mov64_imm(3, 1),        // 10: out
            stx(W, 9, 48, store),   // 11
            mov64_imm(0, 0),
            exit(),
        ])
    };
    rejects_at("the count", &body(2), "rank_local", PRELUDE + 6);
    accepts("a constant after the loop", &body(3));
}

/// Two paths meet at a pruning point: one with an agreed value in r2, one with a rank-local
/// one. Whichever is explored first, the rank-local one must still be checked.
#[test]
fn pruning_never_covers_a_rank_local_state_with_an_agreed_one() {
    for local_on_jump in [false, true] {
        let (a, b) = if local_on_jump {
            (ldx(W, 2, 9, 20), ldx(DW, 2, 6, 0))
        } else {
            (ldx(DW, 2, 6, 0), ldx(W, 2, 9, 20))
        };
        let p = program(&[
            ldx(W, 1, 9, 16),      // 5: coll_type (agreed)
            jmp_imm(JEQ, 1, 0, 2), // 6 -> 9
            a,                     // 7
            ja(1),                 // 8 -> 10
            b,                     // 9
            stx(W, 9, 48, 2),      // 10
            mov64_imm(0, 0),
            exit(),
        ]);
        rejects_at(
            &format!(
                "rank-local on the {} edge",
                if local_on_jump {
                    "taken"
                } else {
                    "fallthrough"
                }
            ),
            &p,
            "rank_local",
            PRELUDE + 5,
        );
    }
}

#[test]
fn no_program_writes_an_agreed_map() {
    let p = vec![
        st(W, 10, -4, 0),       // 0: key 0
        ld_map(1, AGREED)[0],   // 1
        ld_map(1, AGREED)[1],   // 2
        mov64_reg(2, 10),       // 3
        alu64_imm(ADD, 2, -4),  // 4
        call(1),                // 5: lookup
        jmp_imm(JEQ, 0, 0, 2),  // 6
        mov64_imm(1, 1),        // 7
        atomic(DW, 0, 0, 0, 1), // 8: lock add [r0], r1
        mov64_imm(0, 0),        // 9
        exit(),                 // 10
    ];
    for section in ["tuner", "net/complete"] {
        let got = verdict(section, &p).unwrap_err();
        assert_eq!(
            (got.0.as_str(), got.1),
            ("map_read_only", 8),
            "{section}: {}",
            got.2
        );
        assert!(got.2.contains("agreed map 'agreed'"), "{}", got.2);
    }
}

#[test]
fn net_hooks_are_not_held_to_the_rule() {
    // The same data flow as the spill case, in a net hook whose context is read-only: a
    // rank-local value may go anywhere a net program may write (here a .bss counter).
    let p = program(&[
        ldx(DW, 1, 6, 0),
        alu64_imm(ADD, 1, 1),
        stx(DW, 6, 8, 1),
        mov64_imm(0, 0),
        exit(),
    ]);
    assert_eq!(verdict("net/complete", &p), Ok(()));
}
