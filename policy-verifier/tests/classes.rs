//! The unsoundness classes an independent review found, as raw bytecode (what a crafted
//! object or a miscompiler can produce, independent of clang), each with several variants;
//! and the ordinary idioms the verifier used to reject. The C corpus (policies/) covers the
//! same classes as compiled programs.

mod common;
use common::*;

use policy_object::insn::build::{
    alu64_imm, alu64_reg, atomic, call, call_local, exit, insn, jmp_imm, jmp_reg, jmp32_imm,
    ld_map, ldx, mov32_reg, mov64_imm, mov64_reg, st, stx,
};
use policy_object::insn::{self as op, Insn};

#[track_caller]
fn rejected(kind: &str, prog: &[Insn]) {
    for section in ["tuner", "net/isend"] {
        match verdict(section, prog) {
            Ok(()) => panic!("accepted ({section}), expected {kind}"),
            Err(e) => assert!(
                e.starts_with(&format!("{kind} |")),
                "{section}: expected {kind}, got {e}"
            ),
        }
    }
}

#[track_caller]
fn accepted(prog: &[Insn]) {
    if let Err(e) = verdict("tuner", prog) {
        panic!("rejected: {e}");
    }
}

// ---------------------------------------------------------------- 1. atomics on the stack

#[test]
fn atomics_never_leave_a_spilled_pointer_believed_intact() {
    for (size, kind) in [
        (op::DW, op::ATOMIC_ADD),
        (op::DW, op::ATOMIC_ADD | op::FETCH),
        (op::DW, op::ATOMIC_OR),
        (op::DW, op::ATOMIC_XCHG),
        (op::DW, op::ATOMIC_CMPXCHG),
        (op::W, op::ATOMIC_ADD),
        (op::W, op::ATOMIC_XOR | op::FETCH),
    ] {
        let off = if size == op::W { -4 } else { -8 };
        rejected(
            "corrupt_spill",
            &[
                stx(op::DW, 10, -8, 1), // spill ctx
                mov64_imm(2, 8),
                mov64_imm(0, 0),
                atomic(size, kind, 10, off, 2),
                ldx(op::DW, 1, 10, -8),
                ldx(op::DW, 0, 1, 0),
                exit(),
            ],
        );
    }
}

#[test]
fn atomics_change_what_a_spilled_constant_was() {
    for (size, off, kind) in [
        (op::DW, -8, op::ATOMIC_ADD),
        (op::W, -8, op::ATOMIC_OR),
        (op::W, -4, op::ATOMIC_ADD | op::FETCH),
        (op::DW, -8, op::ATOMIC_XCHG),
    ] {
        // fp-8 = 0; atomically add 1; the verifier must not keep believing it is 0.
        rejected(
            "invalid_mem_access",
            &[
                st(op::DW, 10, -8, 0),
                mov64_imm(2, 1),
                atomic(size, kind, 10, off, 2),
                ldx(op::DW, 3, 10, -8),
                jmp_imm(op::JEQ, 3, 0, 1),
                ldx(op::DW, 0, 3, 0), // dereferences the "dead" value
                mov64_imm(0, 0),
                exit(),
            ],
        );
    }
}

// ---------------------------------------------------------------- 2. pointer - pointer

#[test]
fn distance_between_two_lookups_is_not_zero() {
    for sub_first in [true, false] {
        let mut p = cat(&[&lookup(6, 0), &lookup(7, 1)]);
        if sub_first {
            p.push(alu64_reg(op::SUB, 6, 7));
        } else {
            p.extend([mov64_reg(2, 7), alu64_reg(op::SUB, 2, 6), mov64_reg(6, 2)]);
        }
        p.extend([
            jmp_imm(op::JEQ, 6, 0, 1),
            ldx(op::DW, 0, 10, -600),
            mov64_imm(0, 0),
            exit(),
        ]);
        rejected("pointer_arithmetic", &p);
    }
    // One stack frame: a plain (and exact) scalar.
    accepted(&[
        mov64_reg(2, 10),
        mov64_reg(3, 10),
        alu64_imm(op::ADD, 3, -8),
        alu64_reg(op::SUB, 2, 3),
        jmp_imm(op::JEQ, 2, 8, 1),
        ldx(op::DW, 0, 10, -600),
        mov64_imm(0, 0),
        exit(),
    ]);
}

