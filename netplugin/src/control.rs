//! The process's control socket (`ncclbpf_control`): `status` lists what runs at each net
//! hook, `reload <object>` swaps the object's `net/*` programs in while traffic flows.
//!
//! Started by the first successful `init` unless `NCCL_BPF_CONTROL=0`. Requests are served
//! on the control thread, so loading, verifying and compiling never run on NCCL's threads;
//! the only thing a reload does to them is one store that their next hook call notices.
//!
//! A reload is all or nothing over the object's net programs: every one is verified before any
//! map is created or bound, every named map is checked against the registry (the same name
//! with another shape, scope, epoch source or reduction rejects the whole reload with the
//! registry's message naming both objects; the same identity is the same map, so counts carry
//! on), then all are bound and compiled, and only then the new
//! set of programs replaces the old in one store. Any failure leaves every hook as it was.
//! A plain `reload` refuses the object's tuner programs (a tuner swap must happen at the same
//! collective on every rank) and still swaps its net programs. `stage SEQ PATH` stages the
//! object's tuner program at decision SEQ of every communicator (`ncclbpf_tuner::stage`) and
//! swaps its net programs now; `stage-config SEQ MAP K=V,...` stages new values for a config map
//! of the tuner program, seen from decision SEQ of every communicator (contexts running the
//! agreement keep their own view of config maps; others refuse it); `unstage` withdraws the last
//! stage of either kind while no communicator reached it. `status` lists the staged programs and
//! config updates and every tuner context with its decision count.

use crate::config::Config;
use crate::hooks::{self, Attached, HOOK_SECTIONS, NetSet};
use ncclbpf_control::protocol::{Item, ProgramInfo, Reply, Request, Swap, TUNER_REFUSAL};
use ncclbpf_control::server::{self, Handler, Peer};
use ncclbpf_tuner::stage::{ConfigUpdate, HISTORY, History, StageError};
use policy_runtime::program::{LIVE_PROGRAMS, check_maps};
use policy_runtime::{LoadError, LoadOptions, LoadedProgram, Tier};
use shared_maps::{Registry, RegistryError};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

struct Plugin;

impl Handler for Plugin {
    fn handle(&self, req: &Request, peer: Peer) -> Reply {
        match req {
            Request::Status => status(),
            Request::Reload(path) => {
                let r = reload(path, Registry::global(), &LoadOptions::default());
                log_request(&format!("reload {}", path.display()), peer, &r);
                hooks::conn_table().count_reload(r.result.is_ok());
                r
            }
            Request::Stage { at, path } => {
                let r = stage(
                    path,
                    *at,
                    Registry::global(),
                    &LoadOptions::default(),
                    &HISTORY,
                );
                log_request(&format!("reload {}", path.display()), peer, &r);
                hooks::conn_table().count_reload(r.result.is_ok());
                r
            }
            Request::StageConfig { at, map, values } => {
                let update = ConfigUpdate {
                    map: map.clone(),
                    values: values.clone(),
                };
                let head = format!("config {} at seq {at}", update.describe());
                let source = format!("ncclbpf config (pid {})", peer.pid);
                let r = stage_config(
                    *at,
                    update,
                    &source,
                    &HISTORY,
                    ncclbpf_tuner::stage::stage_config,
                );
                log_request(&head, peer, &r);
                r
            }
            Request::Unstage => {
                let r = unstage(&HISTORY);
                log_request("unstage", peer, &r);
                r
            }
        }
    }

    fn log(&self, warn: bool, msg: &str) {
        if warn {
            crate::nlog!(WARN, NET, "{msg}");
        } else {
            crate::nlog!(INFO, NET, "{msg}");
        }
    }
}

