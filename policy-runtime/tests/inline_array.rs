//! The JIT's inline array lookups (`map_lookup_elem` on an array map known at the call site,
//! computed in the compiled code instead of calling the helper) against the interpreter and
//! against the helper itself, at every boundary: index 0, max_entries - 1, max_entries,
//! u32::MAX, 64-bit keys with high bits set (the helper reads the key's first four bytes),
//! value sizes that are not multiples of 8, one- and many-entry arrays; and the cases that
//! must keep the helper (PERCPU arrays, a call reached with different maps, hash maps).

mod common;
use common::{dump, object, registry};
use policy_object::insn::build::*;
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, MapKind, Object, Program};
use policy_runtime::{LoadOptions, LoadedProgram, Tier, TunerCtx};
use shared_maps::Map;
use std::sync::Arc;

fn opts(tier: Tier) -> LoadOptions {
    LoadOptions {
        tier,
        ..LoadOptions::default()
    }
}

fn array(name: &str, kind: MapKind, value_size: u32, max_entries: u32) -> MapDef {
    MapDef {
        name: name.into(),
        kind,
        key_size: 4,
        value_size,
        max_entries,
        flags: 0,
        initial: None,
        read_only: false,
        scope: policy_object::Scope::Local,
        source: None,
        reduce: policy_object::Reduce::Sum,
    }
}

/// How the program builds its key and reaches the call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// The context's 64-bit `msg_size` stored whole at r10-8: the lookup reads its low half.
    Key64,
    /// Its low 32 bits stored at r10-4.
    Key32,
    /// Key64, with the key pointer set up between the `lddw` and the call.
    Key64Apart,
    /// Key64, r1 set to map 0 or map 1 on two paths that merge at the call (the helper
    /// must be called: the map is not known there).
    Merge,
}

/// r0 = (lookup(key) ? 1 + old last byte of the value : 0); the value's first and last
/// bytes set to the low byte of `comm_id`.
fn program(shape: Shape, value_size: u32) -> Vec<Insn> {
    let last = value_size as i16 - 1;
    let mut p = vec![mov64_reg(6, 1), ldx(op::DW, 7, 6, 0)];
    let key_off = if shape == Shape::Key32 { -4 } else { -8 };
    p.push(if shape == Shape::Key32 {
        stx(op::W, 10, -4, 7)
    } else {
        stx(op::DW, 10, -8, 7)
    });
    match shape {
        Shape::Key64 | Shape::Key32 => {
            p.extend([mov64_reg(2, 10), alu64_imm(op::ADD, 2, key_off)]);
            p.extend(ld_map(1, 0));
        }
        Shape::Key64Apart => {
            p.extend(ld_map(1, 0));
            p.extend([mov64_reg(2, 10), alu64_imm(op::ADD, 2, key_off)]);
        }
        Shape::Merge => {
            // if r7 & 1: r1 = map 1, else r1 = map 0; then the call.
            p.push(jmp_imm(op::JSET, 7, 1, 3));
            p.extend(ld_map(1, 0));
            p.push(ja(2));
            p.extend(ld_map(1, 1));
            p.extend([mov64_reg(2, 10), alu64_imm(op::ADD, 2, key_off)]);
        }
    }
    p.extend([
        call(1),
        jmp_imm(op::JEQ, 0, 0, 7),
        ldx(op::B, 3, 0, last),
        ldx(op::DW, 4, 6, 8),
        stx(op::B, 0, 0, 4),
        stx(op::B, 0, last, 4),
        mov64_reg(0, 3),
        alu64_imm(op::ADD, 0, 1),
        exit(),
        mov64_imm(0, 0),
        exit(),
    ]);
    p
}

fn object_of(insns: Vec<Insn>, maps: Vec<MapDef>) -> Object {
    Object {
        programs: vec![Program {
            name: "lookup".into(),
            section: "tuner".into(),
            insns,
            lines: vec![],
        }],
        maps,
    }
}

