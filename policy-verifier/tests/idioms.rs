//! Ordinary clang idioms the verifier used to refuse (issue 38, parts 4-6), in hand-made
//! bytecode at their edges: what a subprogram's `exit` hands back to its caller, `|` on a
//! stack pointer, and the context tables against `policies/include/ncclbpf.h`. The C programs
//! of the same classes are in policies/safe and policies/unsafe (see policies/CORPUS.md).

mod common;
use common::*;
use policy_object::insn::build::{
    alu32_reg, alu64_imm, alu64_reg, call, call_local, exit, ld_map, ldx, mov64_imm, mov64_reg, st,
};
use policy_object::insn::{self as op, Insn};
use policy_verifier::platform::HOOKS;
use std::fmt::Write as _;

fn accepted(section: &str, p: &[Insn]) {
    if let Err(e) = verdict(section, p) {
        panic!("refused: {e}\n{}", listing(p));
    }
}

fn refused(section: &str, p: &[Insn], kind: &str) {
    match verdict(section, p) {
        Ok(()) => panic!("accepted, expected {kind}\n{}", listing(p)),
        Err(e) => assert!(e.starts_with(kind), "{e}, expected {kind}\n{}", listing(p)),
    }
}

// ------------------------------------------------------------------ exit of a subprogram

/// `main` then `callee`, `call` pointing at `callee`.
fn with_callee(main: &[Insn], callee: &[Insn]) -> Vec<Insn> {
    let at = main
        .iter()
        .position(|i| i.code == op::JMP | op::CALL && i.src == 1)
        .expect("main calls the callee");
    let mut m = main.to_vec();
    m[at] = call_local((main.len() - at - 1) as i32);
    cat(&[&m, callee])
}

#[test]
fn a_pointer_into_the_callers_stack_comes_back_usable() {
    let main = [
        st(op::DW, 10, -8, 42),
        mov64_reg(1, 10),
        alu64_imm(op::ADD, 1, -8),
        call_local(0),
        ldx(op::DW, 0, 0, 0),
        exit(),
    ];
    accepted("net/isend", &with_callee(&main, &[mov64_reg(0, 1), exit()]));
    // ... through two frames: the innermost returns frame 0's pointer to frame 1, which
    // returns it to frame 0.
    let middle = [call_local(1), exit()];
    let inner = [mov64_reg(0, 1), exit()];
    accepted("tuner", &with_callee(&main, &cat(&[&middle, &inner])));
}

#[test]
fn a_pointer_into_the_callees_own_stack_dies_at_its_exit() {
    let callee = [
        st(op::DW, 10, -8, 7),
        mov64_reg(0, 10),
        alu64_imm(op::ADD, 0, -8),
        exit(),
    ];
    // Read by the caller: refused at the read.
    let read = [call_local(0), ldx(op::DW, 0, 0, 0), exit()];
    refused("net/isend", &with_callee(&read, &callee), "uninit_register");
    // Kept in another register, or passed on as an argument: refused at the copy.
    let keep = [call_local(0), mov64_reg(6, 0), mov64_imm(0, 0), exit()];
    refused("tuner", &with_callee(&keep, &callee), "uninit_register");
    // Not read (a void function): fine.
    let void = [call_local(0), mov64_imm(0, 0), exit()];
    accepted("net/isend", &with_callee(&void, &callee));
    // From depth 2 to depth 1: the middle frame may not read it either.
    let main = [call_local(0), mov64_imm(0, 0), exit()];
    let middle = [call_local(2), ldx(op::DW, 0, 0, 0), exit()];
    let middle_void = [call_local(2), mov64_imm(0, 1), exit()];
    refused(
        "net/close",
        &with_callee(&main, &cat(&[&middle, &callee])),
        "uninit_register",
    );
    accepted(
        "net/close",
        &with_callee(&main, &cat(&[&middle_void, &callee])),
    );
}

/// `r0 = lookup(arr, 0)`, not null-checked, then exit: a subprogram returning the result.
fn returns_lookup() -> Vec<Insn> {
    let mut v = vec![
        st(op::W, 10, -4, 0),
        mov64_reg(2, 10),
        alu64_imm(op::ADD, 2, -4),
    ];
    v.extend(ld_map(1, ARR));
    v.extend([call(1), exit()]);
    v
}