/// One line per request that changes something: `head`, who asked, what it did or why not.
fn log_request(head: &str, peer: Peer, r: &Reply) {
    let mut what = vec![];
    for i in &r.items {
        match i {
            Item::Swapped(s) => what.push(match &s.old {
                Some((old, g)) => format!(
                    "{} '{old}' (generation {g}) -> '{}' (generation {})",
                    s.section, s.new, s.generation
                ),
                None => format!(
                    "{} attached '{}' (generation {})",
                    s.section, s.new, s.generation
                ),
            }),
            Item::Refused { section, name, .. } => what.push(format!("{section} '{name}' refused")),
            Item::Staged { section, name, at } => {
                what.push(format!("{section} '{name}' staged from seq {at}"))
            }
            Item::StagedConfig { map, values, at } => what.push(format!(
                "config {} staged from seq {at}",
                ConfigUpdate {
                    map: map.clone(),
                    values: values.clone()
                }
                .describe()
            )),
            Item::Rejected {
                what: w,
                name,
                message,
            } => {
                // The head of the message (for the verifier: the rejected instruction); the
                // whole of it went back to the client.
                let head: Vec<&str> = message.lines().take(2).map(str::trim).collect();
                what.push(format!("{w} '{name}': {}", head.join(" ")))
            }
            _ => {}
        }
    }
    let head = format!("{head} (asked by pid {})", peer.pid);
    match &r.result {
        Ok(()) => crate::nlog!(INFO, NET, "{head}: {}", what.join("; ")),
        Err(e) => crate::nlog!(WARN, NET, "{head} failed: {e}; {}", what.join("; ")),
    }
}

/// Starts the control socket once per process (the first successful `init`).
pub fn start(config: &Config) {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        if !config.control {
            crate::nlog!(INFO, INIT, "control socket off (NCCL_BPF_CONTROL=0)");
            return;
        }
        match server::start(Arc::new(Plugin)) {
            Ok(path) => crate::nlog!(
                INFO,
                INIT,
                "control socket {} (ncclbpf status {pid}, ncclbpf reload {pid} OBJECT)",
                path.display(),
                pid = std::process::id()
            ),
            Err(e) => crate::nlog!(WARN, INIT, "no control socket (reload unavailable): {e}"),
        }
    });
}

/// What runs at each net hook.
pub fn status() -> Reply {
    let (generation, set) = hooks::net().snapshot();
    let mut items = vec![Item::Process {
        pid: std::process::id(),
        generation,
        live_programs: LIVE_PROGRAMS.load(Ordering::Relaxed) as u64,
    }];
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
    items.extend(tuner_items(&HISTORY));
    Reply::ok(items)
}

/// The staged tuner programs and config updates, in order, and every tuner context with its
/// decision count and the start of the next staged change.
fn tuner_items(history: &History) -> Vec<Item> {
    let staged = history.staged();
    // Starts are strictly increasing over both kinds: a start names one stage.
    let configs = history.configs_from(0);
    let mut items: Vec<Item> = staged
        .iter()
        .map(
            |(at, name, _)| match configs.iter().find(|(_, from, _)| from == at) {
                Some((_, _, up)) => Item::StagedConfig {
                    map: up.map.clone(),
                    values: up.values.clone(),
                    at: *at,
                },
                None => Item::Staged {
                    section: "tuner".into(),
                    name: name.clone(),
                    at: *at,
                },
            },
        )
        .collect();
    for (id, seq) in history.contexts() {
        items.push(Item::Comm {
            id,
            seq,
            switch_at: staged.iter().map(|s| s.0).find(|&a| a > seq),
        });
    }
    for (id, what) in history.agreements() {
        items.push(Item::Other(format!("agreement comm {id:#018x}: {what}")));
    }
    items
}