/// Entry `k` of an array filled with bytes `k * 7 + i` (so every entry reads differently).
fn fill(m: &Map) {
    let (vs, n) = (m.spec().value_size as usize, m.spec().max_entries);
    for k in 0..n {
        let v: Vec<u8> = (0..vs).map(|i| (k as usize * 7 + i) as u8 | 0x80).collect();
        m.update(&k.to_le_bytes(), &v, shared_maps::BPF_ANY)
            .unwrap();
    }
}

/// The helper's answer for `key` (its bytes as the program stored them).
fn helper_lookup(m: &Arc<Map>, key: &[u8]) -> u64 {
    policy_runtime::helpers::map_lookup_elem(Arc::as_ptr(m) as u64, key.as_ptr() as u64, 0, 0, 0)
}

fn keys(max_entries: u32) -> Vec<u64> {
    let n = u64::from(max_entries);
    let mut k = vec![
        0,
        1,
        n - 1,
        n,
        n + 1,
        u64::from(u32::MAX) - 1,
        u64::from(u32::MAX),
        // High bits set: the lookup reads the low half only.
        1 << 32,
        (1 << 32) | (n - 1),
        (1 << 32) | n,
        0xffff_ffff_0000_0000,
        0xffff_ffff_0000_0000 | (n - 1),
        0x8000_0000_0000_0000 | n,
        u64::MAX,
        0x8000_0000,
    ];
    k.sort();
    k.dedup();
    k
}

/// Runs `shape` on an array (or PERCPU array) of `value_size` x `max_entries` in the JIT and
/// the interpreter, for every boundary key; checks results, map contents and, for plain
/// arrays, that the entry the program wrote is the one the helper returns. Returns how many
/// lookups the JIT inlined.
fn check(kind: MapKind, shape: Shape, value_size: u32, max_entries: u32) -> usize {
    let what = format!("{kind:?} {shape:?}, value {value_size} B, {max_entries} entries");
    let mut maps = vec![array("inl_a", kind, value_size, max_entries)];
    if shape == Shape::Merge {
        maps.push(array("inl_b", kind, value_size + 5, max_entries + 3));
    }
    let obj = object_of(program(shape, value_size), maps);
    let (ra, rb) = (registry(), registry());
    let jit = LoadedProgram::load(&obj, None, &ra, &opts(Tier::Jit))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let int = LoadedProgram::load(&obj, None, &rb, &opts(Tier::Interpreter)).unwrap();
    if kind == MapKind::Array {
        for m in jit.maps().iter().chain(int.maps()) {
            fill(m);
        }
    }
    for (n, key) in keys(max_entries).into_iter().enumerate() {
        let marker = 0x40 + n as u64;
        let ctx = TunerCtx {
            msg_size: key,
            comm_id: marker,
            nranks: 8,
            nnodes: 2,
            algo: -1,
            proto: -1,
            ..TunerCtx::default()
        };
        let (mut a, mut b) = (ctx, ctx);
        let before: Vec<_> = jit.maps().iter().map(|m| dump(m)).collect();
        let ra = jit.run(&mut a);
        let rb = int.run_interpreted(&mut b);
        assert_eq!(ra, rb, "{what}, key {key:#x}: JIT vs interpreter");
        assert!(a == b, "{what}, key {key:#x}: context");
        for (ma, mb) in jit.maps().iter().zip(int.maps()) {
            assert_eq!(dump(ma), dump(mb), "{what}, key {key:#x}: map contents");
        }
        // Which map the program used (Merge: map 1 for odd keys), and the key's bytes as
        // the program stored them.
        let m = &jit.maps()[if shape == Shape::Merge {
            (key & 1) as usize
        } else {
            0
        }];
        let key_bytes: Vec<u8> = if shape == Shape::Key32 {
            (key as u32).to_le_bytes().to_vec()
        } else {
            key.to_le_bytes().to_vec()
        };
        let index = key as u32;
        let found = index < m.spec().max_entries;
        assert_eq!(ra != 0, found, "{what}, key {key:#x}: found");
        assert_eq!(
            helper_lookup(m, &key_bytes) != 0,
            found,
            "{what}, key {key:#x}: the helper's answer"
        );
        if kind == MapKind::Array {
            // The program writes the first byte and byte `value_size - 1` (map 1 of Merge
            // has longer values).
            let last = value_size as usize - 1;
            if found {
                let old = (index as usize * 7 + value_size as usize - 1) as u8 | 0x80;
                if n == 0 || !keys(max_entries)[..n].iter().any(|&k| k as u32 == index) {
                    assert_eq!(ra, u64::from(old) + 1, "{what}, key {key:#x}: value read");
                }
                // The helper's pointer addresses the bytes the compiled code wrote.
                let p = helper_lookup(m, &key_bytes) as *const u8;
                // SAFETY: the helper returned a pointer to a value of at least `last + 1`
                // bytes of a live map.
                let (first, lastb) = unsafe { (*p, *p.add(last)) };
                assert_eq!(
                    (first, lastb),
                    (marker as u8, marker as u8),
                    "{what}, key {key:#x}: written where the helper points"
                );
                // Nothing else changed: only entry `index` of that map.
                let after: Vec<_> = jit.maps().iter().map(|m| dump(m)).collect();
                let changed: usize = before
                    .iter()
                    .zip(&after)
                    .map(|(x, y)| x.iter().zip(y).filter(|(p, q)| p != q).count())
                    .sum();
                assert_eq!(changed, 1, "{what}, key {key:#x}: one entry written");
            } else {
                let after: Vec<_> = jit.maps().iter().map(|m| dump(m)).collect();
                assert_eq!(before, after, "{what}, key {key:#x}: nothing written");
            }
        }
    }
    jit.inlined_lookups()
}

