//! A map's identity across the objects of one process (issue 38, part 2), through the plugin's
//! own loading paths: the tuner's and the net plugin's loads of `NCCL_BPF_POLICY`, `ncclbpf
//! reload`, a staged tuner swap (`ncclbpf reload --at-seq`) and what `ncclbpf config` may
//! change. The shipped `size_aware` tuner decides from its config map `tuner_thresholds`;
//! `policies/maps/ident_net_plain.c` declares the same name and shape as a plain map and writes
//! this rank's last send size into it from `net/isend`, `ident_net_config.c` declares it exactly
//! as size_aware does and only reads it. Before, the registry compared shapes only, so the first
//! two were joined and the tuner's choice followed this rank's traffic.

use ncclbpf_netplugin::control;
use ncclbpf_netplugin::hooks::{HOOK_SECTIONS, NetSet};
use ncclbpf_tuner::policy::{Note, TunerPrograms, load_from};
use ncclbpf_tuner::stage::{ConfigUpdate, History, StageError, stage_program};
use policy_runtime::LoadOptions;
use policy_runtime::setting::{Source, sources_from};
use shared_maps::{MapScope, Registry};
use std::sync::atomic::{AtomicU64, Ordering};

const MAP: &str = "tuner_thresholds";

fn object(rel: &str) -> String {
    ncclbpf_policies::object(rel)
        .unwrap_or_else(|e| panic!("{e}"))
        .display()
        .to_string()
}

