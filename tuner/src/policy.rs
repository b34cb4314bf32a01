//! The tuner programs of this process, loaded once from the objects `NCCL_BPF_POLICY` (or its
//! alias `NCCL_BPF_TUNER_POLICY`) lists: the `tuner` program (the first, or the one named by
//! `NCCL_BPF_TUNER_PROGRAM`), and the first `tuner/init`, `tuner/chunk` and `tuner/epoch` programs. A program
//! that fails to load or verify is logged with the verifier's message and NCCL keeps its own
//! choices for that hook.

use policy_object::Object;
use policy_runtime::setting::{self, Scope, Source};
use policy_runtime::{LoadOptions, LoadedProgram, ProgramSlot};
use shared_maps::Registry;
use std::sync::OnceLock;

/// The tuner side's programs.
#[derive(Default)]
pub struct TunerPrograms {
    pub tuner: Option<ProgramSlot>,
    pub init: Option<LoadedProgram>,
    pub chunk: Option<LoadedProgram>,
    pub epoch: Option<LoadedProgram>,
}

static PROGRAMS: OnceLock<TunerPrograms> = OnceLock::new();

const NOT_LOADED: &str = "tuner policy not loaded, NCCL keeps its own choices";

/// A line for NCCL's log about loading the tuner's programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// A program attached.
    Loaded(String),
    /// Something could not be used (NCCL keeps its choices for that hook).
    Problem(String),
}

/// Loads `name` of `obj` (a policy with a `tuner_rules` map gets its rules first); errors
/// name `path`.
pub fn load_program(
    obj: &Object,
    name: &str,
    path: &str,
    registry: &Registry,
) -> Result<LoadedProgram, String> {
    load_one(obj, name, path, registry)
}

/// Loads `name` of `obj` (a policy with a `tuner_rules` map gets its rules first).
fn load_one(
    obj: &Object,
    name: &str,
    path: &str,
    registry: &Registry,
) -> Result<LoadedProgram, String> {
    let p = LoadedProgram::load_as(obj, Some(name), path, registry, &LoadOptions::default())
        .map_err(|e| format!("{path}: {e}"))?;
    crate::rules::install(&p).map(|_| p)
}

/// Loads the policy named by `path` (and optionally `program`) for the `tuner` hook.
pub fn load(
    path: &str,
    program: Option<&str>,
    registry: &Registry,
) -> Result<LoadedProgram, String> {
    let src = Source {
        path: path.to_string(),
        var: setting::TUNER_ALIAS,
        scope: Scope::Tuner,
    };
    let obj = src.read_object()?;
    let name = match program {
        Some(p) => p.to_string(),
        None => obj
            .programs
            .iter()
            .find(|p| p.section == "tuner")
            .map(|p| p.name.clone())
            .ok_or_else(|| format!("{path}: no program in a 'tuner' section"))?,
    };
    load_one(&obj, &name, path, registry)
}

/// Loads the tuner programs the settings name (`get` reads them: the environment in
/// production), with a note for each program loaded and each problem.
pub fn load_from(
    get: &dyn Fn(&str) -> Option<String>,
    registry: &Registry,
) -> (TunerPrograms, Vec<Note>) {
    let mut out = TunerPrograms::default();
    let mut notes = Vec::new();
    let wanted = get("NCCL_BPF_TUNER_PROGRAM").filter(|p| !p.trim().is_empty());
    let wanted = wanted.as_deref().map(str::trim);
    let listed = setting::sources_from(get);
    // Objects whose maps conflict with an earlier listed object's: refused on every side.
    let refused = setting::declaration_conflicts(&listed);
    let sources: Vec<Source> = listed
        .into_iter()
        .filter(|s| s.scope != Scope::Net)
        .collect();
    let mut tuner_seen = false;
    for src in &sources {
        if let Some(why) = refused.get(&src.path) {
            notes.push(Note::Problem(why.clone()));
            continue;
        }
        let obj = match src.read_object() {
            Ok(o) => o,
            Err(e) => {
                notes.push(Note::Problem(e));
                continue;
            }
        };
        for p in obj.programs.iter().filter(|p| src.scope.wants(&p.section)) {
            match p.section.as_str() {
                "tuner" => {
                    if out.tuner.is_some() || wanted.is_some_and(|w| w != p.name) {
                        continue;
                    }
                    tuner_seen = true;
                    match load_one(&obj, &p.name, &src.path, registry) {
                        Ok(lp) => {
                            notes.push(Note::Loaded(format!(
                                "policy '{}' from {} ({} insns, verified in {:?}, {:?})",
                                lp.name,
                                src.path,
                                lp.stats.insns,
                                lp.times.verify,
                                lp.tier()
                            )));
                            out.tuner = Some(ProgramSlot::new(lp));
                        }
                        Err(e) => notes.push(Note::Problem(e)),
                    }
                }
                "tuner/init" | "tuner/chunk" | "tuner/epoch" => {
                    let slot = match p.section.as_str() {
                        "tuner/init" => &mut out.init,
                        "tuner/chunk" => &mut out.chunk,
                        _ => &mut out.epoch,
                    };
                    if slot.is_some() {
                        notes.push(Note::Problem(format!(
                            "{}: a second program for {} ('{}') ignored",
                            src.path, p.section, p.name
                        )));
                        continue;
                    }
                    match load_one(&obj, &p.name, &src.path, registry) {
                        Ok(lp) => {
                            notes.push(Note::Loaded(format!(
                                "{} program '{}' from {} ({} insns, {:?})",
                                p.section,
                                lp.name,
                                src.path,
                                lp.stats.insns,
                                lp.tier()
                            )));
                            *slot = Some(lp);
                        }
                        Err(e) => notes.push(Note::Problem(e)),
                    }
                }
                _ => {}
            }
        }
        // Named as a tuner policy, yet nothing for the tuner in it: say so.
        if src.scope == Scope::Tuner
            && !obj
                .programs
                .iter()
                .any(|p| setting::is_tuner_section(&p.section))
        {
            notes.push(Note::Problem(format!(
                "{}: no program in a 'tuner' section",
                src.path
            )));
        }
    }
    if let Some(w) = wanted
        && !tuner_seen
        && !sources.is_empty()
    {
        notes.push(Note::Problem(format!(
            "NCCL_BPF_TUNER_PROGRAM={w}: no 'tuner' program of that name in the listed objects"
        )));
    }
    (out, notes)
}

fn programs() -> &'static TunerPrograms {
    PROGRAMS.get_or_init(|| {
        let (p, notes) = load_from(&|k| std::env::var(k).ok(), Registry::global());
        for n in notes {
            match n {
                Note::Loaded(l) => crate::tlog!(INFO, TUNING, "{l}"),
                Note::Problem(l) => crate::tlog!(WARN, TUNING, "{NOT_LOADED}: {l}"),
            }
        }
        p
    })
}

/// The process's `tuner` program slot, if one loaded.
pub fn slot() -> Option<&'static ProgramSlot> {
    programs().tuner.as_ref()
}

/// The `tuner/init` program, if one loaded.
pub fn init_program() -> Option<&'static LoadedProgram> {
    programs().init.as_ref()
}

/// The `tuner/chunk` program, if one loaded.
pub fn chunk_program() -> Option<&'static LoadedProgram> {
    programs().chunk.as_ref()
}

/// The `tuner/epoch` program, if one loaded.
pub fn epoch_program() -> Option<&'static LoadedProgram> {
    programs().epoch.as_ref()
}
