//! The profiler's policy programs: every program of `NCCL_BPF_POLICY` whose section is one of
//! the `profiler/*` hooks, loaded once per process, first come per hook (as the net hooks do).
//! A program that fails to load or verify is reported in NCCL's log, and the profiler carries on
//! without it.
//!
//! Programs run at an event's end, outside every lock of this crate, on NCCL's thread that
//! ended the event (the proxy thread for most). Their maps are rank-local: the verifier refuses
//! a tuner program that reads them (the locality rule); the tuner sees what they measured only
//! through the agreement's epochs.

use ncclnet_headers::profiler::event;
use policy_runtime::setting::{self, Source};
use policy_runtime::{LoadOptions, LoadedProgram, ProfilerCtx};
use policy_verifier::platform::PROFILER_SECTIONS;
use shared_maps::Registry;
use std::sync::OnceLock;

/// `event` values of `struct ncclbpf_profiler_ctx` (`NCCLBPF_PROF_*`), in
/// [`PROFILER_SECTIONS`] order from 1.
pub const PROF_COLL: u32 = 1;
pub const PROF_P2P: u32 = 2;
pub const PROF_PROXY_OP: u32 = 3;
pub const PROF_PROXY_STEP: u32 = 4;
pub const PROF_KERNEL_CH: u32 = 5;
pub const PROF_NET: u32 = 6;

/// The event-type bit each hook needs NCCL to report, in [`PROFILER_SECTIONS`] order.
pub const HOOK_BITS: [u64; 6] = [
    event::COLL | event::KERNEL_CH,
    event::P2P | event::KERNEL_CH,
    event::PROXY_OP,
    event::PROXY_STEP,
    event::KERNEL_CH,
    event::NET_PLUGIN,
];

/// One program per hook.
#[derive(Default)]
pub struct Programs {
    pub by_hook: [Option<(LoadedProgram, String)>; 6],
}

impl Programs {
    /// Loads the `profiler/*` programs of the objects `sources` name; problems come back as log
    /// lines.
    pub fn load(sources: &[Source], registry: &Registry) -> (Programs, Vec<String>) {
        let mut out = Programs::default();
        let mut problems = vec![];
        let opts = LoadOptions::default();
        // Objects whose maps conflict with an earlier listed object's: refused on every side.
        let refused = setting::declaration_conflicts(sources);
        for src in sources.iter().filter(|s| s.scope == setting::Scope::All) {
            if let Some(why) = refused.get(&src.path) {
                problems.push(why.clone());
                continue;
            }
            let obj = match src.read_object() {
                Ok(o) => o,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            for p in obj
                .programs
                .iter()
                .filter(|p| setting::is_profiler_section(&p.section))
            {
                let Some(h) = PROFILER_SECTIONS.iter().position(|s| *s == p.section) else {
                    problems.push(format!(
                        "{}: program '{}' in section '{}': no such profiler hook (there are {}); ignored",
                        src.path,
                        p.name,
                        p.section,
                        PROFILER_SECTIONS.join(", ")
                    ));
                    continue;
                };
                if out.by_hook[h].is_some() {
                    problems.push(format!(
                        "{}: a second program for {} ('{}') ignored",
                        src.path, p.section, p.name
                    ));
                    continue;
                }
                match LoadedProgram::load_as(&obj, Some(&p.name), &src.path, registry, &opts) {
                    Ok(lp) => out.by_hook[h] = Some((lp, src.path.clone())),
                    Err(e) => problems.push(format!("{}: {e}", src.path)),
                }
            }
        }
        (out, problems)
    }

    /// Event-type bits the loaded programs need.
    pub fn mask(&self) -> u64 {
        self.by_hook
            .iter()
            .zip(HOOK_BITS)
            .filter(|(p, _)| p.is_some())
            .fold(0, |m, (_, b)| m | b)
    }

    /// Runs the program of `ctx.event`'s hook, if there is one; whether one ran.
    pub fn run(&self, ctx: &mut ProfilerCtx) -> bool {
        let Some(i) = (ctx.event as usize).checked_sub(1) else {
            return false;
        };
        match self.by_hook.get(i) {
            Some(Some((p, _))) => {
                p.run(ctx);
                true
            }
            _ => false,
        }
    }
}

static PROGRAMS: OnceLock<Programs> = OnceLock::new();

/// The process's profiler programs, loaded on first use from `NCCL_BPF_POLICY`.
pub fn programs() -> &'static Programs {
    PROGRAMS.get_or_init(|| {
        let sources = setting::sources();
        if sources.is_empty() {
            return Programs::default();
        }
        let (p, problems) = Programs::load(&sources, Registry::global());
        for m in problems {
            crate::plog!(WARN, PROFILE, "profiler policy: {m}");
        }
        for (h, lp) in p.by_hook.iter().enumerate() {
            if let Some((lp, path)) = lp {
                crate::plog!(
                    INFO,
                    PROFILE,
                    "profiler policy: '{}' from {path} attached to {} ({} insns, {:?})",
                    lp.name,
                    PROFILER_SECTIONS[h],
                    lp.stats.insns,
                    lp.tier()
                );
            }
        }
        p
    })
}
