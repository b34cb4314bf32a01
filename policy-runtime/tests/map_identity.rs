//! A map's identity across objects (issue 38, part 2): two programs of different objects share
//! a map only when their declarations agree in everything the verifier, the locality rule and
//! the agreement took from them: shape, scope (rank-local, agreed, config), epoch source,
//! reduction, read-only, global data. Before, the registry compared the shape alone, so a net
//! object that declared a tuner's config map as a plain map of the same shape wrote what the
//! tuner decided from, and the tuner's choice followed this rank's traffic.
//!
//! * [`a_net_object_cannot_write_the_tuners_config_map`]: the case, both load orders;
//! * [`each_identity_property_separates_maps`]: one pair of declarations per property;
//! * [`a_reloaded_object_keeps_its_maps_identity`]: a second version of one object;
//! * [`joined_iff_every_identity_property_agrees`]: two random declarations are one map exactly
//!   when what the verifier sees of them (`map_infos`), their kind, epoch source and reduction
//!   agree; otherwise the second load is an error naming both objects and the property, and
//!   global data is never joined.

// Load errors carry the verifier's diagnosis; they are not a hot path.
#![allow(clippy::result_large_err)]

mod common;
use common::registry;
use policy_object::insn::build::{alu64_imm, call, exit, jmp_imm, ld_map, ldx, mov64_imm};
use policy_object::insn::build::{jmp_reg, mov64_reg, st, stx};
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, MapKind, Object, Program, Reduce, SOURCE_STATE, Scope};
use policy_runtime::{LoadError, LoadOptions, LoadedProgram, NetCtx, Tier, TunerCtx};
use proptest::prelude::*;
use shared_maps::{Registry, RegistryError};
use std::sync::Arc;

fn opts() -> LoadOptions {
    LoadOptions {
        tier: Tier::Interpreter,
        ..LoadOptions::default()
    }
}

fn def(name: &str, kind: MapKind, scope: Scope, source: Option<u32>, reduce: Reduce) -> MapDef {
    MapDef {
        name: name.into(),
        kind,
        key_size: 4,
        value_size: 8,
        max_entries: 4,
        flags: 0,
        initial: None,
        read_only: false,
        scope,
        source,
        reduce,
    }
}

fn plain(name: &str) -> MapDef {
    def(name, MapKind::Array, Scope::Local, None, Reduce::Sum)
}

fn object(section: &str, name: &str, insns: Vec<Insn>, maps: Vec<MapDef>) -> Object {
    Object {
        programs: vec![Program {
            name: name.into(),
            section: section.into(),
            insns,
            lines: vec![],
        }],
        maps,
    }
}

/// `r0 = bpf_map_lookup_elem(&map 0, &0)` with the context kept in r6; jumps to the exit
/// `skip` instructions after the NULL check when there is no entry.
fn lookup_first(skip: i16) -> Vec<Insn> {
    let mut v = vec![mov64_reg(6, 1), st(op::W, 10, -4, 0)];
    v.extend(ld_map(1, 0));
    v.extend([mov64_reg(2, 10), alu64_imm(op::ADD, 2, -4), call(1)]);
    v.push(jmp_imm(op::JEQ, 0, 0, skip));
    v
}

/// The tuner: algorithm 1 above the threshold in entry 0 of map 0, else 0.
fn tuner_reading_map0() -> Vec<Insn> {
    let mut v = lookup_first(6);
    v.extend([
        ldx(op::DW, 1, 0, 0), // the threshold
        ldx(op::DW, 2, 6, 0), // msg_size
        mov64_imm(3, 0),
        jmp_reg(op::JLE, 2, 1, 1),
        mov64_imm(3, 1),
        stx(op::W, 6, 40, 3), // algo
        mov64_imm(0, 0),
        exit(),
    ]);
    v
}

/// The net program: entry 0 of map 0 = this send's size.
fn net_writing_map0() -> Vec<Insn> {
    let mut v = lookup_first(2);
    v.extend([ldx(op::DW, 1, 6, 8), stx(op::DW, 0, 0, 1)]);
    v.extend([mov64_imm(0, 0), exit()]);
    v
}

