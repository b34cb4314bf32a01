//! Which policy objects a process loads: `NCCL_BPF_POLICY`, a comma-separated list of objects
//! whose every program attaches to the hook its section names (`tuner`, `net/*`), and the two
//! older, narrower settings kept as aliases: `NCCL_BPF_NET_POLICY` (objects whose `net/*`
//! programs attach) and `NCCL_BPF_TUNER_POLICY` (objects whose `tuner` program attaches).
//!
//! Each side of the plugin (the net hooks, the tuner) asks [`sources`] for the objects that
//! concern it, parses them and takes the programs of its own hooks, first come: the first
//! program for a hook, in the order objects are listed (`NCCL_BPF_POLICY` first, then the
//! aliases), is attached and later ones are reported and ignored.
//!
//! Objects listed together share the maps they declare alike, and must not declare one name
//! otherwise ([`declaration_conflicts`]): an object whose declarations conflict with an earlier
//! listed object's is refused by every side, whichever side loads first, so that every rank with
//! the same setting loads the same programs.

use std::collections::{HashMap, HashSet};

/// Which programs of an object a setting asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every program (`NCCL_BPF_POLICY`).
    All,
    /// `net/*` programs only (`NCCL_BPF_NET_POLICY`).
    Net,
    /// The `tuner` program only (`NCCL_BPF_TUNER_POLICY`).
    Tuner,
}

impl Scope {
    /// Whether programs of `section` are wanted from an object named with this scope.
    pub fn wants(self, section: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Net => section.starts_with("net/"),
            Scope::Tuner => is_tuner_section(section),
        }
    }
}

/// Whether `section` is the tuner's (`tuner`, `tuner/init`, `tuner/chunk`, `tuner/epoch`, …),
/// which the net side leaves alone.
pub fn is_tuner_section(section: &str) -> bool {
    section == "tuner" || section.starts_with("tuner/")
}

/// Whether `section` is the profiler's (`profiler/coll`, …), which the net side and the tuner
/// leave alone.
pub fn is_profiler_section(section: &str) -> bool {
    section.starts_with("profiler/")
}

/// One object to load and the setting that named it (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub path: String,
    pub var: &'static str,
    pub scope: Scope,
}

impl Source {
    /// Reads and parses the object; the error names the setting and the path.
    pub fn read_object(&self) -> Result<policy_object::Object, String> {
        std::fs::read(&self.path)
            .map_err(|e| e.to_string())
            .and_then(|b| policy_object::Object::parse(&b).map_err(|e| e.to_string()))
            .map_err(|e| format!("{}={}: {e}", self.var, self.path))
    }
}

pub const POLICY_VAR: &str = "NCCL_BPF_POLICY";
pub const NET_ALIAS: &str = "NCCL_BPF_NET_POLICY";
pub const TUNER_ALIAS: &str = "NCCL_BPF_TUNER_POLICY";

/// The objects named by the settings (read through `get`: the environment in production),
/// in attach order, each path once (the widest scope that names it wins its place).
pub fn sources_from(get: &dyn Fn(&str) -> Option<String>) -> Vec<Source> {
    let mut out: Vec<Source> = Vec::new();
    let mut seen = HashSet::new();
    for (var, scope) in [
        (POLICY_VAR, Scope::All),
        (NET_ALIAS, Scope::Net),
        (TUNER_ALIAS, Scope::Tuner),
    ] {
        let Some(v) = get(var) else { continue };
        for path in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if !seen.insert(path.to_string()) {
                // Named twice: an alias adds its hooks to the object already listed.
                if let Some(s) = out.iter_mut().find(|s| s.path == path)
                    && s.scope != scope
                {
                    s.scope = Scope::All;
                }
                continue;
            }
            out.push(Source {
                path: path.to_string(),
                var,
                scope,
            });
        }
    }
    out
}

/// [`sources_from`] the environment.
pub fn sources() -> Vec<Source> {
    sources_from(&|k| std::env::var(k).ok())
}

/// The listed objects that no side may load, by path, with why: those that declare a map name
/// otherwise than an earlier listed object does (the registry's comparison,
/// [`shared_maps::compare`]: shape, scope, epoch source, reduction). The first listed keeps the
/// name. Every side of the plugin (net hooks, tuner, profiler) asks this of every listed object,
/// whatever its scope, before loading its own programs: the answer depends on the setting and
/// the files alone, not on which side loads first, which may differ between ranks (a tuner
/// program refused on one rank only would decide there differently from the others). Objects
/// that cannot be read are left out (each loader reports them).
pub fn declaration_conflicts(sources: &[Source]) -> HashMap<String, String> {
    let mut declared: HashMap<String, (shared_maps::MapIdentity, String)> = HashMap::new();
    let mut refused = HashMap::new();
    for src in sources {
        let Ok(obj) = src.read_object() else { continue };
        let ids: Vec<_> = obj
            .maps
            .iter()
            .filter(|m| m.initial.is_none())
            .map(crate::program::identity_of)
            .collect();
        let clash = ids.iter().find_map(|id| {
            let (first, owner) = declared.get(&id.spec.name)?;
            shared_maps::compare(first, owner, id, &src.path).err()
        });
        match clash {
            Some(e) => {
                refused.insert(
                    src.path.clone(),
                    format!(
                        "{}: not loaded: {e} (objects listed together share a map name only if \
                         they declare it alike; the first listed keeps it)",
                        src.path
                    ),
                );
            }
            None => {
                for id in ids {
                    declared
                        .entry(id.spec.name.clone())
                        .or_insert_with(|| (id, src.path.clone()));
                }
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Vec<Source> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        sources_from(&move |k| m.get(k).cloned())
    }

    #[test]
    fn one_setting_a_list_and_the_aliases() {
        assert!(with(&[]).is_empty());
        assert!(with(&[(POLICY_VAR, " , ")]).is_empty());
        let s = with(&[
            (POLICY_VAR, "a.o, b.o"),
            (NET_ALIAS, "n.o"),
            (TUNER_ALIAS, "t.o"),
        ]);
        let got: Vec<_> = s.iter().map(|s| (s.path.as_str(), s.scope)).collect();
        assert_eq!(
            got,
            [
                ("a.o", Scope::All),
                ("b.o", Scope::All),
                ("n.o", Scope::Net),
                ("t.o", Scope::Tuner)
            ]
        );
        assert_eq!(s[2].var, NET_ALIAS);
    }

    #[test]
    fn an_object_named_twice_is_loaded_once() {
        let s = with(&[(NET_ALIAS, "x.o"), (TUNER_ALIAS, "x.o")]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].scope, Scope::All, "both aliases: both kinds of hooks");
        let s = with(&[(POLICY_VAR, "x.o"), (NET_ALIAS, "x.o")]);
        assert_eq!((s.len(), s[0].scope), (1, Scope::All));
    }

    #[test]
    fn scopes_pick_sections() {
        assert!(Scope::Net.wants("net/isend") && !Scope::Net.wants("tuner"));
        assert!(Scope::Tuner.wants("tuner") && Scope::Tuner.wants("tuner/init"));
        assert!(Scope::Tuner.wants("tuner/epoch") && is_tuner_section("tuner/epoch"));
        assert!(!Scope::Net.wants("tuner/epoch"));
        assert!(!Scope::Tuner.wants("net/close"));
        assert!(Scope::All.wants("net/close") && Scope::All.wants("tuner"));
    }
}
