//! The process's control socket (`<registry dir>/<pid>.ctl`): `status`, `reload`, staged tuner
//! swaps (`reload --at-seq`), config updates (`config --at-seq`) and `unstage`, answered from
//! the registered peers ([`crate::peers`]) whatever subset of plugin types NCCL loaded.
//!
//! Started by the first hold of the host ([`crate::life`]) unless `NCCL_BPF_CONTROL=0`.
//! Requests are served on the control thread, so loading, verifying and compiling never run on
//! NCCL's threads; the only thing a reload or a stage does to them is one store that their next
//! call notices.
//!
//! * `reload PATH` swaps the object's net programs in, all or nothing (the net plugin's
//!   `reload`); its tuner programs are refused (a tuner swap must happen at the same collective
//!   on every rank). Without our net plugin there is no net hook: the reply says so and nothing
//!   changes.
//! * `stage SEQ PATH` stages the object's tuner program at decision SEQ of every communicator
//!   (the tuner's part) and swaps its net programs now, if our net plugin runs: all or nothing,
//!   a net reload that fails withdraws the stage. Without our net plugin its net programs are
//!   listed as ignored.
//! * `stage-config SEQ MAP K=V,...` and `unstage` are the tuner's.
//! * `status` lists the process (pid, generation of the net programs, live programs), the net
//!   hooks (with our net plugin), the staged changes and every tuner context (with our tuner).

use crate::peers::{self, NetPeer, TunerPeer};
use ncclbpf_control::protocol::{Item, Reply, Request, TUNER_REFUSAL};
use ncclbpf_control::server::{self, Handler, Peer};
use policy_runtime::LoadOptions;
use policy_runtime::program::LIVE_PROGRAMS;
use shared_maps::Registry;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Once};

/// The variable that turns the control socket off.
pub const VAR: &str = "NCCL_BPF_CONTROL";

const UNCHANGED: &str = "nothing was changed";

struct Host;

impl Handler for Host {
    fn handle(&self, req: &Request, peer: Peer) -> Reply {
        let (net, tuner) = (peers::net(), peers::tuner());
        let registry = Registry::global();
        let opts = LoadOptions::default();
        match req {
            Request::Status => status(net, tuner),
            Request::Reload(path) => {
                let r = reload(net, path, registry, &opts);
                log_request(&format!("reload {}", path.display()), peer, &r);
                r
            }
            Request::Stage { at, path } => {
                let r = stage(net, tuner, path, *at, registry, &opts);
                log_request(&format!("reload {}", path.display()), peer, &r);
                if let Some(n) = net {
                    n.count_reload(r.result.is_ok());
                }
                r
            }
            Request::StageConfig { at, map, values } => {
                let head = format!("config {} at seq {at}", describe(map, values));
                let r = match tuner {
                    Some(t) => t.stage_config(
                        *at,
                        map,
                        values,
                        &format!("ncclbpf config (pid {})", peer.pid),
                    ),
                    None => no_tuner("no config update staged"),
                };
                log_request(&head, peer, &r);
                r
            }
            Request::Unstage => {
                let r = match tuner {
                    Some(t) => t.unstage(),
                    None => Reply::ok(vec![Item::Other(
                        "nothing was staged (no tuner of ours in this process)".into(),
                    )]),
                };
                log_request("unstage", peer, &r);
                r
            }
        }
    }

    fn log(&self, warn: bool, msg: &str) {
        if warn {
            crate::hlog!(WARN, INIT, "{msg}");
        } else {
            crate::hlog!(INFO, INIT, "{msg}");
        }
    }
}

/// Whether `NCCL_BPF_CONTROL` (its value, if set) leaves the control socket on: `0` turns it
/// off, `1` or nothing leaves it on; anything else is `Err` (the caller warns, it stays on).
pub fn enabled(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => Err(format!(
            "{VAR}={v:?}: expected 0 or 1; the control socket stays on"
        )),
    }
}

/// Starts the control socket once per process (the first hold of the host).
pub fn start() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let on = enabled(std::env::var(VAR).ok().as_deref()).unwrap_or_else(|e| {
            crate::hlog!(WARN, ENV, "{e}");
            true
        });
        if !on {
            crate::hlog!(INFO, INIT, "control socket off ({VAR}=0)");
            return;
        }
        match server::start(Arc::new(Host)) {
            Ok(path) => crate::hlog!(
                INFO,
                INIT,
                "control socket {} (ncclbpf status {pid}, ncclbpf reload {pid} OBJECT)",
                path.display(),
                pid = std::process::id()
            ),
            Err(e) => crate::hlog!(WARN, INIT, "no control socket (reload unavailable): {e}"),
        }
    });
}

/// The process, the net hooks and the tuner's contexts, from whichever peers are registered.
pub fn status(net: Option<&dyn NetPeer>, tuner: Option<&dyn TunerPeer>) -> Reply {
    let (generation, hooks) = net.map(|n| n.hooks()).unwrap_or_default();
    let mut items = vec![Item::Process {
        pid: std::process::id(),
        generation,
        live_programs: LIVE_PROGRAMS.load(Ordering::Relaxed) as u64,
    }];
    items.extend(hooks);
    if let Some(t) = tuner {
        items.extend(t.items());
    }
    Reply::ok(items)
}