// ---------------------------------------------------------------- 3. pointers reaching maps

#[test]
fn pointers_are_spilled_whole_or_not_at_all() {
    for off in [-12, -9, -15, -20] {
        rejected(
            "pointer_leak",
            &[
                stx(op::DW, 10, off, 1),
                ldx(op::DW, 0, 10, -16),
                mov64_imm(0, 0),
                exit(),
            ],
        );
    }
    for (size, off) in [(op::W, -8), (op::W, -4), (op::H, -6), (op::B, -1)] {
        rejected(
            "corrupt_spill",
            &[
                stx(op::DW, 10, -8, 1),
                st(size, 10, off, 0),
                ldx(op::DW, 0, 10, -8),
                mov64_imm(0, 0),
                exit(),
            ],
        );
    }
    // A misaligned 8-byte scalar store across a spilled pointer.
    rejected(
        "corrupt_spill",
        &[
            stx(op::DW, 10, -16, 1),
            st(op::W, 10, -4, 0),
            st(op::DW, 10, -12, 7),
            mov64_imm(0, 0),
            exit(),
        ],
    );
}

#[test]
fn helpers_never_copy_a_spilled_pointer_into_a_map() {
    // A buffer holding a spilled pointer (whole, or as part of a larger buffer) as the key
    // or the value of an update, or the key of a lookup or delete.
    for (map, helper, ptr_at, key_at, val_at) in [
        (SMALL, 2, -8, -16, -8), // value = exactly the spilled pointer
        (SMALL, 2, -8, -8, -16), // key = exactly the spilled pointer
        (SMALL, 1, -8, -8, -16), // lookup key
        (SMALL, 3, -8, -8, -16), // delete key
        (ARR, 2, -32, -4, -40),  // pointer inside a 32-byte value
    ] {
        let mut p = vec![
            st(op::DW, 10, -8, 0),
            st(op::DW, 10, -16, 0),
            st(op::DW, 10, -24, 0),
            st(op::DW, 10, -32, 0),
            st(op::DW, 10, -40, 0),
            stx(op::DW, 10, ptr_at, 1),
        ];
        p.extend(ld_map(1, map));
        p.extend([
            mov64_reg(2, 10),
            alu64_imm(op::ADD, 2, key_at),
            mov64_reg(3, 10),
            alu64_imm(op::ADD, 3, val_at),
            mov64_imm(4, 0),
            call(helper),
            mov64_imm(0, 0),
            exit(),
        ]);
        rejected("pointer_leak", &p);
    }
}

// ---------------------------------------------------------------- 4. read-only maps

#[test]
fn read_only_follows_the_map_however_its_pointer_was_formed() {
    for helper in [2, 3] {
        let mut p = vec![
            st(op::DW, 10, -8, 0),
            st(op::DW, 10, -16, 0),
            st(op::DW, 10, -24, 0),
        ];
        p.extend(ld_map(1, RODATA));
        p.extend([
            mov64_reg(2, 10),
            alu64_imm(op::ADD, 2, -8),
            mov64_reg(3, 10),
            alu64_imm(op::ADD, 3, -24),
            mov64_imm(4, 0),
        ]);
        p.extend([call(helper), mov64_imm(0, 0), exit()]);
        rejected("map_read_only", &p);
    }
}

// ---------------------------------------------------------------- 5./6. structure