#[test]
fn inline_array_lookups_match_the_interpreter_and_the_helper() {
    for value_size in [1u32, 3, 4, 8, 12, 20, 24, 100] {
        for max_entries in [1u32, 2, 5, 64, 1000] {
            for shape in [Shape::Key64, Shape::Key32, Shape::Key64Apart] {
                assert_eq!(
                    check(MapKind::Array, shape, value_size, max_entries),
                    1,
                    "{shape:?} value {value_size} entries {max_entries}: inlined"
                );
            }
            assert_eq!(
                check(MapKind::Array, Shape::Merge, value_size, max_entries),
                0,
                "a call reached with two maps keeps the helper"
            );
        }
    }
}

#[test]
fn percpu_arrays_keep_the_helper() {
    for value_size in [4u32, 12, 16] {
        for max_entries in [1u32, 3, 64] {
            for shape in [Shape::Key64, Shape::Key32, Shape::Key64Apart, Shape::Merge] {
                assert_eq!(
                    check(MapKind::PercpuArray, shape, value_size, max_entries),
                    0
                );
            }
        }
    }
}

#[test]
fn hash_lookups_keep_the_helper() {
    let mut obj = object_of(
        program(Shape::Key64, 8),
        vec![array("inl_h", MapKind::Hash, 8, 4)],
    );
    obj.maps[0].key_size = 4;
    let p = LoadedProgram::load(&obj, None, &registry(), &opts(Tier::Jit)).unwrap();
    assert_eq!(p.inlined_lookups(), 0);
}

#[test]
fn size_aware_inlines_its_threshold_lookups() {
    let (_, obj) = object("src/size_aware.o");
    let p = LoadedProgram::load(&obj, None, &registry(), &opts(Tier::Jit)).unwrap();
    assert_eq!(
        p.inlined_lookups(),
        3,
        "two tuner_thresholds lookups and the tuner_decisions one inline"
    );
}
