//! What the raw-bytecode verifier tests share: a set of maps, a null-checked lookup, the
//! verdict for a hook, and listings.
// Each test file uses part of it.
#![allow(dead_code)]

use policy_object::insn::build::{
    alu64_imm, call, exit, jmp_imm, ld_map, mov64_imm, mov64_reg, st,
};
use policy_object::insn::{self as op, Insn};
use policy_verifier::platform::{HOOKS, MapInfo};
use policy_verifier::{Limits, verify_insns};

pub const ARR: i32 = 0; // array, 4-byte key, 32-byte value
pub const RODATA: i32 = 1; // .rodata, read only
pub const SMALL: i32 = 2; // 8-byte key, 8-byte value
pub const DATA: i32 = 3; // .data, writable global data

pub fn maps() -> Vec<MapInfo> {
    let m = |name: &str, key_size, value_size, max_entries, read_only, global_data| MapInfo {
        name: name.into(),
        key_size,
        value_size,
        max_entries,
        read_only,
        scope: if read_only {
            policy_object::Scope::Config
        } else {
            policy_object::Scope::Local
        },
        global_data,
        array: false,
    };
    vec![
        m("arr", 4, 32, 4, false, false),
        m(".rodata", 4, 16, 1, true, true),
        m("small", 8, 8, 16, false, false),
        m(".data", 4, 64, 1, false, true),
    ]
}

/// `r{d} = lookup(arr, key)` with the key at fp-4, null-checked: on NULL the program exits 0.
/// Clobbers r0-r5.
pub fn lookup(d: u8, key: i32) -> Vec<Insn> {
    let mut v = vec![
        st(op::W, 10, -4, key),
        mov64_reg(2, 10),
        alu64_imm(op::ADD, 2, -4),
    ];
    v.extend(ld_map(1, ARR));
    v.extend([
        call(1),
        mov64_reg(d, 0),
        jmp_imm(op::JNE, d, 0, 2),
        mov64_imm(0, 0),
        exit(),
    ]);
    v
}

/// Ok, or the rejection as "kind | message".
pub fn verdict(section: &str, prog: &[Insn]) -> Result<(), String> {
    let hook = HOOKS.iter().find(|h| h.section == section).unwrap();
    verify_insns(prog, hook, &maps(), Limits::default())
        .map(|_| ())
        .map_err(|e| format!("{} | {e}", e.kind()))
}

pub fn listing(p: &[Insn]) -> String {
    (0..p.len())
        .map(|k| format!("{k:3}: {}", op::disasm(p, k)))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn cat(parts: &[&[Insn]]) -> Vec<Insn> {
    parts.iter().flat_map(|p| p.iter().copied()).collect()
}