#[test]
fn subprograms_are_entered_only_by_calls_and_never_fallen_into() {
    let pcall = |imm| call_local(imm);
    // Main falls through into the subprogram at 3.
    rejected(
        "bad_subprog",
        &[
            pcall(2),
            mov64_imm(0, 0),
            mov64_imm(0, 1),
            mov64_imm(0, 2),
            exit(),
        ],
    );
    // A subprogram's last instruction is not exit/ja: it runs into the next one.
    rejected(
        "bad_subprog",
        &[
            pcall(2),
            pcall(3),
            exit(),
            mov64_imm(0, 1),
            mov64_imm(0, 2),
            mov64_imm(0, 3),
            exit(),
        ],
    );
    // The last subprogram's last instruction is not exit/ja.
    rejected(
        "fall_off_end",
        &[pcall(1), exit(), mov64_imm(0, 1), exit(), mov64_imm(0, 2)],
    );
    // A jump from main into the subprogram.
    rejected(
        "bad_subprog",
        &[
            pcall(3),
            jmp_imm(op::JEQ, 0, 0, 3),
            mov64_imm(0, 0),
            exit(),
            mov64_imm(0, 1),
            exit(),
        ],
    );
    // Recursion: into the entry, into itself, through another subprogram.
    rejected(
        "bad_subprog",
        &[
            mov64_imm(0, 0),
            jmp_imm(op::JEQ, 0, 1, 1),
            pcall(-3),
            exit(),
        ],
    );
    rejected(
        "bad_subprog",
        &[
            pcall(1),
            exit(),
            mov64_imm(0, 0),
            jmp_imm(op::JEQ, 0, 1, 1),
            pcall(-3),
            exit(),
        ],
    );
    rejected(
        "bad_subprog",
        &[
            pcall(1),
            exit(),
            pcall(1),
            exit(),
            mov64_imm(0, 0),
            jmp_imm(op::JEQ, 0, 1, 1),
            pcall(-5),
            exit(),
        ],
    );
    // A conditional jump as the very last instruction (used to panic).
    rejected(
        "fall_off_end",
        &[mov64_imm(0, 0), jmp_imm(op::JEQ, 0, 0, -2)],
    );
    rejected(
        "fall_off_end",
        &[mov64_imm(0, 0), jmp32_imm(op::JEQ, 0, 0, -2)],
    );
    // Reserved bits: callx/0x8d, exit with fields set, call with off set.
    rejected(
        "bad_insn",
        &[mov64_imm(0, 0), insn(0x8d, 0, 0, 0, 1), exit()],
    );
    rejected(
        "bad_insn",
        &[mov64_imm(0, 0), insn(op::JMP | op::EXIT, 0, 0, 0, 1)],
    );
    rejected(
        "bad_insn",
        &[
            mov64_imm(0, 0),
            insn(op::JMP | op::CALL, 0, 0, 1, 5),
            exit(),
        ],
    );
    rejected(
        "bad_insn",
        &[insn(op::ALU64 | op::MOV | op::K, 0, 1, 0, 0), exit()],
    );
    rejected(
        "bad_insn",
        &[insn(op::ALU64 | op::MOV | op::X, 0, 1, 0, 4), exit()],
    );
}

// ---------------------------------------------------------------- false rejects

#[test]
fn byte_swaps_read_their_own_register() {
    for (code, imm) in [
        (op::ALU | op::END | op::X, 16),   // be16
        (op::ALU | op::END | op::K, 32),   // le32
        (op::ALU64 | op::END | op::K, 64), // bswap64 (v4)
    ] {
        accepted(&[
            ldx(op::W, 2, 1, 28 - 8), // tuner: nranks at 20
            insn(code, 2, 0, 0, imm),
            mov64_reg(0, 2),
            exit(),
        ]);
    }
}