fn no_tuner(what: &str) -> Reply {
    Reply::error(
        vec![],
        format!(
            "{what}: NCCL has not initialised the tuner of ours in this process \
             (NCCL_TUNER_PLUGIN, or the net library on NCCL 2.21+); {UNCHANGED}"
        ),
    )
}

/// Reads and parses the object at `path`, or the reply that says why not.
fn read_object(path: &Path) -> Result<policy_object::Object, Reply> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path)
        .map_err(|e| Reply::error(vec![], format!("cannot read {shown}: {e}; {UNCHANGED}")))?;
    policy_object::Object::parse(&bytes)
        .map_err(|e| Reply::error(vec![], format!("{shown}: {e}; {UNCHANGED}")))
}

/// `reload PATH`: the net plugin's, or, without it, a refusal that lists every program.
pub fn reload(
    net: Option<&dyn NetPeer>,
    path: &Path,
    registry: &Registry,
    opts: &LoadOptions,
) -> Reply {
    if let Some(n) = net {
        let r = n.reload(path, registry, opts);
        n.count_reload(r.result.is_ok());
        return r;
    }
    let obj = match read_object(path) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let items = obj
        .programs
        .iter()
        .map(|p| {
            if policy_runtime::setting::is_tuner_section(&p.section) {
                Item::Refused {
                    section: p.section.clone(),
                    name: p.name.clone(),
                    reason: TUNER_REFUSAL.to_string(),
                }
            } else {
                Item::Ignored {
                    section: p.section.clone(),
                    name: p.name.clone(),
                    reason: NO_NET.to_string(),
                }
            }
        })
        .collect();
    Reply::error(
        items,
        format!(
            "{} has no net program to swap in this process ({NO_NET}); {UNCHANGED}",
            path.display()
        ),
    )
}

const NO_NET: &str = "no net plugin of ours runs in this process, so no net hook";

/// `stage SEQ PATH` (see the module's documentation).
pub fn stage(
    net: Option<&dyn NetPeer>,
    tuner: Option<&dyn TunerPeer>,
    path: &Path,
    at: u64,
    registry: &Registry,
    opts: &LoadOptions,
) -> Reply {
    let Some(tuner) = tuner else {
        return no_tuner("no tuner program staged");
    };
    let obj = match read_object(path) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let shown = path.display().to_string();
    let staged = match tuner.stage(&obj, &shown, at, registry) {
        Ok(items) => items,
        Err(r) => return r,
    };
    let mut items = vec![];
    let net_sections: Vec<&policy_object::Program> = obj
        .programs
        .iter()
        .filter(|p| match net {
            Some(n) => n.is_net_section(&p.section),
            None => policy_runtime::setting::Scope::Net.wants(&p.section),
        })
        .collect();
    match net {
        Some(n) if !net_sections.is_empty() => {
            let r = n.reload(path, registry, opts);
            if let Err(e) = &r.result {
                let withdrawn = tuner.withdraw();
                return Reply::error(r.items, format!("{e}; {withdrawn}"));
            }
            items.extend(
                r.items
                    .into_iter()
                    .filter(|i| !matches!(i, Item::Refused { section, .. } if section == "tuner")),
            );
        }
        Some(_) => {}
        None => items.extend(net_sections.iter().map(|p| Item::Ignored {
            section: p.section.clone(),
            name: p.name.clone(),
            reason: NO_NET.to_string(),
        })),
    }
    items.extend(staged);
    items.extend(
        tuner
            .items()
            .into_iter()
            .filter(|i| matches!(i, Item::Comm { .. })),
    );
    Reply::ok(items)
}

/// `MAP K=V,...`.
fn describe(map: &str, values: &[(u32, u64)]) -> String {
    let kv: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{map} {}", kv.join(","))
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
                describe(map, values)
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
        Ok(()) => crate::hlog!(INFO, INIT, "{head}: {}", what.join("; ")),
        Err(e) => crate::hlog!(WARN, INIT, "{head} failed: {e}; {}", what.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting() {
        assert_eq!(enabled(None), Ok(true));
        assert_eq!(enabled(Some(" 1 ")), Ok(true));
        assert_eq!(enabled(Some("0")), Ok(false));
        assert!(enabled(Some("off")).unwrap_err().contains("stays on"));
    }

    #[test]
    fn without_peers_status_names_the_process_and_requests_change_nothing() {
        let r = status(None, None);
        assert_eq!(r.result, Ok(()));
        assert!(matches!(r.items[..], [Item::Process { generation: 0, .. }]));
        let opts = LoadOptions::default();
        let r = stage(
            None,
            None,
            Path::new("/nonexistent.o"),
            5,
            Registry::global(),
            &opts,
        );
        assert!(r.result.unwrap_err().contains("not initialised the tuner"));
        let r = reload(None, Path::new("/nonexistent.o"), Registry::global(), &opts);
        assert!(r.result.unwrap_err().contains("cannot read"));
    }
}