fn trivial() -> Vec<Insn> {
    vec![mov64_imm(0, 0), exit()]
}

/// Loads `obj`'s only program as the object at `path` would be.
fn load(obj: &Object, path: &str, reg: &Registry) -> Result<LoadedProgram, LoadError> {
    LoadedProgram::load_as(obj, None, path, reg, &opts())
}

#[track_caller]
fn conflict(r: Result<LoadedProgram, LoadError>, property: &str, objects: &[&str]) -> String {
    let e = r.expect_err("the second declaration must not join the first");
    let msg = e.to_string();
    match &e {
        LoadError::Map(RegistryError::Conflict(c)) => {
            assert_eq!(c.differs.property, property, "{msg}")
        }
        other => panic!("not a map conflict: {other}"),
    }
    for o in objects {
        assert!(msg.contains(o), "the error names {o}: {msg}");
    }
    msg
}

#[test]
fn a_net_object_cannot_write_the_tuners_config_map() {
    let thresholds = def(
        "thresholds",
        MapKind::Array,
        Scope::Config,
        None,
        Reduce::Sum,
    );
    let tuner = object("tuner", "pick", tuner_reading_map0(), vec![thresholds]);
    let net = object(
        "net/isend",
        "count",
        net_writing_map0(),
        vec![plain("thresholds")],
    );
    // Each verifies on its own: the tuner decides from a config map, the net program writes a
    // rank-local one.
    LoadedProgram::check(&tuner, None, &opts()).unwrap();
    LoadedProgram::check(&net, None, &opts()).unwrap();

    // Tuner first: the net program is refused.
    let reg = registry();
    let t = load(&tuner, "a.o", &reg).unwrap();
    let msg = conflict(load(&net, "b.o", &reg), "scope", &["a.o", "b.o"]);
    assert!(
        msg.contains("rank-local") && msg.contains("config") && msg.contains("thresholds"),
        "{msg}"
    );
    // So no send can move the tuner's choice: the threshold stays what the tuner read.
    let mut c = TunerCtx {
        msg_size: 100,
        ..TunerCtx::default()
    };
    t.run(&mut c);
    assert_eq!(c.algo, 1, "threshold 0: above it");

    // Net first: the tuner is refused.
    let reg = registry();
    let n = load(&net, "b.o", &reg).unwrap();
    n.run(&mut NetCtx {
        bytes: 1 << 20,
        ..NetCtx::default()
    });
    conflict(load(&tuner, "a.o", &reg), "scope", &["a.o", "b.o"]);
    // And the registry's check (a reload's first step) says the same without creating anything.
    let e = policy_runtime::program::check_maps(&tuner, &reg, "a.o").unwrap_err();
    assert!(e.to_string().contains("scope differs"), "{e}");
}

/// A source map for agreed maps filled from source `n` (value 8, 4 entries, like [`def`]).
fn source(n: u32) -> MapDef {
    def(
        &format!("src{n}"),
        MapKind::Array,
        Scope::Local,
        Some(n),
        Reduce::Sum,
    )
}