#[test]
fn thirty_two_bit_bounds_bound_an_index() {
    // w2 = (u32)ctx->msg_size; if w2 > 3 goto out; idx = w2 * 8 into a 32-byte value.
    let body = |guard: Vec<Insn>| {
        let mut p = lookup(6, 0);
        p.extend([ldx(op::DW, 2, 1, 0)]);
        p.extend(guard);
        p.extend([
            alu64_imm(op::LSH, 2, 3),
            alu64_reg(op::ADD, 6, 2),
            ldx(op::DW, 0, 6, 0),
            exit(),
            mov64_imm(0, 0),
            exit(),
        ]);
        p
    };
    // ctx is clobbered by the call: reload it from r? (r1 is gone) -> keep ctx in r9 first.
    let with_ctx = |p: Vec<Insn>| {
        let mut q = vec![mov64_reg(9, 1)];
        q.extend(p.into_iter().map(|x| {
            if x.code == op::LDX | op::MEM | op::DW && x.src == 1 {
                ldx(op::DW, 2, 9, 0)
            } else {
                x
            }
        }));
        q
    };
    let n_out = |k: i16| k; // jump over the access to `mov r0, 0; exit`
    // u64 -> u32 truncation, then a 32-bit unsigned compare.
    accepted(&with_ctx(body(vec![
        mov32_reg(2, 2),
        jmp32_imm(op::JGT, 2, 3, n_out(4)),
    ])));
    // A JMP32 compare alone bounds the low half; the truncation after it the whole value.
    accepted(&with_ctx(body(vec![
        jmp32_imm(op::JGT, 2, 3, n_out(5)),
        mov32_reg(2, 2),
    ])));
    // Signed 32-bit compares on a truncated value.
    accepted(&with_ctx(body(vec![
        mov32_reg(2, 2),
        jmp32_imm(op::JSGT, 2, 3, n_out(5)),
        jmp32_imm(op::JSLT, 2, 0, n_out(4)),
    ])));
    // Without the upper half cleared, a JMP32 bound is not a 64-bit bound.
    let p = with_ctx(body(vec![jmp32_imm(op::JGT, 2, 3, n_out(4))]));
    assert!(verdict("tuner", &p).is_err());
}

#[test]
fn variable_offset_stack_writes_and_scalar_plus_pointer() {
    let mut p = vec![st(op::DW, 10, -16, 0), st(op::DW, 10, -8, 0)];
    p.extend([
        ldx(op::W, 2, 1, 20),
        alu64_imm(op::AND, 2, 15),
        mov64_reg(3, 10),
        alu64_imm(op::ADD, 3, -16),
        alu64_reg(op::ADD, 3, 2),
        st(op::B, 3, 0, 1),
        ldx(op::DW, 0, 10, -16),
        exit(),
    ]);
    accepted(&p);
    // scalar + pointer
    let mut p = vec![mov64_reg(9, 1)];
    p.extend(lookup(6, 0));
    p.extend([
        ldx(op::W, 2, 9, 20),
        alu64_imm(op::AND, 2, 3),
        alu64_imm(op::LSH, 2, 3),
        alu64_reg(op::ADD, 2, 6),
        ldx(op::DW, 0, 2, 0),
        exit(),
    ]);
    accepted(&p);
}

#[test]
fn equal_to_a_valid_pointer_is_not_null() {
    let mut p = lookup(6, 0);
    p.extend([
        st(op::W, 10, -4, 1),
        mov64_reg(2, 10),
        alu64_imm(op::ADD, 2, -4),
    ]);
    p.extend(ld_map(1, ARR));
    p.extend([
        call(1),
        jmp_reg(op::JNE, 0, 6, 2),
        ldx(op::DW, 0, 0, 0), // r0 == r6, which is not NULL
        exit(),
        mov64_imm(0, 0),
        exit(),
    ]);
    accepted(&p);
}

// ---------------------------------------------------------------- pruning

