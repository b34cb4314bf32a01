//! Hand-made bytecode that clang never emits: malformed control flow at the program's end,
//! subprogram boundaries, nonzero reserved fields on every instruction class, helpers on the
//! `.rodata` map. Each case must be rejected with the stated kind at the stated instruction,
//! and none may panic the verifier.

use policy_object::Insn;
use policy_object::insn::build::{
    alu64_imm, call, call_local, exit, insn, ja, jmp_imm, jmp32_imm, ld_map, ldx, mov64_imm,
    mov64_reg, stx,
};
use policy_object::insn::{
    ADD, ALU, ALU64, B, CALL, DW, END, EXIT, JA, JEQ, JMP, JMP32, K, LDDW, LDX, MEM, MOV,
    PSEUDO_CALL, ST, STX, W, X,
};
use policy_verifier::platform::{MapInfo, hook};
use policy_verifier::{Limits, verify_insns};
use std::panic::{AssertUnwindSafe, catch_unwind};

struct Case {
    name: &'static str,
    hook: &'static str,
    insns: Vec<Insn>,
    maps: Vec<MapInfo>,
    kind: &'static str,
    insn: usize,
}

fn case(name: &'static str, insns: Vec<Insn>, kind: &'static str, insn: usize) -> Case {
    Case {
        name,
        hook: "tuner",
        insns,
        maps: vec![],
        kind,
        insn,
    }
}

/// `r0 = 0; r2 = 0; *(u64 *)(r10 - 8) = r2` and then `bad`, then `r0 = 0; exit`: every register
/// and slot `bad` could use is initialized, so only its encoding is wrong. `bad` is insn 3.
/// A net hook, so that helper 5 (bpf_ktime_get_ns) is allowed.
fn reserved(name: &'static str, bad: Insn) -> Case {
    let mut c = case(
        name,
        vec![
            mov64_imm(0, 0),
            mov64_imm(2, 0),
            stx(DW, 10, -8, 2),
            bad,
            mov64_imm(0, 0),
            exit(),
        ],
        "bad_insn",
        3,
    );
    c.hook = "net/isend";
    c
}

fn rodata() -> Vec<MapInfo> {
    vec![MapInfo {
        name: ".rodata".into(),
        key_size: 4,
        value_size: 8,
        max_entries: 1,
        read_only: true,
        scope: policy_object::Scope::Config,
        global_data: true,
        array: false,
    }]
}