#[test]
fn a_map_value_comes_back_with_its_type_and_bounds() {
    let callee = returns_lookup();
    // NULL-checked by the caller: fine, at any offset inside the 32-byte value.
    let checked = [
        call_local(0),
        op_jeq_0_exit(),
        ldx(op::DW, 0, 0, 24),
        exit(),
        mov64_imm(0, 0),
        exit(),
    ];
    accepted("net/complete", &with_callee(&checked, &callee));
    accepted("tuner", &with_callee(&checked, &callee));
    // Not checked: the caller's read is refused as a possible NULL dereference.
    let unchecked = [call_local(0), ldx(op::DW, 0, 0, 0), exit()];
    refused(
        "net/complete",
        &with_callee(&unchecked, &callee),
        "null_deref",
    );
    // Checked, but read past the value's end: the bounds came back with it.
    let past = [
        call_local(0),
        op_jeq_0_exit(),
        ldx(op::DW, 0, 0, 32),
        exit(),
        mov64_imm(0, 0),
        exit(),
    ];
    refused(
        "net/complete",
        &with_callee(&past, &callee),
        "map_out_of_bounds",
    );
    // Returned to the hook: still a pointer leak.
    let leak = [call_local(0), exit()];
    refused("net/complete", &with_callee(&leak, &callee), "pointer_leak");
}

/// `if r0 == 0 goto +2` (to the `r0 = 0; exit` the callers above end with).
fn op_jeq_0_exit() -> Insn {
    policy_object::insn::build::jmp_imm(op::JEQ, 0, 0, 2)
}

#[test]
fn the_context_comes_back_as_the_context() {
    let callee = [mov64_reg(0, 1), exit()];
    let read = [mov64_reg(6, 1), call_local(0), ldx(op::W, 0, 0, 48), exit()];
    accepted("net/complete", &with_callee(&read, &callee));
    // Its fields keep their rights: proto is writable in a tuner, coll_type is not.
    let write = |off: i16| vec![call_local(0), st(op::W, 0, off, 1), mov64_imm(0, 0), exit()];
    accepted("tuner", &with_callee(&write(44), &callee));
    refused("tuner", &with_callee(&write(16), &callee), "ctx_read_only");
}

// ------------------------------------------------------------------ `|` on a stack pointer

/// r2 = the net context's `dev` masked with `mask`; fp-16..0 written; r3 = fp + `at`.
fn or_prelude(mask: i32, at: i32) -> Vec<Insn> {
    vec![
        ldx(op::W, 2, 1, 32),
        alu64_imm(op::AND, 2, mask),
        st(op::DW, 10, -8, 0),
        st(op::DW, 10, -16, 0),
        mov64_reg(3, 10),
        alu64_imm(op::ADD, 3, at),
    ]
}

#[test]
fn or_into_an_8_aligned_stack_pointer_is_an_add() {
    for at in [-8, -16] {
        // fp-8 | [0, 7], fp-16 | [0, 7]: one byte read and written there.
        let p = cat(&[
            &or_prelude(7, at),
            &[
                alu64_reg(op::OR, 3, 2),
                st(op::B, 3, 0, 1),
                ldx(op::B, 0, 3, 0),
                exit(),
            ],
        ]);
        accepted("net/isend", &p);
        accepted("tuner", &p);
    }
    // The scalar on the left (`r2 |= r3`): the same address.
    let p = cat(&[
        &or_prelude(7, -8),
        &[alu64_reg(op::OR, 2, 3), ldx(op::B, 0, 2, 0), exit()],
    ]);
    accepted("net/complete", &p);
    // A constant: `fp-16 | 6` is fp-10, a 2-byte read there stays inside the frame.
    let p = cat(&[
        &or_prelude(7, -16),
        &[alu64_imm(op::OR, 3, 6), ldx(op::H, 0, 3, 0), exit()],
    ]);
    accepted("net/complete", &p);
    // In a subprogram's own frame.
    let callee = cat(&[
        &or_prelude(3, -8),
        &[alu64_reg(op::OR, 3, 2), ldx(op::W, 0, 3, 0), exit()],
    ]);
    let main = [call_local(0), exit()];
    accepted("net/close", &with_callee(&main, &callee));
}

#[test]
fn or_keeps_the_offset_it_added() {
    // fp-8 | [0, 7], then a 2-byte read: may reach fp+1, outside the frame.
    let p = cat(&[
        &or_prelude(7, -8),
        &[alu64_reg(op::OR, 3, 2), ldx(op::H, 0, 3, 0), exit()],
    ]);
    refused("net/isend", &p, "stack_out_of_bounds");
}

