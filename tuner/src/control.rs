//! The tuner's part of the control socket ([`ncclbpf_host::peers::TunerPeer`]): staged tuner
//! swaps (`ncclbpf reload --at-seq`, [`crate::stage`]), staged config updates (`ncclbpf config
//! --at-seq`), `unstage`, and what `ncclbpf status` lists of the tuner (staged changes, every
//! context with its decision count, every agreement). Registered with the host when NCCL opens
//! the first tuner context ([`register`]).

use crate::stage::{self, ConfigUpdate, HISTORY, History, StageError};
use ncclbpf_control::protocol::{Item, Reply};
use shared_maps::Registry;

const UNCHANGED: &str = "nothing was changed";

struct Tuner;

impl ncclbpf_host::peers::TunerPeer for Tuner {
    fn items(&self) -> Vec<Item> {
        tuner_items(&HISTORY)
    }

    fn stage(
        &self,
        obj: &policy_object::Object,
        shown: &str,
        at: u64,
        registry: &Registry,
    ) -> Result<Vec<Item>, Reply> {
        stage_object(obj, shown, at, registry, &HISTORY)
    }

    fn withdraw(&self) -> String {
        withdraw(&HISTORY)
    }

    fn stage_config(&self, at: u64, map: &str, values: &[(u32, u64)], source: &str) -> Reply {
        let update = ConfigUpdate {
            map: map.to_string(),
            values: values.to_vec(),
        };
        stage_config(at, update, source, &HISTORY, stage::stage_config)
    }

    fn unstage(&self) -> Reply {
        unstage(&HISTORY)
    }
}

/// Registers the tuner with the host (once per process; NCCL's first tuner `init`).
pub fn register() {
    static TUNER: Tuner = Tuner;
    ncclbpf_host::peers::register_tuner(&TUNER);
}

/// The staged tuner programs and config updates, in order, and every tuner context with its
/// decision count and the start of the next staged change.
pub fn tuner_items(history: &History) -> Vec<Item> {
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

/// `stage SEQ PATH`, the tuner's part: the object's tuner program takes over at decision SEQ of
/// every communicator ([`crate::stage`]). The items say what was staged and what was not; an
/// `Err` is the whole reply of a refusal (nothing staged).
pub fn stage_object(
    obj: &policy_object::Object,
    shown: &str,
    at: u64,
    registry: &Registry,
    history: &History,
) -> Result<Vec<Item>, Reply> {
    let staged = stage::stage_object(obj, shown, at, registry, history).map_err(|e| {
        let name = match &e {
            StageError::Load { name, .. } | StageError::Refused { name, .. } => name.clone(),
            _ => "-".into(),
        };
        Reply::error(
            vec![Item::Rejected {
                what: "tuner".into(),
                name,
                message: e.to_string(),
            }],
            format!("no tuner program staged: {e}; {UNCHANGED}"),
        )
    })?;
    let mut items = vec![];
    if staged.rules_kept {
        items.push(Item::Ignored {
            section: "map".into(),
            name: crate::rules::MAP_NAME.into(),
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
    Ok(items)
}

/// Withdraws the stage just made (the net part of its object failed to load).
pub fn withdraw(history: &History) -> String {
    match history.unstage() {
        Ok(_) => "the tuner stage was withdrawn".to_string(),
        Err((a, ctxs)) => format!(
            "the tuner stage at seq {a} could NOT be withdrawn: {} context(s) already run it",
            ctxs.len()
        ),
    }
}

/// `stage-config SEQ MAP K=V,...`: `stage` (in the process: [`crate::stage::stage_config`],
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::Watch;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

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