/// `stage SEQ PATH`: the object's tuner program takes over at decision SEQ of every
/// communicator ([`ncclbpf_tuner::stage`]), and its net programs, if it has any, are swapped in
/// now as by `reload`. All or nothing: a net reload that fails withdraws the stage.
pub fn stage(
    path: &Path,
    at: u64,
    registry: &Registry,
    opts: &LoadOptions,
    history: &History,
) -> Reply {
    let shown = path.display().to_string();
    let obj = {
        let _one = RELOAD.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                return Reply::error(vec![], format!("cannot read {shown}: {e}; {UNCHANGED}"));
            }
        };
        match policy_object::Object::parse(&bytes) {
            Ok(o) => o,
            Err(e) => return Reply::error(vec![], format!("{shown}: {e}; {UNCHANGED}")),
        }
    };
    let staged = match ncclbpf_tuner::stage::stage_object(&obj, &shown, at, registry, history) {
        Ok(s) => s,
        Err(e) => {
            let name = match &e {
                StageError::Load { name, .. } | StageError::Refused { name, .. } => name.clone(),
                _ => "-".into(),
            };
            return Reply::error(
                vec![Item::Rejected {
                    what: "tuner".into(),
                    name,
                    message: e.to_string(),
                }],
                format!("no tuner program staged: {e}; {UNCHANGED}"),
            );
        }
    };
    let mut items = vec![];
    if obj
        .programs
        .iter()
        .any(|p| hooks::hook_of(&p.section).is_some())
    {
        let r = reload(path, registry, opts);
        if let Err(e) = &r.result {
            let withdrawn = match history.unstage() {
                Ok(_) => "the tuner stage was withdrawn".to_string(),
                Err((a, ctxs)) => format!(
                    "the tuner stage at seq {a} could NOT be withdrawn: {} context(s) already run it",
                    ctxs.len()
                ),
            };
            return Reply::error(r.items, format!("{e}; {withdrawn}"));
        }
        items.extend(
            r.items
                .into_iter()
                .filter(|i| !matches!(i, Item::Refused { section, .. } if section == "tuner")),
        );
    }
    if staged.rules_kept {
        items.push(Item::Ignored {
            section: "map".into(),
            name: ncclbpf_tuner::rules::MAP_NAME.into(),
            reason:
                "the staged program shares the running program's rules table as it is: a stage \
                     does not read the rules file again (that would change the running rules at \
                     once, not at the stated collective)"
                    .into(),
        });
    }
    for (section, name, reason) in staged.refused {
        items.push(Item::Refused {
            section,
            name,
            reason,
        });
    }
    items.push(Item::Staged {
        section: "tuner".into(),
        name: staged.name,
        at: staged.at,
    });
    items.extend(
        tuner_items(history)
            .into_iter()
            .filter(|i| matches!(i, Item::Comm { .. })),
    );
    Reply::ok(items)
}

/// `stage-config SEQ MAP K=V,...`: `stage` (in the process: [`ncclbpf_tuner::stage::stage_config`],
/// which checks the update against the running tuner program) stages new values for a config map
/// of the tuner program, seen from decision `at` of every communicator. Nothing else changes.
pub fn stage_config(
    at: u64,
    update: ConfigUpdate,
    source: &str,
    history: &History,
    stage: fn(&History, u64, ConfigUpdate, &str) -> Result<(), String>,
) -> Reply {
    let (map, values) = (update.map.clone(), update.values.clone());
    if let Err(e) = stage(history, at, update, source) {
        return Reply::error(
            vec![Item::Rejected {
                what: "config".into(),
                name: map,
                message: e.clone(),
            }],
            format!("no config update staged: {e}; {UNCHANGED}"),
        );
    }
    let mut items = vec![Item::StagedConfig { map, values, at }];
    items.extend(
        tuner_items(history)
            .into_iter()
            .filter(|i| matches!(i, Item::Comm { .. })),
    );
    Reply::ok(items)
}