fn cases() -> Vec<Case> {
    let mut v = vec![
        // ---- control flow at the end of the program
        // r0 = ctx->coll_type; if r0 == 0 goto 0 -- and when it is not 0, past the end.
        case(
            "conditional jump as the last insn",
            vec![ldx(W, 0, 1, 16), jmp_imm(JEQ, 0, 0, -2)],
            "fall_off_end",
            1,
        ),
        case(
            "jmp32 as the last insn",
            vec![ldx(W, 0, 1, 16), jmp32_imm(JEQ, 0, 1, -2)],
            "fall_off_end",
            1,
        ),
        case("no exit at all", vec![mov64_imm(0, 0)], "fall_off_end", 0),
        case(
            "ja to the last insn + 1",
            vec![mov64_imm(0, 0), ja(1), exit()],
            "jump_out_of_range",
            1,
        ),
        case(
            "conditional jump to the last insn + 1",
            vec![mov64_imm(0, 0), jmp_imm(JEQ, 0, 0, 1), exit()],
            "jump_out_of_range",
            1,
        ),
        case(
            "jump to -1",
            vec![mov64_imm(0, 0), jmp_imm(JEQ, 0, 0, -3), exit()],
            "jump_out_of_range",
            1,
        ),
        case(
            "call to the last insn + 1",
            vec![call_local(1), exit()],
            "jump_out_of_range",
            0,
        ),
        case(
            "lddw as the last insn",
            vec![mov64_imm(0, 0), exit(), insn(LDDW, 1, 0, 0, 1)],
            "bad_insn",
            2,
        ),
        // ---- subprogram boundaries
        case(
            "main falls into its callee",
            // 0: call 2; 1: r0 = 0 (no exit); 2: r0 = 1; 3: exit
            vec![call_local(1), mov64_imm(0, 0), mov64_imm(0, 1), exit()],
            "bad_subprog",
            1,
        ),
        case(
            "callee's last insn is a conditional jump, another callee follows",
            // 0: call 4; 1: call 6; 2: r0 = 0; 3: exit; 4: r0 = 1; 5: if r0 == 2 goto 4;
            // 6: r0 = 2; 7: exit
            vec![
                call_local(3),
                call_local(4),
                mov64_imm(0, 0),
                exit(),
                mov64_imm(0, 1),
                jmp_imm(JEQ, 0, 2, -2),
                mov64_imm(0, 2),
                exit(),
            ],
            "bad_subprog",
            5,
        ),
        case(
            "jump from main into its callee",
            // 0: call 3; 1: ja 4; 2: exit; 3: r0 = 1; 4: exit
            vec![call_local(2), ja(2), exit(), mov64_imm(0, 1), exit()],
            "bad_subprog",
            1,
        ),
        case(
            "jump from a callee into main",
            // 0: call 3; 1: r0 = 0; 2: exit; 3: r0 = 1; 4: ja 2
            vec![
                call_local(2),
                mov64_imm(0, 0),
                exit(),
                mov64_imm(0, 1),
                ja(-3),
            ],
            "bad_subprog",
            4,
        ),
        // ---- reserved fields, one instruction class at a time
        reserved("ALU64 K with src != 0", insn(ALU64 | K, 0, 1, 0, 1)),
        reserved("ALU32 K with src != 0", insn(ALU | MOV | K, 0, 2, 0, 1)),
        reserved("ALU64 X with imm != 0", insn(ALU64 | X, 0, 2, 0, 1)),
        reserved("ALU32 X with imm != 0", insn(ALU | MOV | X, 0, 2, 0, 7)),
        reserved("ALU64 add with off != 0", insn(ALU64 | K, 0, 0, 1, 1)),
        reserved("ALU32 or with off != 0", insn(ALU | 0x40 | K, 0, 0, 4, 1)),
        reserved(
            "mov with off 1 (movsx takes 8/16/32)",
            insn(ALU64 | MOV | X, 0, 2, 1, 0),
        ),
        reserved(
            "div with off 2 (sdiv is off 1)",
            insn(ALU64 | 0x30 | K, 0, 0, 2, 3),
        ),
        reserved("neg with imm != 0", insn(ALU64 | 0x80, 0, 0, 0, 1)),
        reserved("neg with src != 0", insn(ALU64 | 0x80, 0, 2, 0, 0)),
        reserved("byte swap with src != 0", insn(ALU | END, 0, 2, 0, 16)),
        reserved("byte swap with off != 0", insn(ALU | END, 0, 0, 1, 16)),
        reserved("LDX with imm != 0", insn(LDX | MEM | DW, 0, 10, -8, 1)),
        reserved(
            "LDX with an unknown mode",
            insn(LDX | 0x40 | W, 0, 10, -8, 0),
        ),
        reserved("ST with src != 0", insn(ST | MEM | DW, 10, 1, -8, 0)),
        reserved("STX with imm != 0", insn(STX | MEM | DW, 10, 2, -8, 1)),
        reserved("STX byte with imm != 0", insn(STX | MEM | B, 10, 2, -8, 3)),
        reserved("JA with src != 0", insn(JMP | JA, 0, 1, 0, 0)),
        reserved("JA with dst != 0", insn(JMP | JA, 1, 0, 0, 0)),
        reserved("JA with imm != 0", insn(JMP | JA, 0, 0, 0, 1)),
        reserved("JEQ K with src != 0", insn(JMP | JEQ | K, 0, 2, 0, 0)),
        reserved("JEQ X with imm != 0", insn(JMP | JEQ | X, 0, 2, 0, 1)),
        reserved(
            "JMP32 JEQ K with src != 0",
            insn(JMP32 | JEQ | K, 0, 2, 0, 0),
        ),
        reserved("EXIT with dst != 0", insn(JMP | EXIT, 1, 0, 0, 0)),
        reserved("EXIT with src != 0", insn(JMP | EXIT, 0, 1, 0, 0)),
        reserved("EXIT with off != 0", insn(JMP | EXIT, 0, 0, 1, 0)),
        reserved("EXIT with imm != 0", insn(JMP | EXIT, 0, 0, 0, 1)),
        reserved("EXIT with the X bit", insn(JMP | EXIT | X, 0, 0, 0, 0)),
        reserved("helper call with src 2", insn(JMP | CALL, 0, 2, 0, 5)),
        reserved("helper call with dst != 0", insn(JMP | CALL, 1, 0, 0, 5)),
        reserved("helper call with off != 0", insn(JMP | CALL, 0, 0, 1, 5)),
        reserved(
            "call with the X bit (0x8d)",
            insn(JMP | CALL | X, 0, 0, 0, 5),
        ),
        reserved(
            "pseudo call with off != 0",
            insn(JMP | CALL, 0, PSEUDO_CALL, 1, 0),
        ),
        reserved(
            "pseudo call with dst != 0",
            insn(JMP | CALL, 1, PSEUDO_CALL, 0, 0),
        ),
    ];
    // lddw: reserved fields of either half (the second half is all zero but its imm).
    for (name, first, second) in [
        (
            "lddw with off != 0",
            insn(LDDW, 1, 0, 1, 5),
            insn(0, 0, 0, 0, 0),
        ),
        (
            "lddw second half with off != 0",
            insn(LDDW, 1, 0, 0, 5),
            insn(0, 0, 0, 1, 0),
        ),
        (
            "lddw second half with src != 0",
            insn(LDDW, 1, 0, 0, 5),
            insn(0, 0, 1, 0, 0),
        ),
        (
            "lddw second half with dst != 0",
            insn(LDDW, 1, 0, 0, 5),
            insn(0, 1, 0, 0, 0),
        ),
        (
            "lddw second half with code != 0",
            insn(LDDW, 1, 0, 0, 5),
            mov64_imm(0, 0),
        ),
    ] {
        v.push(case(
            name,
            vec![first, second, mov64_imm(0, 0), exit()],
            "bad_insn",
            0,
        ));
    }
    // .rodata through helpers: lddw src 1 gives the map itself.
    let key_and_value = [
        mov64_imm(1, 0),
        stx(W, 10, -4, 1),
        stx(DW, 10, -16, 1),
        mov64_reg(2, 10),
        alu64_imm(ADD, 2, -4),
    ];
    let mut update = key_and_value.to_vec();
    update.extend([mov64_reg(3, 10), alu64_imm(ADD, 3, -16), mov64_imm(4, 0)]);
    update.extend(ld_map(1, 0));
    update.extend([call(2), mov64_imm(0, 0), exit()]);
    let mut delete = key_and_value.to_vec();
    delete.extend(ld_map(1, 0));
    delete.extend([call(3), mov64_imm(0, 0), exit()]);
    v.push(Case {
        name: "bpf_map_update_elem on .rodata",
        hook: "net/isend",
        insns: update,
        maps: rodata(),
        kind: "map_read_only",
        insn: 10,
    });
    v.push(Case {
        name: "bpf_map_delete_elem on .rodata",
        hook: "tuner",
        insns: delete,
        maps: rodata(),
        kind: "map_read_only",
        insn: 7,
    });
    v
}

#[test]
fn adversarial_bytecode_is_rejected_without_panics() {
    let mut failures = vec![];
    let all = cases();
    for c in &all {
        let h = hook(c.hook).unwrap();
        // Boxed: a rejection carries its whole diagnosis.
        match catch_unwind(AssertUnwindSafe(|| {
            verify_insns(&c.insns, h, &c.maps, Limits::default()).map_err(Box::new)
        })) {
            Err(_) => failures.push(format!("{}: the verifier panicked", c.name)),
            Ok(Ok(_)) => failures.push(format!(
                "{}: accepted, expected {} at insn {}",
                c.name, c.kind, c.insn
            )),
            Ok(Err(e)) => {
                println!("{}: {} at insn {}: {}", c.name, e.kind(), e.insn, e.reject);
                if e.kind() != c.kind || e.insn != c.insn {
                    failures.push(format!(
                        "{}: rejected as {} at insn {} ({}), expected {} at insn {}",
                        c.name,
                        e.kind(),
                        e.insn,
                        e.reject,
                        c.kind,
                        c.insn
                    ));
                }
            }
        }
    }
    assert!(all.len() >= 50, "only {} cases", all.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
