//! The tuner policy of this process: loaded once from `NCCL_BPF_TUNER_POLICY` (the first
//! `tuner` program of the object, or the one named by `NCCL_BPF_TUNER_PROGRAM`). A policy that
//! fails to load or verify is logged and NCCL keeps its own choices.

use policy_runtime::{LoadOptions, LoadedProgram, ProgramSlot};
use shared_maps::Registry;
use std::sync::OnceLock;

static SLOT: OnceLock<Option<ProgramSlot>> = OnceLock::new();

/// Loads the policy named by `path` (and optionally `program`) for the tuner hook.
pub fn load(
    path: &str,
    program: Option<&str>,
    registry: &Registry,
) -> Result<LoadedProgram, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("NCCL_BPF_TUNER_POLICY={path}: {e}"))?;
    let obj = policy_object::Object::parse(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let name = match program {
        Some(p) => p.to_string(),
        None => obj
            .programs
            .iter()
            .find(|p| p.section == "tuner")
            .map(|p| p.name.clone())
            .ok_or_else(|| format!("{path}: no program in a 'tuner' section"))?,
    };
    LoadedProgram::load(&obj, Some(&name), registry, &LoadOptions::default())
        .map_err(|e| format!("{path}: {e}"))
}

/// The process's tuner policy slot, if a policy loaded.
pub fn slot() -> Option<&'static ProgramSlot> {
    SLOT.get_or_init(|| {
        let path = std::env::var("NCCL_BPF_TUNER_POLICY")
            .ok()
            .filter(|p| !p.trim().is_empty())?;
        let program = std::env::var("NCCL_BPF_TUNER_PROGRAM")
            .ok()
            .filter(|p| !p.trim().is_empty());
        // A policy with a `tuner_rules` map gets its rules before its first decision.
        match load(path.trim(), program.as_deref(), Registry::global())
            .and_then(|p| crate::rules::install(&p).map(|_| p))
        {
            Ok(p) => {
                crate::tlog!(
                    INFO,
                    TUNING,
                    "policy '{}' from {} ({} insns, verified in {:?}, {:?})",
                    p.name,
                    path.trim(),
                    p.stats.insns,
                    p.times.verify,
                    p.tier()
                );
                Some(ProgramSlot::new(p))
            }
            Err(e) => {
                crate::tlog!(
                    WARN,
                    TUNING,
                    "tuner policy not loaded, NCCL keeps its own choices: {e}"
                );
                None
            }
        }
    })
    .as_ref()
}
