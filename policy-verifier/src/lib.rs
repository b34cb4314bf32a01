//! A kernel-style verifier for ncclbpf policies.
//!
//! [`verify`] runs two passes over a program:
//!
//! 1. structure ([`check`]): opcodes, registers, jump targets (in range, not into an `lddw`),
//!    map references, size limit;
//! 2. exploration: every path is followed over abstract states ([`state`]): registers typed as
//!    scalar (known bits and signed/unsigned bounds, [`scalar`]), context pointer, stack pointer,
//!    map pointer, map value, or map value that may be NULL; stack bytes tracked as written or
//!    not, with spilled registers kept. States already proven safe prune later ones; loops are
//!    followed iteration by iteration until their exit is decided. Stored states share what
//!    they did not change ([`frames`]); the exploration's memory and work are bounded
//!    ([`budget`]), a program past a limit rejected as `too_complex`, the limit named.
//!
//! What each hook may touch (context fields and their rights, helpers) is data in
//! [`platform`]. A rejection ([`VerifyError`]) names the instruction, the register, the reason
//! with its numbers, the C source line when the object has line info, and the path taken.

// A rejection carries its diagnosis (disassembly, state, path); it is not a hot path.
#![allow(clippy::result_large_err)]

pub mod budget;
pub mod check;
pub mod error;
pub mod frames;
pub mod liveness;
pub mod platform;
pub mod scalar;
pub mod state;

pub use budget::Exceeded;
pub use check::Stats;
pub use error::{Reject, VerifyError};
pub use platform::{Hook, Limits, MapInfo};

use policy_object::{MapDef, Program};

/// The verifier's view of an object's maps.
pub fn map_infos(maps: &[MapDef]) -> Vec<MapInfo> {
    maps.iter()
        .map(|m| MapInfo {
            name: m.name.clone(),
            key_size: m.key_size,
            value_size: m.value_size,
            max_entries: m.max_entries,
            read_only: m.read_only,
            global_data: m.initial.is_some(),
            scope: m.scope,
            array: m.kind != policy_object::MapKind::Hash,
        })
        .collect()
}

/// Verifies `prog` for the hook its section names.
pub fn verify(prog: &Program, maps: &[MapInfo], limits: Limits) -> Result<Stats, VerifyError> {
    let Some(hook) = platform::hook(&prog.section) else {
        return Err(VerifyError {
            insn: 0,
            reject: Reject::UnknownHook {
                section: prog.section.clone(),
            },
            disasm: String::new(),
            state: String::new(),
            source: None,
            path: vec![],
            processed: 0,
        });
    };
    verify_insns(&prog.insns, hook, maps, limits).map_err(|mut e| {
        e.source = prog.line_for(e.insn).map(|l| {
            let file = l.file.rsplit('/').next().unwrap_or(&l.file);
            format!("{file}:{}: {}", l.line, l.text.trim())
        });
        e
    })
}

/// Verifies raw instructions for `hook`.
///
/// Never panics: a panic inside the verifier (a bug) is caught and becomes a rejection, so a
/// hostile object can at worst be refused, never take the host process down.
pub fn verify_insns(
    insns: &[policy_object::Insn],
    hook: &Hook,
    maps: &[MapInfo],
    limits: Limits,
) -> Result<Stats, VerifyError> {
    let run = || check::Checker::new(insns, hook, maps, limits).run();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(VerifyError {
            insn: 0,
            reject: Reject::Internal { what },
            disasm: String::new(),
            state: String::new(),
            source: None,
            path: vec![],
            processed: 0,
        })
    })
}