#[test]
fn pruning_keeps_every_value_that_reaches_a_pointer() {
    // Two paths meet with r7 = 0 or r7 = 100; r7 is then added to a map value pointer that
    // arrives by different routes (copy, spill, store through a stack pointer, load through
    // one). The first path is safe; pruning the second would accept an access at off 100.
    let routes: Vec<Vec<Insn>> = vec![
        vec![mov64_reg(1, 6)],
        vec![stx(op::DW, 10, -8, 6), ldx(op::DW, 1, 10, -8)],
        vec![
            mov64_reg(3, 10),
            stx(op::DW, 3, -8, 6),
            ldx(op::DW, 1, 10, -8),
        ],
        vec![
            mov64_reg(3, 10),
            alu64_imm(op::ADD, 3, -8),
            stx(op::DW, 10, -8, 6),
            ldx(op::DW, 1, 3, 0),
        ],
    ];
    for (k, route) in routes.into_iter().enumerate() {
        for first in [0, 100] {
            let second = 100 - first;
            let mut p = vec![mov64_reg(9, 1)];
            p.extend(lookup(6, 0));
            p.extend([
                mov64_imm(7, first),
                ldx(op::W, 2, 9, 20),
                jmp_imm(op::JEQ, 2, 0, 1),
                mov64_imm(7, second),
            ]);
            p.extend(route.iter().copied());
            p.extend([alu64_reg(op::ADD, 1, 7), ldx(op::B, 0, 1, 0), exit()]);
            let e = verdict("tuner", &p).expect_err(&format!("route {k} accepted"));
            assert!(e.starts_with("map_out_of_bounds"), "route {k}: {e}");
        }
    }
}

#[test]
fn pointers_are_ordered_only_within_one_object() {
    // Two values of one hash-like map: equal or not, but never which comes first in memory.
    for o in [op::JGT, op::JLT, op::JSGE, op::JSET] {
        let mut p = cat(&[&lookup(6, 0), &lookup(7, 1)]);
        p.extend([jmp_reg(o, 6, 7, 1), mov64_imm(0, 1), exit()]);
        p.insert(p.len() - 2, mov64_imm(0, 0));
        rejected("pointer_arithmetic", &p);
    }
    let mut p = cat(&[&lookup(6, 0), &lookup(7, 1)]);
    p.extend([
        jmp_reg(op::JEQ, 6, 7, 1),
        mov64_imm(0, 0),
        mov64_imm(0, 1),
        exit(),
    ]);
    accepted(&p);
    // Within one stack frame, order is fine.
    accepted(&[
        mov64_reg(2, 10),
        alu64_imm(op::ADD, 2, -8),
        jmp_reg(op::JGT, 2, 10, 1),
        mov64_imm(0, 0),
        mov64_imm(0, 1),
        exit(),
    ]);
}

// ---------------------------------------------------------------- tuner/init and tuner/chunk

/// `tuner/init` writes whole 8-byte constants and nothing else; `tuner/chunk` writes only the
/// chunk size.
#[test]
fn tuner_init_and_chunk_fields_are_written_whole_and_only_where_allowed() {
    let store = |off: i16, size: u8| {
        vec![
            mov64_imm(2, 7),
            stx(size, 1, off, 2),
            mov64_imm(0, 0),
            exit(),
        ]
    };
    // Every constant, first and last of NCCL's 144, whole.
    for off in [32, 32 + 8 * 21, 32 + 8 * 143] {
        assert_eq!(verdict("tuner/init", &store(off, op::DW)), Ok(()), "{off}");
    }
    let refused = |section: &str, prog: &[Insn], kind: &str| {
        let e = verdict(section, prog).expect_err("accepted");
        assert!(e.starts_with(&format!("{kind} |")), "{section}: {e}");
    };
    // The header (comm id, shape, NVL domains) is read-only; half a constant is no write;
    // past the last constant is outside the context.
    refused("tuner/init", &store(0, op::DW), "ctx_read_only");
    refused("tuner/init", &store(16, op::W), "ctx_read_only");
    refused("tuner/init", &store(36, op::W), "ctx_out_of_bounds");
    refused(
        "tuner/init",
        &store(32 + 8 * 144, op::DW),
        "ctx_out_of_bounds",
    );
    assert_eq!(verdict("tuner/chunk", &store(40, op::DW)), Ok(()));
    for off in [0i16, 20, 24, 28] {
        let size = if off == 0 { op::DW } else { op::W };
        refused("tuner/chunk", &store(off, size), "ctx_read_only");
    }
    // Clocks stay out of every tuner hook.
    let clock = [call(5), mov64_imm(0, 0), exit()];
    refused("tuner/init", &clock, "helper_not_allowed");
    refused("tuner/chunk", &clock, "helper_not_allowed");
}
