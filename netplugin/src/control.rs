//! The net plugin's part of the control socket ([`ncclbpf_host::peers::NetPeer`]): what runs at
//! each net hook (for `ncclbpf status`), and `reload <object>`, which swaps the object's `net/*`
//! programs in while traffic flows. The socket itself, staged tuner swaps and config updates
//! belong to the host (`ncclbpf_host::control`) and the tuner; the net plugin registers this
//! part when NCCL first initialises it ([`register`]).
//!
//! A reload is all or nothing over the object's net programs: every one is verified before any
//! map is created or bound, every named map is checked against the registry (the same name
//! with another shape, scope, epoch source or reduction rejects the whole reload with the
//! registry's message naming both objects; the same identity is the same map, so counts carry
//! on), then all are bound and compiled, and only then the new
//! set of programs replaces the old in one store. Any failure leaves every hook as it was.
//! A plain `reload` refuses the object's tuner programs (a tuner swap must happen at the same
//! collective on every rank) and still swaps its net programs.

use crate::hooks::{self, Attached, HOOK_SECTIONS, NetSet};
use ncclbpf_control::protocol::{Item, ProgramInfo, Reply, Swap, TUNER_REFUSAL};
use policy_runtime::program::check_maps;
use policy_runtime::{LoadError, LoadOptions, LoadedProgram, Tier};
use shared_maps::{Registry, RegistryError};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Net;

impl ncclbpf_host::peers::NetPeer for Net {
    fn hooks(&self) -> (u64, Vec<Item>) {
        hook_items()
    }

    fn is_net_section(&self, section: &str) -> bool {
        hooks::hook_of(section).is_some()
    }

    fn reload(&self, path: &Path, registry: &Registry, opts: &LoadOptions) -> Reply {
        reload(path, registry, opts)
    }

    fn count_reload(&self, ok: bool) {
        hooks::conn_table().count_reload(ok);
    }
}

/// Registers the net plugin with the host (once per process; its first `init`).
pub fn register() {
    static NET: Net = Net;
    ncclbpf_host::peers::register_net(&NET);
}

/// The generation of the net programs, and what runs at each net hook.
pub fn hook_items() -> (u64, Vec<Item>) {
    let (generation, set) = hooks::net().snapshot();
    let mut items = vec![];
    for (h, a) in set.by_hook.iter().enumerate() {
        items.push(Item::Hook {
            section: HOOK_SECTIONS[h].to_string(),
            program: a.as_ref().map(|a| ProgramInfo {
                name: a.prog.name.clone(),
                generation: a.generation,
                insns: a.prog.stats.insns as u64,
                tag: format!("{:016x}", a.tag),
                tier: match a.prog.tier() {
                    Tier::Jit => "jit",
                    Tier::Interpreter => "interpreter",
                }
                .to_string(),
                source: a.source.clone(),
            }),
        });
    }
    (generation, items)
}

/// Reloads are one at a time (the control thread serves one client at a time anyway).
static RELOAD: Mutex<()> = Mutex::new(());

const UNCHANGED: &str = "nothing was changed";

