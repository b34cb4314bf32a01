//! The `tuner/epoch` hook on hand-made bytecode: its context (a read-only header, `state[32]`
//! written a whole word at a time), its helpers, and the locality rule on `state[]` (every rank
//! must compute the same state: from agreed and config maps, the context and constants, never
//! from a rank-local map, directly, through the stack or through a branch).

use policy_object::Insn;
use policy_object::insn::build::{
    alu64_imm, alu64_reg, atomic, call, exit, jmp_imm, ld_map, ldx, mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{ADD, B, DIV, DW, JEQ, W};
use policy_verifier::platform::{Perm, TUNER_EPOCH_CTX_SIZE, hook};

mod locality_common;
use locality_common::*;

const EPOCH: &str = "tuner/epoch";

/// `ctx->state[k]`'s offset.
const fn state(k: i16) -> i16 {
    48 + 8 * k
}

#[track_caller]
fn accepts_epoch(name: &str, insns: &[Insn]) {
    if let Err((_, _, text)) = verdict(EPOCH, insns) {
        panic!("{name}: rejected:\n{text}");
    }
}

#[track_caller]
fn rejects_epoch_at(name: &str, insns: &[Insn], kind: &str, at: usize) {
    match verdict(EPOCH, insns) {
        Err((k, i, text)) => {
            if std::env::var_os("SHOW_REJECTIONS").is_some() {
                eprintln!("{name}: {text}\n");
            }
            assert!(
                k == kind && i == at,
                "{name}: want {kind} at {at}, got {k} at {i}:\n{text}"
            )
        }
        Ok(()) => panic!("{name}: accepted, want {kind} at {at}"),
    }
}

/// `fp-4 = 0; r0 = bpf_map_lookup_elem(&map, &fp-4)`: instructions 5..=10 after the prelude.
fn lookup(map: i32) -> Vec<Insn> {
    let mut v = vec![st(W, 10, -4, 0)]; // 5
    v.extend(ld_map(1, map)); // 6, 7
    v.push(mov64_reg(2, 10)); // 8
    v.push(alu64_imm(ADD, 2, -4)); // 9
    v.push(call(1)); // 10
    v
}

#[test]
fn the_context_is_a_read_only_header_32_writable_words_and_the_net_busy_times() {
    let h = hook(EPOCH).unwrap();
    assert_eq!((h.ctx_size, TUNER_EPOCH_CTX_SIZE), (320, 320));
    assert!(h.decides, "the state is held to the locality rule");
    let rw: Vec<_> = h
        .fields
        .iter()
        .filter(|f| f.perm == Perm::ReadWrite)
        .collect();
    assert_eq!(rw.len(), 32);
    for (k, f) in rw.iter().enumerate() {
        assert_eq!((f.name, f.offset, f.size), ("state", 48 + 8 * k as u32, 8));
    }
    let ro: Vec<_> = h
        .fields
        .iter()
        .filter(|f| f.perm == Perm::Read)
        .map(|f| (f.name, f.offset, f.size))
        .collect();
    assert_eq!(
        ro,
        [
            ("comm_id", 0, 8),
            ("epoch", 8, 8),
            ("nranks", 16, 4),
            ("colls", 20, 4),
            ("duration_max_ns", 24, 8),
            ("duration_min_ns", 32, 8),
            ("bytes", 40, 8),
            ("net_busy_max_ns", 304, 8),
            ("net_busy_min_ns", 312, 8),
        ]
    );
    assert_eq!(
        h.helpers,
        hook("tuner").unwrap().helpers,
        "map helpers only"
    );
}

/// `state[0] = agreed[1] / colls; state[31] += duration_max_ns; state[1] = .rodata[0]`.
#[test]
fn state_from_agreed_maps_config_and_the_context_is_accepted() {
    let mut body = lookup(AGREED);
    body.extend([
        jmp_imm(JEQ, 0, 0, 11),   // 11: NULL -> exit
        ldx(DW, 1, 0, 8),         // 12: r1 = agreed word 1
        ldx(W, 2, 9, 20),         // 13: r2 = colls
        jmp_imm(JEQ, 2, 0, 1),    // 14
        alu64_reg(DIV, 1, 2),     // 15
        stx(DW, 9, state(0), 1),  // 16: state[0]
        ldx(DW, 3, 9, 24),        // 17: duration_max_ns
        ldx(DW, 4, 9, state(31)), // 18: the state kept from the last run
        alu64_reg(ADD, 4, 3),     // 19
        stx(DW, 9, state(31), 4), // 20: state[31]
        ldx(B, 5, 7, 0),          // 21: a config byte
        stx(DW, 9, state(1), 5),  // 22: state[1]
        mov64_imm(0, 0),          // 23
        exit(),                   // 24
    ]);
    accepts_epoch("agreed, ctx, config", &program(&body));
    // A branch on an agreed value is fine too.
    let p = program(&[
        ldx(DW, 1, 9, 8),       // 5: epoch
        jmp_imm(JEQ, 1, 0, 1),  // 6
        st(DW, 9, state(2), 7), // 7: state[2] = 7 on every epoch but the first
        mov64_imm(0, 0),
        exit(),
    ]);
    accepts_epoch("branch on the epoch", &p);
}

#[test]
fn state_from_a_rank_local_map_is_rejected() {
    // Directly: a rank-local array's value.
    let mut body = lookup(COUNTS);
    body.extend([
        jmp_imm(JEQ, 0, 0, 2),   // 11
        ldx(DW, 1, 0, 0),        // 12
        stx(DW, 9, state(3), 1), // 13
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_epoch_at("direct", &program(&body), "rank_local", PRELUDE + 8);
    // Through the stack: .bss spilled and filled back.
    let p = program(&[
        ldx(DW, 1, 6, 8),        // 5: .bss word 1
        stx(DW, 10, -16, 1),     // 6
        mov64_imm(1, 0),         // 7
        ldx(DW, 2, 10, -16),     // 8
        stx(DW, 9, state(4), 2), // 9
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_epoch_at("via the stack", &p, "rank_local", PRELUDE + 4);
    // Through a branch: a constant written under a rank-local condition.
    let p = program(&[
        ldx(DW, 1, 6, 0),       // 5: .bss
        jmp_imm(JEQ, 1, 0, 1),  // 6
        st(DW, 9, state(5), 1), // 7
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_epoch_at("via a branch", &p, "rank_local", PRELUDE + 2);
    // A hash map's entry presence is rank-local too.
    let mut body = lookup(NET);
    body.extend([
        mov64_imm(1, 0),         // 11
        jmp_imm(JEQ, 0, 0, 1),   // 12
        mov64_imm(1, 1),         // 13
        stx(DW, 9, state(6), 1), // 14
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_epoch_at("presence", &program(&body), "rank_local", PRELUDE + 9);
    // The message names the field and where the value came from.
    let (_, _, text) = verdict(EPOCH, &program(&body)).unwrap_err();
    assert!(
        text.contains("'state'") && text.contains("net_lat"),
        "{text}"
    );
}

#[test]
fn an_epoch_program_writes_no_agreed_or_config_map() {
    let mut body = lookup(AGREED);
    body.extend([
        jmp_imm(JEQ, 0, 0, 2),  // 11
        mov64_imm(1, 1),        // 12
        atomic(DW, 0, 0, 0, 1), // 13: lock add into the agreed value
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_epoch_at("agreed", &program(&body), "map_read_only", PRELUDE + 8);
    let mut body = lookup(CFG);
    body.extend([
        jmp_imm(JEQ, 0, 0, 1), // 11
        st(DW, 0, 0, 1),       // 12: a store into the config value
        mov64_imm(0, 0),
        exit(),
    ]);
    rejects_epoch_at("config", &program(&body), "map_read_only", PRELUDE + 7);
}

#[test]
fn the_header_is_read_only_and_state_words_are_written_whole() {
    let one = |i: Insn| program(&[mov64_imm(1, 1), i, mov64_imm(0, 0), exit()]);
    for (name, off) in [
        ("epoch", 8),
        ("duration_max_ns", 24),
        ("bytes", 40),
        ("net_busy_max_ns", 304),
        ("net_busy_min_ns", 312),
    ] {
        rejects_epoch_at(name, &one(stx(DW, 9, off, 1)), "ctx_read_only", PRELUDE + 1);
    }
    rejects_epoch_at(
        "colls",
        &one(stx(W, 9, 20, 1)),
        "ctx_read_only",
        PRELUDE + 1,
    );
    let half = verdict(EPOCH, &one(stx(W, 9, state(0), 1))).unwrap_err();
    assert_eq!(
        half.0, "ctx_out_of_bounds",
        "a 4-byte write into a state word: {}",
        half.2
    );
    // After state[31] come the net busy times (read-only), and after them nothing.
    rejects_epoch_at(
        "past the net busy times",
        &one(stx(DW, 9, state(34), 1)),
        "ctx_out_of_bounds",
        PRELUDE + 1,
    );
    accepts_epoch("the last word", &one(stx(DW, 9, state(31), 1)));
    // A state word may be read in halves.
    accepts_epoch(
        "half read",
        &program(&[
            ldx(W, 1, 9, state(7) + 4),
            stx(DW, 9, state(7), 1),
            mov64_imm(0, 0),
            exit(),
        ]),
    );
}

#[test]
fn clocks_and_cpu_ids_are_not_offered() {
    for id in [5, 8] {
        let p = program(&[call(id), mov64_imm(0, 0), exit()]);
        let (kind, at, text) = verdict(EPOCH, &p).unwrap_err();
        assert_eq!(
            (kind.as_str(), at),
            ("helper_not_allowed", PRELUDE),
            "{text}"
        );
        assert!(text.contains("epoch state"), "{text}");
    }
}