#[test]
fn or_is_refused_where_it_may_not_be_an_add() {
    let or_then_read = |pre: Vec<Insn>| {
        cat(&[
            &pre,
            &[alu64_reg(op::OR, 3, 2), ldx(op::B, 0, 3, 0), exit()],
        ])
    };
    // A stack offset that is not a multiple of 8 (-12: 4-aligned only).
    refused(
        "net/isend",
        &or_then_read(or_prelude(3, -12)),
        "pointer_arithmetic",
    );
    // A scalar that may reach bit 3.
    refused(
        "net/isend",
        &or_then_read(or_prelude(15, -16)),
        "pointer_arithmetic",
    );
    refused(
        "net/isend",
        &or_then_read(or_prelude(8, -16)),
        "pointer_arithmetic",
    );
    // A stack pointer that already has a variable part.
    let mut pre = or_prelude(7, -16);
    pre.extend([ldx(op::W, 4, 1, 36), alu64_imm(op::AND, 4, 8)]);
    pre.push(alu64_reg(op::ADD, 3, 4));
    refused("net/isend", &or_then_read(pre), "pointer_arithmetic");
    // A scalar with no bound at all.
    let mut pre = or_prelude(7, -16);
    pre.push(ldx(op::DW, 2, 1, 8));
    refused("net/isend", &or_then_read(pre), "pointer_arithmetic");
    // 32-bit `|`.
    let p = cat(&[
        &or_prelude(7, -8),
        &[alu32_reg(op::OR, 3, 2), mov64_imm(0, 0), exit()],
    ]);
    refused("net/isend", &p, "pointer_arithmetic");
    // The context.
    let p = [
        ldx(op::W, 2, 1, 32),
        alu64_imm(op::AND, 2, 7),
        alu64_reg(op::OR, 1, 2),
        ldx(op::B, 0, 1, 0),
        exit(),
    ];
    refused("net/isend", &p, "pointer_arithmetic");
    // A map value (32 bytes, 8-aligned offset 0).
    let p = cat(&[
        &[ldx(op::W, 7, 1, 32), alu64_imm(op::AND, 7, 7)],
        &lookup(6, 0),
        &[alu64_reg(op::OR, 6, 7), ldx(op::B, 0, 6, 0), exit()],
    ]);
    refused("net/isend", &p, "pointer_arithmetic");
    // Two pointers.
    let p = cat(&[
        &or_prelude(7, -8),
        &[alu64_reg(op::OR, 3, 10), mov64_imm(0, 0), exit()],
    ]);
    refused("net/isend", &p, "pointer_arithmetic");
}

// ------------------------------------------------------------------ context tables

/// Every hook's field table covers its context exactly: fields in order, each starting where
/// the previous one ends, the last ending at the context's size. The runtime fills every byte
/// of every context (its `#[repr(C)]` structs have no padding), so a byte no field covers is a
/// field missing from the table (as `reserved` was in the net context).
#[test]
fn every_field_table_tiles_its_context() {
    for h in HOOKS {
        let mut at = 0;
        for f in h.fields {
            assert_eq!(
                f.offset, at,
                "{}: field '{}' at {}, the previous field ends at {at}",
                h.section, f.name, f.offset
            );
            assert!(f.size > 0, "{}: empty field '{}'", h.section, f.name);
            at = f.offset + f.size;
        }
        assert_eq!(
            at, h.ctx_size,
            "{}: fields end before the context",
            h.section
        );
    }
}

/// The C struct each hook's program receives.
fn ctx_struct(section: &str) -> &'static str {
    match section {
        "tuner" => "ncclbpf_tuner_ctx",
        "tuner/chunk" => "ncclbpf_tuner_chunk_ctx",
        "tuner/init" => "ncclbpf_tuner_init_ctx",
        "tuner/epoch" => "ncclbpf_tuner_epoch_ctx",
        s if s.starts_with("net/") => "ncclbpf_net_ctx",
        s if s.starts_with("profiler/") => "ncclbpf_profiler_ctx",
        s => panic!("no context struct known for '{s}'"),
    }
}

/// Every hook's table against the header, compiled: each field lies in the member of its name
/// (array members are split into one field per 8-byte entry), and the struct is as long as
/// the context. With [`every_field_table_tiles_its_context`], no member is missing either.
#[test]
fn field_tables_match_the_header() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut c = String::from("#include \"ncclbpf.h\"\n#define OFF __builtin_offsetof\n");
    let mut seen = std::collections::HashSet::new();
    for h in HOOKS {
        let s = ctx_struct(h.section);
        if !seen.insert(s) {
            continue;
        }
        let _ = writeln!(
            c,
            "_Static_assert(sizeof(struct {s}) == {}, \"{s}: size\");",
            h.ctx_size
        );
        for f in h.fields {
            let m = f.name;
            let size = format!("sizeof(((struct {s} *)0)->{m})");
            // A field lies inside member `m` (all of it, unless `m` is an array split into
            // entries of the field's size).
            let _ = writeln!(
                c,
                "_Static_assert(OFF(struct {s}, {m}) <= {o} && {o} + {z} <= OFF(struct {s}, {m}) + {size} \
                 && ({o} - OFF(struct {s}, {m})) % {z} == 0 \
                 && ({size} == {z} || {size} % {z} == 0 && {z} == 8), \"{s}.{m} at {o} size {z}\");",
                o = f.offset,
                z = f.size,
            );
        }
    }
    let out = std::process::Command::new("clang")
        .args(["-target", "bpf", "-fsyntax-only", "-x", "c", "-I"])
        .arg(root.join("policies/include"))
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().expect("piped").write_all(c.as_bytes())?;
            child.wait_with_output()
        })
        .expect("clang runs (policies/build.sh installs it)");
    assert!(
        out.status.success(),
        "the field tables disagree with ncclbpf.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