#[test]
fn each_identity_property_separates_maps() {
    use MapKind::{Array, Hash};
    use Scope::{Agreed, Config, Local};
    let m = |kind, scope, src, red| def("m", kind, scope, src, red);
    // (first declaration, second, the property that differs)
    let cases = [
        (
            m(Array, Local, None, Reduce::Sum),
            m(Array, Config, None, Reduce::Sum),
            "scope",
        ),
        (
            m(Array, Local, None, Reduce::Sum),
            m(Array, Agreed, None, Reduce::Sum),
            "scope",
        ),
        (
            m(Array, Config, None, Reduce::Sum),
            m(Array, Agreed, None, Reduce::Sum),
            "scope",
        ),
        (
            m(Hash, Config, None, Reduce::Sum),
            m(Hash, Local, None, Reduce::Sum),
            "scope",
        ),
        (
            m(Array, Agreed, Some(1), Reduce::Sum),
            m(Array, Agreed, Some(1), Reduce::Max),
            "reduction",
        ),
        (
            m(Array, Agreed, Some(1), Reduce::Min),
            m(Array, Agreed, Some(1), Reduce::Max),
            "reduction",
        ),
        (
            m(Array, Agreed, Some(1), Reduce::Sum),
            m(Array, Agreed, Some(2), Reduce::Sum),
            "epoch source",
        ),
        (
            m(Array, Agreed, None, Reduce::Sum),
            m(Array, Agreed, Some(SOURCE_STATE), Reduce::Sum),
            "epoch source",
        ),
        (
            m(Array, Local, Some(3), Reduce::Sum),
            m(Array, Local, None, Reduce::Sum),
            "epoch source",
        ),
        (
            m(Array, Local, Some(3), Reduce::Sum),
            m(Array, Local, Some(4), Reduce::Sum),
            "epoch source",
        ),
        (
            m(Array, Local, None, Reduce::Sum),
            m(MapKind::PercpuArray, Local, None, Reduce::Sum),
            "kind",
        ),
    ];
    let with_sources = |d: &MapDef| {
        let mut maps = vec![d.clone()];
        if d.scope == Agreed
            && let Some(n) = d.source.filter(|&n| n != SOURCE_STATE)
        {
            maps.push(source(n));
        }
        maps
    };
    for (a, b, property) in cases {
        let reg = registry();
        let oa = object("net/isend", "first", trivial(), with_sources(&a));
        let ob = object("tuner", "second", trivial(), with_sources(&b));
        let la = load(&oa, "first.o", &reg).unwrap();
        let msg = conflict(
            load(&ob, "second.o", &reg),
            property,
            &["first.o", "second.o"],
        );
        assert!(msg.contains(&format!("its {property} differs")), "{msg}");
        // The same declaration again is the same map.
        let again = load(
            &object("tuner", "third", trivial(), with_sources(&a)),
            "c.o",
            &reg,
        )
        .unwrap_or_else(|e| panic!("{a:?} twice: {e}"));
        assert!(Arc::ptr_eq(&la.maps()[0], &again.maps()[0]));
    }
}

#[test]
fn a_reloaded_object_keeps_its_maps_identity() {
    // Version 1 counts into `counts` from its net program; version 2 of the same object
    // declares it config (for a tuner to decide from): the map keeps what version 1's programs
    // wrote, rank-local values, so version 2 must not bind it.
    let reg = registry();
    let v1 = object(
        "net/isend",
        "count",
        net_writing_map0(),
        vec![plain("counts")],
    );
    let p1 = load(&v1, "policy.o", &reg).unwrap();
    p1.run(&mut NetCtx {
        bytes: 4096,
        ..NetCtx::default()
    });
    drop(p1); // even once version 1 is gone
    let counts = def("counts", MapKind::Array, Scope::Config, None, Reduce::Sum);
    let v2 = object("tuner", "pick", tuner_reading_map0(), vec![counts]);
    let msg = conflict(load(&v2, "policy.o", &reg), "scope", &["policy.o"]);
    assert!(msg.contains("'count'") && msg.contains("'pick'"), "{msg}");
    // An unchanged version 2 binds the same map, contents and all.
    let again = load(&v1, "policy.o", &reg).unwrap();
    assert_eq!(
        again.maps()[0].get(&0u32.to_le_bytes()).unwrap(),
        4096u64.to_le_bytes()
    );
}

