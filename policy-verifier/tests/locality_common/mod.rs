//! What the locality tests share: their maps, the program prelude, verdicts.
#![allow(dead_code)]

use policy_object::Insn;
use policy_object::Scope;
use policy_object::insn::build::{alu64_imm, call, ld_map, ld_map_value, mov64_reg, st};
use policy_object::insn::{ADD, W};
use policy_verifier::platform::{MapInfo, hook};
use policy_verifier::{Limits, verify_insns};

pub const BSS: i32 = 0; // .bss: writable global data, rank-local
pub const RODATA: i32 = 1; // .rodata: config
pub const AGREED: i32 = 2; // an agreed array (value 64 bytes)
pub const NET: i32 = 3; // a rank-local hash map (key 4, value 8), e.g. counters the net hooks fill
pub const CFG: i32 = 4; // a config map (key 4, value 8)
pub const COUNTS: i32 = 5; // a rank-local array (key 4, value 8): every key below 1 has an entry

pub fn maps() -> Vec<MapInfo> {
    let m = |name: &str, global: bool, ro: bool, scope, vs: u32| MapInfo {
        name: name.into(),
        key_size: 4,
        value_size: vs,
        max_entries: 1,
        read_only: ro,
        global_data: global,
        array: global,
        scope,
    };
    vec![
        m(".bss", true, false, Scope::Local, 64),
        m(".rodata", true, true, Scope::Config, 64),
        m("agreed", false, false, Scope::Agreed, 64),
        m("net_lat", false, false, Scope::Local, 8),
        m("cfg", false, false, Scope::Config, 8),
        MapInfo {
            array: true,
            ..m("counts", false, false, Scope::Local, 8)
        },
    ]
}

/// Instructions before the body: `r9 = ctx; r6 = &.bss; r7 = &.rodata`.
pub const PRELUDE: usize = 5;

/// The prelude, then `body` (instructions 5.. of the program).
pub fn program(body: &[Insn]) -> Vec<Insn> {
    let mut v = vec![mov64_reg(9, 1)];
    v.extend(ld_map_value(6, BSS, 0));
    v.extend(ld_map_value(7, RODATA, 0));
    v.extend_from_slice(body);
    v
}

/// `fp-4 = 0; r0 = bpf_map_lookup_elem(&net_lat, &fp-4)`: instructions 5..=10 after the
/// prelude, the result (rank-local: its presence is this rank's own) in r0.
pub fn lookup_net() -> Vec<Insn> {
    let mut v = vec![st(W, 10, -4, 0)]; // 5
    v.extend(ld_map(1, NET)); // 6, 7
    v.push(mov64_reg(2, 10)); // 8
    v.push(alu64_imm(ADD, 2, -4)); // 9
    v.push(call(1)); // 10
    v
}

/// `Err((kind, insn, message))` when rejected.
pub fn verdict(section: &str, insns: &[Insn]) -> Result<(), (String, usize, String)> {
    let h = hook(section).unwrap();
    verify_insns(insns, h, &maps(), Limits::default())
        .map(|_| ())
        .map_err(|e| (e.kind().to_string(), e.insn, e.to_string()))
}

/// Rejected at `section` with `kind` (`SHOW_REJECTIONS=1` prints the message).
#[track_caller]
pub fn rejects_in(section: &str, name: &str, insns: &[Insn], kind: &str) {
    match verdict(section, insns) {
        Err((k, _, text)) => {
            if std::env::var_os("SHOW_REJECTIONS").is_some() {
                eprintln!("{name}: {text}\n");
            }
            assert!(k == kind, "{name}: want {kind}, got {k}:\n{text}")
        }
        Ok(()) => panic!("{name}: ACCEPTED, want {kind}"),
    }
}

#[track_caller]
pub fn rejects(name: &str, insns: &[Insn], kind: &str) {
    rejects_in("tuner", name, insns, kind)
}

/// Rejected as a tuner program with `kind` at instruction `at`.
#[track_caller]
pub fn rejects_at(name: &str, insns: &[Insn], kind: &str, at: usize) {
    match verdict("tuner", insns) {
        Err((k, i, text)) => assert!(
            k == kind && i == at,
            "{name}: want {kind} at {at}, got {k} at {i}:\n{text}"
        ),
        Ok(()) => panic!("{name}: accepted, want {kind} at {at}"),
    }
}

#[track_caller]
pub fn accepts(name: &str, insns: &[Insn]) {
    if let Err((_, _, text)) = verdict("tuner", insns) {
        panic!("{name}: rejected:\n{text}");
    }
}