/// Loads, verifies and compiles the object at `path` and swaps its `net/*` programs in, all or
/// nothing (see the module's documentation).
pub fn reload(path: &Path, registry: &Registry, opts: &LoadOptions) -> Reply {
    let _one = RELOAD.lock().unwrap_or_else(|e| e.into_inner());
    let shown = path.display().to_string();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return Reply::error(vec![], format!("cannot read {shown}: {e}; {UNCHANGED}")),
    };
    let obj = match policy_object::Object::parse(&bytes) {
        Ok(o) => o,
        Err(e) => return Reply::error(vec![], format!("{shown}: {e}; {UNCHANGED}")),
    };

    // Which programs go where.
    let mut notes = vec![];
    let mut rejected = vec![];
    let mut wanted: Vec<(usize, &policy_object::Program)> = vec![];
    let mut net_programs = 0;
    for p in &obj.programs {
        if let Some(h) = hooks::hook_of(&p.section) {
            net_programs += 1;
            if let Some((_, first)) = wanted.iter().find(|(w, _)| *w == h) {
                rejected.push(Item::Rejected {
                    what: p.section.clone(),
                    name: p.name.clone(),
                    message: format!(
                        "a second program for {} in the object (the first is '{}'): which to attach is ambiguous",
                        p.section, first.name
                    ),
                });
            } else {
                wanted.push((h, p));
            }
        } else if hooks::is_tuner_section(&p.section) {
            notes.push(Item::Refused {
                section: p.section.clone(),
                name: p.name.clone(),
                reason: TUNER_REFUSAL.to_string(),
            });
        } else if policy_runtime::setting::is_profiler_section(&p.section) {
            notes.push(Item::Ignored {
                section: p.section.clone(),
                name: p.name.clone(),
                reason: "profiler programs are loaded at start (NCCL_BPF_POLICY), not reloaded"
                    .to_string(),
            });
        } else {
            notes.push(Item::Ignored {
                section: p.section.clone(),
                name: p.name.clone(),
                reason: "its section attaches to no hook".to_string(),
            });
        }
    }
    let fail = |mut rejected: Vec<Item>, notes: Vec<Item>, why: String| {
        rejected.extend(notes);
        Reply::error(rejected, format!("{why}; {UNCHANGED}"))
    };
    if wanted.is_empty() {
        return fail(
            rejected,
            notes,
            format!("{shown} has no net/* program to swap"),
        );
    }

    // Verify every program before any map is created or bound.
    let mut verified = vec![];
    for (h, p) in &wanted {
        match LoadedProgram::check(&obj, Some(&p.name), opts) {
            Ok(v) => verified.push((*h, v)),
            Err(e) => rejected.push(Item::Rejected {
                what: p.section.clone(),
                name: p.name.clone(),
                message: e.to_string(),
            }),
        }
    }
    if !rejected.is_empty() {
        let n = rejected.len();
        let why = if net_programs == 1 {
            format!("the net program of {shown} was rejected")
        } else {
            format!("{n} of the {net_programs} net programs of {shown} were rejected")
        };
        return fail(rejected, notes, why);
    }

    // Every named map that exists keeps its identity (it is the same map, state and all).
    let owner = policy_runtime::program::owner(&shown, &wanted[0].1.section, &wanted[0].1.name);
    if let Err(e) = check_maps(&obj, registry, &owner) {
        let name = match &e {
            LoadError::Map(RegistryError::Conflict(c)) => c.name.clone(),
            _ => "?".into(),
        };
        rejected.push(Item::Rejected {
            what: "map".into(),
            name: name.clone(),
            message: e.to_string(),
        });
        return fail(
            rejected,
            notes,
            format!("map '{name}' of {shown} conflicts with the running one"),
        );
    }

    // Bind and compile; a failure here drops what was loaded.
    let mut loaded = vec![];
    for (h, v) in verified {
        let (section, name) = (v.section().to_string(), v.name().to_string());
        match v.bind_as(registry, opts, &shown) {
            Ok(p) => loaded.push((h, p)),
            Err(e) => {
                rejected.push(Item::Rejected {
                    what: section,
                    name: name.clone(),
                    message: e.to_string(),
                });
                return fail(
                    rejected,
                    notes,
                    format!("program '{name}' of {shown} could not be loaded"),
                );
            }
        }
    }

    // One store for every hook of the object.
    let net = hooks::net();
    let (generation, current) = net.snapshot();
    let next = generation + 1;
    let mut set: NetSet = (*current).clone();
    drop(current);
    let mut swaps = vec![];
    for (h, p) in loaded {
        let a = Attached::new(p, &obj, &shown, next);
        swaps.push(Swap {
            section: HOOK_SECTIONS[h].to_string(),
            old: set.by_hook[h]
                .as_ref()
                .map(|o| (o.prog.name.clone(), o.generation)),
            new: a.prog.name.clone(),
            generation: next,
            insns: a.prog.stats.insns as u64,
            verify: a.prog.times.verify,
            compile: a.prog.times.compile,
            swap: Duration::ZERO,
        });
        set.by_hook[h] = Some(Arc::new(a));
    }
    let took = net.store(set);
    let mut items: Vec<Item> = swaps
        .into_iter()
        .map(|mut s| {
            s.swap = took;
            Item::Swapped(s)
        })
        .collect();
    items.extend(notes);
    Reply::ok(items)
}