/// A random declaration of map `m` the loader could produce: kind, shape, scope, epoch source
/// and reduction valid together (checked by `policy_object::epoch::attributes`), or global data
/// (one in six).
fn declaration(r: [u32; 8]) -> MapDef {
    let pick = |i: usize, n: usize| r[i] as usize % n;
    let value_size = [8, 16][pick(2, 2)];
    if pick(7, 6) == 0 {
        let read_only = pick(4, 2) == 0;
        return MapDef {
            name: "m".into(),
            kind: MapKind::Array,
            key_size: 4,
            value_size,
            max_entries: 1,
            flags: 0,
            initial: Some(vec![0; value_size as usize]),
            read_only,
            scope: if read_only {
                Scope::Config
            } else {
                Scope::Local
            },
            source: None,
            reduce: Reduce::Sum,
        };
    }
    let kind = [MapKind::Array, MapKind::Hash, MapKind::PercpuArray][pick(0, 3)];
    let key_size = if kind == MapKind::Hash {
        [4, 8][pick(1, 2)]
    } else {
        4
    };
    let max_entries = [1, 4][pick(3, 2)];
    let scope = match kind {
        MapKind::PercpuArray => Scope::Local, // rank-local by nature
        _ => [Scope::Local, Scope::Agreed, Scope::Config][pick(4, 3)],
    };
    // Sources and reductions only where the loader takes them.
    let source = match (kind, scope) {
        (MapKind::Array, Scope::Local) => [None, Some(1), Some(2)][pick(5, 3)],
        (MapKind::Array, Scope::Agreed) => [None, Some(1), Some(2), Some(SOURCE_STATE)][pick(5, 4)],
        _ => None,
    };
    let reduce = match source {
        Some(n) if scope == Scope::Agreed && n != SOURCE_STATE => {
            [None, Some(1), Some(2), Some(3)][pick(6, 4)]
        }
        _ => None,
    };
    let (source, reduce) =
        policy_object::epoch::attributes(kind, scope, value_size, max_entries, source, reduce)
            .unwrap_or_else(|e| panic!("the generator made an invalid declaration: {e}"));
    MapDef {
        name: "m".into(),
        kind,
        key_size,
        value_size,
        max_entries,
        flags: r[1] & 1, // map_flags: nothing reads them, so they may differ
        initial: None,
        read_only: false,
        scope,
        source,
        reduce,
    }
}

/// The object of one declaration: with the source map an agreed map filled from a source needs
/// (named by its shape, so that two objects' source maps never conflict).
fn object_of(d: &MapDef, section: &str) -> Object {
    let mut maps = vec![d.clone()];
    if d.scope == Scope::Agreed
        && let Some(n) = d.source.filter(|&n| n != SOURCE_STATE)
    {
        maps.push(MapDef {
            name: format!("src{n}_{}_{}", d.value_size, d.max_entries),
            source: Some(n),
            scope: Scope::Local,
            reduce: Reduce::Sum,
            ..d.clone()
        });
    }
    object(section, "p", trivial(), maps)
}

/// Every property the verifier, the locality rule or the agreement reads from a declaration,
/// computed apart from the registry's identity.
fn relied_on(d: &MapDef) -> impl PartialEq + std::fmt::Debug {
    (
        policy_verifier::map_infos(std::slice::from_ref(d)),
        d.kind,
        d.source,
        d.reduce,
    )
}

fn word() -> impl Strategy<Value = [u32; 8]> {
    proptest::array::uniform8(0u32..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512)
    ))]

    #[test]
    fn joined_iff_every_identity_property_agrees(ra in word(), rb in word()) {
        let (a, b) = (declaration(ra), declaration(rb));
        let reg = registry();
        let la = load(&object_of(&a, "net/isend"), "a.o", &reg).unwrap();
        let lb = load(&object_of(&b, "tuner"), "b.o", &reg);
        let global = a.initial.is_some() || b.initial.is_some();
        let same = relied_on(&a) == relied_on(&b);
        match lb {
            Ok(lb) => {
                let joined = Arc::ptr_eq(&la.maps()[0], &lb.maps()[0]);
                prop_assert!(global || same, "loaded, yet they differ:\n{a:?}\n{b:?}");
                prop_assert_eq!(joined, !global, "joined: {}\n{:?}\n{:?}", joined, a, b);
            }
            Err(e) => {
                prop_assert!(!global && !same, "refused, yet the same: {e}\n{a:?}\n{b:?}");
                let msg = e.to_string();
                prop_assert!(msg.contains("a.o") && msg.contains("b.o"), "{}", msg);
                prop_assert!(matches!(e, LoadError::Map(RegistryError::Conflict(_))), "{}", msg);
            }
        }
    }
}