/// `unstage`: drops the last staged tuner program or config update if no communicator reached
/// it.
pub fn unstage(history: &History) -> Reply {
    let config_at = |at: u64| history.configs_from(0).iter().any(|c| c.1 == at);
    let before: Vec<u64> = history.configs_from(0).iter().map(|c| c.1).collect();
    match history.unstage() {
        Ok(Some(at)) if before.contains(&at) => Reply::ok(vec![Item::Other(format!(
            "unstaged the config update at seq {at}"
        ))]),
        Ok(Some(at)) => Reply::ok(vec![Item::Other(format!(
            "unstaged the switch at seq {at}"
        ))]),
        Ok(None) => Reply::ok(vec![Item::Other("nothing was staged".into())]),
        Err((at, ctxs)) => {
            let list: Vec<String> = ctxs
                .iter()
                .map(|(c, s)| format!("comm {c:#018x} at seq {s}"))
                .collect();
            let (what, does) = if config_at(at) {
                ("config update", "use the staged values")
            } else {
                ("switch", "run the staged program")
            };
            Reply::error(
                vec![],
                format!(
                    "the {what} at seq {at} stays: {} already {does}",
                    list.join(", ")
                ),
            )
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use ncclbpf_tuner::stage::Watch;
    use std::sync::atomic::AtomicU64;

    /// Stages in `h` without the check against the process's tuner program.
    fn plain(h: &History, at: u64, up: ConfigUpdate, source: &str) -> Result<(), String> {
        h.stage_config(at, up, source).map_err(|r| r.to_string())
    }

    fn limit(v: u64) -> ConfigUpdate {
        ConfigUpdate {
            map: "limit".into(),
            values: vec![(0, v)],
        }
    }

    #[test]
    fn staged_config_updates_are_listed_and_withdrawn() {
        let h = History::new();
        let seq = Arc::new(AtomicU64::new(10));
        let s = seq.clone();
        let _w = h.watch(Watch {
            comm_id: 0xabc,
            seq: Box::new(move || s.load(Ordering::Relaxed)),
            views: true,
            agreement: None,
        });
        let r = stage_config(500, limit(100), "test", &h, plain);
        assert_eq!(r.result, Ok(()), "{}", r.to_text());
        assert_eq!(
            r.to_text(),
            "staged config limit 0=100 at=500\ncomm 0x0000000000000abc seq=10 switch_at=500\nok\n"
        );
        // Status lists it among the staged changes, by kind.
        assert_eq!(
            tuner_items(&h)[0],
            Item::StagedConfig {
                map: "limit".into(),
                values: vec![(0, 100)],
                at: 500
            }
        );
        // Refused: changes nothing, says why.
        let r = stage_config(400, limit(1), "test", &h, plain);
        let e = r.result.clone().unwrap_err();
        assert!(
            e.starts_with("no config update staged: a switch at seq 500 is already staged")
                && e.ends_with("nothing was changed"),
            "{e}"
        );
        assert!(
            matches!(&r.items[..], [Item::Rejected { what, name, .. }] if what == "config" && name == "limit")
        );
        assert_eq!(tuner_items(&h).len(), 2, "one stage, one context");
        // Withdrawn while no context reached it; kept once one has.
        stage_config(600, limit(2), "test", &h, plain)
            .result
            .unwrap();
        seq.store(600, Ordering::Relaxed);
        let r = unstage(&h);
        assert_eq!(
            r.result,
            Err("the config update at seq 600 stays: comm 0x0000000000000abc at seq 600 already use the staged values".into())
        );
        seq.store(100, Ordering::Relaxed);
        assert_eq!(
            unstage(&h).items,
            [Item::Other("unstaged the config update at seq 600".into())]
        );
        assert_eq!(
            unstage(&h).items,
            [Item::Other("unstaged the config update at seq 500".into())]
        );
        assert_eq!(
            unstage(&h).items,
            [Item::Other("nothing was staged".into())]
        );
    }

    #[test]
    fn a_context_without_views_refuses_config_updates() {
        let h = History::new();
        let _w = h.watch(Watch {
            comm_id: 0xdef,
            seq: Box::new(|| 0),
            views: false,
            agreement: None,
        });
        let r = stage_config(500, limit(100), "test", &h, plain);
        let e = r.result.unwrap_err();
        assert!(
            e.contains("0x0000000000000def") && e.contains("NCCL_BPF_AGREEMENT=on"),
            "{e}"
        );
        assert!(h.staged().is_empty());
    }
}