fn registry() -> Registry {
    static N: AtomicU64 = AtomicU64::new(0);
    Registry::new(std::env::temp_dir().join(format!(
        "ncclbpf-ident-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )))
}

/// What `NCCL_BPF_POLICY=<objects>` gives each side.
fn setting(objects: &[&str]) -> impl Fn(&str) -> Option<String> {
    let v = objects.join(",");
    move |k: &str| (k == "NCCL_BPF_POLICY").then(|| v.clone())
}

fn sources(objects: &[&str]) -> Vec<Source> {
    sources_from(&setting(objects))
}

fn tuner(objects: &[&str], reg: &Registry) -> (TunerPrograms, Vec<String>) {
    let (p, notes) = load_from(&setting(objects), reg);
    let problems = notes
        .into_iter()
        .filter_map(|n| match n {
            Note::Problem(p) => Some(p),
            Note::Loaded(_) => None,
        })
        .collect();
    (p, problems)
}

fn net_hook<'a>(set: &'a NetSet, section: &str) -> Option<&'a policy_runtime::LoadedProgram> {
    let h = HOOK_SECTIONS.iter().position(|s| *s == section).unwrap();
    set.by_hook[h].as_ref().map(|a| &a.prog)
}

#[track_caller]
fn names_both(msg: &str, a: &str, b: &str) {
    assert!(
        msg.contains(a) && msg.contains(b) && msg.contains(MAP) && msg.contains("scope differs"),
        "the error names both objects, the map and the property: {msg}"
    );
}

#[test]
fn a_net_object_cannot_join_the_tuners_config_map() {
    let (size_aware, plain) = (object("src/size_aware.o"), object("maps/ident_net_plain.o"));
    // size_aware listed first keeps the name: the net object is refused, whichever side loads
    // first (the tuner's first collective before the first connection, or after).
    let listed = [size_aware.as_str(), plain.as_str()];
    for tuner_first in [true, false] {
        let reg = registry();
        let ((t, t_problems), (set, net_problems)) = if tuner_first {
            let t = tuner(&listed, &reg);
            (t, NetSet::load(&sources(&listed), &reg))
        } else {
            let n = NetSet::load(&sources(&listed), &reg);
            (tuner(&listed, &reg), n)
        };
        assert!(t.tuner.is_some(), "{t_problems:?}");
        assert!(
            net_hook(&set, "net/isend").is_none(),
            "the net program must not write the tuner's config map"
        );
        assert_eq!(net_problems.len(), 1, "{net_problems:?}");
        names_both(&net_problems[0], &size_aware, &plain);
        assert!(net_problems[0].contains("the first listed keeps it"));
        // The tuner side says so too (the object is listed for every hook).
        assert!(
            t_problems.iter().any(|p| p.contains(&plain)),
            "{t_problems:?}"
        );
    }

    // Listed the other way round, the tuner is the one refused, again whatever loads first:
    // every rank with this setting keeps NCCL's own choices, none decides alone.
    let listed = [plain.as_str(), size_aware.as_str()];
    for tuner_first in [true, false] {
        let reg = registry();
        let ((t, problems), (set, _)) = if tuner_first {
            let t = tuner(&listed, &reg);
            (t, NetSet::load(&sources(&listed), &reg))
        } else {
            let n = NetSet::load(&sources(&listed), &reg);
            (tuner(&listed, &reg), n)
        };
        assert!(net_hook(&set, "net/isend").is_some());
        assert!(
            t.tuner.is_none(),
            "the tuner must not decide from a map a net program writes"
        );
        let p = problems
            .iter()
            .find(|p| p.contains(MAP))
            .expect("a problem");
        names_both(p, &size_aware, &plain);
    }
}

/// The registry refuses the same when the two come together otherwise than listed together
/// (here: each side given only its own object).
#[test]
fn the_registry_refuses_what_the_setting_did_not_list_together() {
    let (size_aware, plain) = (object("src/size_aware.o"), object("maps/ident_net_plain.o"));
    let reg = registry();
    let (t, _) = tuner(&[size_aware.as_str()], &reg);
    assert!(t.tuner.is_some());
    let (set, problems) = NetSet::load(&sources(&[plain.as_str()]), &reg);
    assert!(net_hook(&set, "net/isend").is_none());
    names_both(&problems[0], &size_aware, &plain);
    assert!(
        problems[0].contains("(net/isend program 'last_send')")
            && problems[0].contains("(tuner program 'size_aware')"),
        "the registry names the programs too: {problems:?}"
    );
}

#[test]
fn the_same_declaration_in_both_is_one_map() {
    let (size_aware, config) = (
        object("src/size_aware.o"),
        object("maps/ident_net_config.o"),
    );
    let listed = [size_aware.as_str(), config.as_str()];
    let reg = registry();
    let (t, problems) = tuner(&listed, &reg);
    let (set, net_problems) = NetSet::load(&sources(&listed), &reg);
    let (t, n) = (
        t.tuner.expect("tuner").current(),
        net_hook(&set, "net/complete").expect("net/complete"),
    );
    assert!(
        problems.is_empty() && net_problems.is_empty(),
        "{problems:?} {net_problems:?}"
    );
    let map = |p: &policy_runtime::LoadedProgram| {
        p.maps()
            .iter()
            .find(|m| m.spec().name == MAP)
            .unwrap()
            .clone()
    };
    assert!(std::sync::Arc::ptr_eq(&map(&t), &map(n)));
}

/// `ncclbpf config` changes a map only through staged updates, which every rank applies at
/// the same collective; that is sound only if no program of the process writes the map. Every
/// program bound to a map that a config update is accepted for must see it as config.
#[test]
fn a_map_config_updates_change_is_written_by_no_program() {
    let (size_aware, plain) = (object("src/size_aware.o"), object("maps/ident_net_plain.o"));
    let listed = [size_aware.as_str(), plain.as_str()];
    let reg = registry();
    let (t, _) = tuner(&listed, &reg);
    let (set, _) = NetSet::load(&sources(&listed), &reg);
    let tuner = t.tuner.expect("tuner").current();
    let update = ConfigUpdate {
        map: MAP.into(),
        values: vec![(0, 1 << 20)],
    };
    ncclbpf_tuner::agree::check_config(&tuner, &update).expect("a config map of the tuner");
    let (identity, owner) = reg.identity(MAP).unwrap();
    assert_eq!(identity.scope, MapScope::Config, "declared by {owner}");
    for prog in set.by_hook.iter().flatten().map(|a| &a.prog) {
        for d in prog.map_defs().iter().filter(|d| d.name == MAP) {
            assert!(
                d.read_only || !d.scope.program_writable(),
                "{} ({}) may write '{MAP}', which `ncclbpf config` changes",
                prog.name,
                prog.section
            );
        }
    }
}

#[test]
fn a_reload_cannot_change_a_maps_scope() {
    let (size_aware, plain, config) = (
        object("src/size_aware.o"),
        object("maps/ident_net_plain.o"),
        object("maps/ident_net_config.o"),
    );
    let opts = LoadOptions::default();
    let rejected = |r: &ncclbpf_control::Reply| {
        assert!(r.result.is_err(), "accepted: {}", r.to_text());
        r.items
            .iter()
            .find_map(|i| match i {
                ncclbpf_control::Item::Rejected {
                    what,
                    name,
                    message,
                } if what == "map" => {
                    assert_eq!(name, MAP);
                    Some(message.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no rejected map: {}", r.to_text()))
    };

    // The tuner runs size_aware; `ncclbpf reload ident_net_plain.o` is refused.
    let reg = registry();
    let (t, _) = tuner(&[size_aware.as_str()], &reg);
    assert!(t.tuner.is_some());
    let r = control::reload(std::path::Path::new(&plain), &reg, &opts);
    names_both(&rejected(&r), &size_aware, &plain);

    // One net object reloaded as a version that declares its map config instead: the map holds
    // what the first version's program wrote, rank-local values.
    let reg = registry();
    let (set, _) = NetSet::load(&sources(&[plain.as_str()]), &reg);
    assert!(net_hook(&set, "net/isend").is_some());
    let r = control::reload(std::path::Path::new(&config), &reg, &opts);
    names_both(&rejected(&r), &plain, &config);
}

#[test]
fn a_staged_tuner_cannot_join_a_net_objects_plain_map() {
    let (size_aware, plain) = (object("src/size_aware.o"), object("maps/ident_net_plain.o"));
    let reg = registry();
    let (set, _) = NetSet::load(&sources(&[plain.as_str()]), &reg);
    assert!(net_hook(&set, "net/isend").is_some());
    let obj = policy_object::Object::parse(&std::fs::read(&size_aware).unwrap()).unwrap();
    match stage_program(&obj, &size_aware, 1000, &reg, &History::new()) {
        Err(StageError::Load { message, .. }) => names_both(&message, &size_aware, &plain),
        Err(other) => panic!("refused, but not for the map: {other}"),
        Ok(_) => panic!("staged a tuner that decides from a map a net program writes"),
    }
}
