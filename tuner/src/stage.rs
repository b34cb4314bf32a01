//! Staged tuner swaps: a new `tuner` program takes over at a stated sequence number of every
//! communicator, so that every rank of a communicator switches at the same collective
//! (`ncclbpf reload --at-seq N`).
//!
//! The process keeps a *history* of tuner programs: the one it started with, then each staged
//! program with the sequence number it starts at (strictly increasing). A context's decision
//! number `s` (from 1, [`crate::sequence`]) is made by the last program of the history whose
//! start is at most `s`. Every process that received the same stages therefore runs the same
//! program for decision `s` of a communicator, whatever the wall-clock moment the stage reached
//! it, and also for communicators created after the stage (they count from 1 like any other).
//!
//! What [`stage`] refuses, so that the guarantee holds:
//! - a start at or before the last one in the history;
//! - a start that a live context has passed or is within [`MARGIN`] decisions of (the context
//!   notices a new stage at its next call; the margin keeps that call well before the start);
//! - a process that started without a `tuner` policy (its contexts number nothing).
//!
//! [`unstage`] drops the last stage if no context has reached its start. The command line stages
//! all processes of a job, then unstages the ones that accepted if any refused.
//!
//! Cost on the hot path: one load of the history's generation and one comparison of the next
//! decision number with the context's next switch point, both predicted; the history itself is
//! read (under its lock) only when it changed or a switch point is reached.

use policy_runtime::ProgramSlot;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A live context must be at least this many decisions before a stage's start.
pub const MARGIN: u64 = 64;

/// One staged change: a program, or new values for a config map.
pub struct Entry {
    /// The first decision number it makes (or that sees the new values).
    pub from: u64,
    /// Lives as long as the process: contexts and their fallback path keep `&'static` to it.
    /// `None` for a config update.
    pub slot: Option<&'static ProgramSlot>,
    pub name: String,
    pub source: String,
    /// A config update: the map and its new (entry, value) pairs.
    pub config: Option<ConfigUpdate>,
}

/// New values for entries of a config map (`NCCLBPF_CONFIG`, an array of u64 values), seen by
/// a context from a stated decision on ([`History::stage_config`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigUpdate {
    pub map: String,
    pub values: Vec<(u32, u64)>,
}

impl ConfigUpdate {
    /// `map k=v,k=v`, as status and logs show it.
    pub fn describe(&self) -> String {
        let kv: Vec<String> = self
            .values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{} {}", self.map, kv.join(","))
    }
}

/// What a live context shows of itself.
pub struct Watch {
    pub comm_id: u64,
    /// The number of the last decision made (0: none), as the context's sequence says.
    pub seq: Box<dyn Fn() -> u64 + Send + Sync>,
    /// Whether it keeps its own view of config maps (it runs the agreement), which staged
    /// config updates need.
    pub views: bool,
    /// Its agreement, as `ncclbpf status` shows it (`None` without one).
    pub agreement: Option<Arc<crate::agree::Shown>>,
}

/// A process's staged programs and the contexts they apply to ([`HISTORY`] is the process's;
/// tests make their own).
pub struct History {
    entries: Mutex<Vec<Entry>>,
    /// Bumped on every change of `entries`.
    generation: AtomicU64,
    contexts: Mutex<Vec<Weak<Watch>>>,
}

/// The process's history.
pub static HISTORY: History = History::new();

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stage that stays: its start and the contexts (comm id, decisions) that reached it.
pub type Reached = (u64, Vec<(u64, u64)>);

/// Why a stage was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `at` is not after the last stage's start.
    NotAfter { at: u64, last: u64 },
    /// Contexts at or too near `at`: (comm id, last decision number).
    TooLate { at: u64, contexts: Vec<(u64, u64)> },
    /// Decision numbers start at 1.
    Zero,
    /// A context of the process runs the agreement (`crate::agree`).
    Agreement,
    /// Live contexts (comm ids) that keep no views of config maps.
    NoViews(Vec<u64>),
    /// Contexts made later would keep none (why).
    NoFutureViews(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotAfter { at, last } => write!(
                f,
                "a switch at seq {last} is already staged: a new one must start after it (not at {at})"
            ),
            Refusal::TooLate { at, contexts } => {
                let list: Vec<String> = contexts
                    .iter()
                    .map(|(c, s)| format!("comm {c:#018x} at seq {s}"))
                    .collect();
                write!(
                    f,
                    "too late for seq {at}: {} (a switch needs every communicator at least {MARGIN} \
                     collectives before it, so that every rank switches at the same one)",
                    list.join(", ")
                )
            }
            Refusal::Zero => write!(f, "sequence numbers start at 1"),
            Refusal::NoViews(comms) => {
                let list: Vec<String> = comms.iter().map(|c| format!("{c:#018x}")).collect();
                write!(
                    f,
                    "communicator(s) {} read the process-wide config maps, which every \
                     communicator of the process shares, so new values could not take effect at \
                     one stated collective of each: staged config updates need the per-communicator \
                     views that contexts running the agreement keep (start the job with \
                     NCCL_BPF_AGREEMENT=on; a communicator over several nodes runs it only where \
                     our net plugin carries its records)",
                    list.join(", ")
                )
            }
            Refusal::NoFutureViews(why) => write!(f, "{why}"),
            Refusal::Agreement => write!(
                f,
                "a tuner context of this process runs the agreement between ranks: a staged swap \
                 would have to carry its records' layout and epoch state over, which is not \
                 supported yet (restart the job with the new policy)"
            ),
        }
    }
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    pub const fn new() -> History {
        History {
            entries: Mutex::new(Vec::new()),
            generation: AtomicU64::new(1),
            contexts: Mutex::new(Vec::new()),
        }
    }

    /// Changes on every stage and unstage (a relaxed-cheap check for contexts).
    #[inline(always)]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Registers a context for [`contexts`](Self::contexts) and the checks of
    /// [`stage`](Self::stage); it is forgotten when the returned `Arc` is dropped.
    pub fn watch(&self, w: Watch) -> Arc<Watch> {
        let w = Arc::new(w);
        let mut all = lock(&self.contexts);
        all.retain(|c| c.strong_count() > 0);
        all.push(Arc::downgrade(&w));
        w
    }

    /// Every live context: (comm id, last decision number), in creation order.
    pub fn contexts(&self) -> Vec<(u64, u64)> {
        lock(&self.contexts)
            .iter()
            .filter_map(Weak::upgrade)
            .map(|w| (w.comm_id, (w.seq)()))
            .collect()
    }

    /// Every live context that runs the agreement: (comm id, what its agreement is doing).
    pub fn agreements(&self) -> Vec<(u64, String)> {
        lock(&self.contexts)
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|w| Some((w.comm_id, w.agreement.as_ref()?.describe())))
            .collect()
    }

    /// Which program makes decision `next` (`None`: the one the process started with), and
    /// the start of the next stage after it (`u64::MAX`: none).
    pub fn program_for(&self, next: u64) -> (Option<&'static ProgramSlot>, u64) {
        let h = lock(&self.entries);
        let mut slot = None;
        let mut next_switch = u64::MAX;
        for e in h.iter() {
            let Some(es) = e.slot else { continue };
            if e.from <= next {
                slot = Some(es);
            } else {
                next_switch = next_switch.min(e.from);
            }
        }
        (slot, next_switch)
    }

    /// The config updates from the `seen`-th on (counting config updates only, in order):
    /// `(index, start, update)`.
    pub fn configs_from(&self, seen: usize) -> Vec<(usize, u64, ConfigUpdate)> {
        lock(&self.entries)
            .iter()
            .filter_map(|e| Some((e.from, e.config.clone()?)))
            .enumerate()
            .skip(seen)
            .map(|(i, (from, c))| (i, from, c))
            .collect()
    }

    /// Stages new values for a config map, seen from decision `at` of every communicator
    /// (`check` validates the update against the running program first). Refused like a program
    /// stage, and also while a live context keeps no views of its config maps (a context that
    /// does not run the agreement reads the process-wide map, which every communicator shares:
    /// its contents cannot change at one communicator's decision only).
    pub fn stage_config(&self, at: u64, update: ConfigUpdate, source: &str) -> Result<(), Refusal> {
        self.stage_config_for(at, update, source, Ok(()))
    }

    /// [`stage_config`](Self::stage_config), and refused with `later`'s reason when contexts
    /// made later would keep no views (after the checks of the live ones).
    pub fn stage_config_for(
        &self,
        at: u64,
        update: ConfigUpdate,
        source: &str,
        later: Result<(), String>,
    ) -> Result<(), Refusal> {
        if at == 0 {
            return Err(Refusal::Zero);
        }
        let mut h = lock(&self.entries);
        if let Some(last) = h.last()
            && last.from >= at
        {
            return Err(Refusal::NotAfter {
                at,
                last: last.from,
            });
        }
        let (late, viewless) = {
            let all = lock(&self.contexts);
            let live: Vec<Arc<Watch>> = all.iter().filter_map(Weak::upgrade).collect();
            (
                live.iter()
                    .map(|w| (w.comm_id, (w.seq)()))
                    .filter(|&(_, s)| s.saturating_add(MARGIN) >= at)
                    .collect::<Vec<_>>(),
                live.iter()
                    .filter(|w| !w.views)
                    .map(|w| w.comm_id)
                    .collect::<Vec<_>>(),
            )
        };
        if !viewless.is_empty() {
            return Err(Refusal::NoViews(viewless));
        }
        if let Err(why) = later {
            return Err(Refusal::NoFutureViews(why));
        }
        if !late.is_empty() {
            return Err(Refusal::TooLate { at, contexts: late });
        }
        h.push(Entry {
            from: at,
            slot: None,
            name: format!("config {}", update.describe()),
            source: source.to_string(),
            config: Some(update),
        });
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Appends `slot` to the history, starting at decision `at`; refuses (changing nothing)
    /// what would not switch every rank at the same collective.
    pub fn stage(
        &self,
        at: u64,
        slot: ProgramSlot,
        name: &str,
        source: &str,
    ) -> Result<(), Refusal> {
        if at == 0 {
            return Err(Refusal::Zero);
        }
        if ncclbpf_agreement::active() {
            return Err(Refusal::Agreement);
        }
        let mut h = lock(&self.entries);
        if let Some(last) = h.last()
            && last.from >= at
        {
            return Err(Refusal::NotAfter {
                at,
                last: last.from,
            });
        }
        // Checked under the history's lock, so no other stage slips in between.
        let late: Vec<(u64, u64)> = self
            .contexts()
            .into_iter()
            .filter(|&(_, s)| s.saturating_add(MARGIN) >= at)
            .collect();
        if !late.is_empty() {
            return Err(Refusal::TooLate { at, contexts: late });
        }
        h.push(Entry {
            from: at,
            // A staged slot lives as long as the process (a few kilobytes per operator
            // reload): contexts keep `&'static` to it.
            slot: Some(Box::leak(Box::new(slot))),
            name: name.to_string(),
            source: source.to_string(),
            config: None,
        });
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Drops the last stage: `Ok(Some(start))`, `Ok(None)` when nothing is staged. `Err` with
    /// its start and the contexts that already reached it (it is then kept: they run it).
    pub fn unstage(&self) -> Result<Option<u64>, Reached> {
        let mut h = lock(&self.entries);
        let Some(last) = h.last() else {
            return Ok(None);
        };
        let at = last.from;
        let reached: Vec<(u64, u64)> = self
            .contexts()
            .into_iter()
            .filter(|&(_, s)| s >= at)
            .collect();
        if !reached.is_empty() {
            return Err((at, reached));
        }
        h.pop();
        self.generation.fetch_add(1, Ordering::Release);
        Ok(Some(at))
    }

    /// The staged programs: (start, name, source), in order.
    pub fn staged(&self) -> Vec<(u64, String, String)> {
        lock(&self.entries)
            .iter()
            .map(|e| (e.from, e.name.clone(), e.source.clone()))
            .collect()
    }
}

/// What [`stage_object`] staged, and what it left out on purpose.
#[derive(Debug)]
pub struct Staged {
    pub name: String,
    pub at: u64,
    /// (section, program, why): `tuner/init` and `tuner/chunk` programs, which are not staged.
    pub refused: Vec<(String, String, String)>,
    /// Set when the staged program shares the running program's rules table as it is (a
    /// stage does not read the rules file again: that would change the running program's rules
    /// at once, on each rank whenever the stage reached it, not at the stated decision).
    pub rules_kept: bool,
}

/// Why [`stage_object`] staged nothing.
#[derive(Debug)]
pub enum StageError {
    /// The process started without a `tuner` policy: its communicators count nothing.
    NoPolicy,
    /// The object has no `tuner` program (or several, and none is named).
    NoProgram(String),
    /// The program failed to load, verify or compile (the whole message).
    Load {
        name: String,
        message: String,
    },
    Refused {
        name: String,
        refusal: Refusal,
    },
}

impl std::fmt::Display for StageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StageError::NoPolicy => write!(
                f,
                "this process started without a tuner policy, so its communicators' collectives \
                 were not counted and no switch point can be the same on every rank (start jobs \
                 with NCCL_BPF_POLICY naming a tuner program, noop.o for no opinion)"
            ),
            StageError::NoProgram(why) => write!(f, "{why}"),
            StageError::Load { name, message } => write!(f, "'{name}': {message}"),
            StageError::Refused { name, refusal } => write!(f, "'{name}' not staged: {refusal}"),
        }
    }
}

/// Loads, verifies and compiles the `tuner` program of `obj` (read from `path`) with maps from
/// `registry` (a map of the same name and shape is the same map, state and all; a rules table
/// is filled as at start), and stages it at decision `at` in `history`. `tuner/init` and
/// `tuner/chunk` programs are left out (init ran when each communicator was made; chunk sizes
/// are not staged), and said so.
pub fn stage_object(
    obj: &policy_object::Object,
    path: &str,
    at: u64,
    registry: &shared_maps::Registry,
    history: &History,
) -> Result<Staged, StageError> {
    if crate::policy::slot().is_none() {
        return Err(StageError::NoPolicy);
    }
    stage_program(obj, path, at, registry, history)
}

/// [`stage_object`] without the process check (tests).
pub fn stage_program(
    obj: &policy_object::Object,
    path: &str,
    at: u64,
    registry: &shared_maps::Registry,
    history: &History,
) -> Result<Staged, StageError> {
    let tuners: Vec<&policy_object::Program> = obj
        .programs
        .iter()
        .filter(|p| p.section == "tuner")
        .collect();
    let prog = match tuners.as_slice() {
        [one] => *one,
        [] => {
            return Err(StageError::NoProgram(format!(
                "{path} has no program in a 'tuner' section"
            )));
        }
        many => {
            let names: Vec<&str> = many.iter().map(|p| p.name.as_str()).collect();
            return Err(StageError::NoProgram(format!(
                "{path} has {} tuner programs ({}): which to stage is ambiguous",
                many.len(),
                names.join(", ")
            )));
        }
    };
    let refused = obj
        .programs
        .iter()
        .filter(|p| p.section == "tuner/init" || p.section == "tuner/chunk")
        .map(|p| {
            let why = if p.section == "tuner/init" {
                "tuner/init ran when each communicator was made; it is not staged"
            } else {
                "tuner/chunk programs are not staged (the chunk size stays with the program the process started with)"
            };
            (p.section.clone(), p.name.clone(), why.to_string())
        })
        .collect();
    let table = crate::rules::MAP_NAME;
    let rules_kept = obj.maps.iter().any(|m| m.name == table)
        && registry
            .shared_maps()
            .iter()
            .any(|m| m.spec().name == table);
    let loaded = if rules_kept {
        policy_runtime::LoadedProgram::load_as(
            obj,
            Some(&prog.name),
            path,
            registry,
            &Default::default(),
        )
        .map_err(|e| format!("{path}: {e}"))
    } else {
        crate::policy::load_program(obj, &prog.name, path, registry)
    }
    .map_err(|message| StageError::Load {
        name: prog.name.clone(),
        message,
    })?;
    history
        .stage(at, ProgramSlot::new(loaded), &prog.name, path)
        .map_err(|refusal| StageError::Refused {
            name: prog.name.clone(),
            refusal,
        })?;
    Ok(Staged {
        name: prog.name.clone(),
        at,
        refused,
        rules_kept,
    })
}

/// Validates `update` against the process's tuner program and stages it at decision `at` of
/// every communicator (`ncclbpf config --at-seq`).
pub fn stage_config(
    history: &History,
    at: u64,
    update: ConfigUpdate,
    source: &str,
) -> Result<(), String> {
    let Some(slot) = crate::policy::slot() else {
        return Err(StageError::NoPolicy.to_string());
    };
    let prog = slot.current();
    crate::agree::check_config(&prog, &update)?;
    // Contexts made later must keep views too, or they would pass the update over.
    let setting = crate::agree::Setting::from_env();
    let later = if setting.keeps_views(&prog) {
        Ok(())
    } else {
        Err(format!(
            "this process's tuner contexts do not run the agreement (NCCL_BPF_AGREEMENT={}, \
             policy '{}'), so communicators made later keep no per-communicator views of config \
             maps and new values could not take effect at one stated collective of each (start \
             the job with NCCL_BPF_AGREEMENT=on)",
            setting.mode_name(),
            prog.name
        ))
    };
    history
        .stage_config_for(at, update, source, later)
        .map_err(|r| r.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn slot() -> ProgramSlot {
        let obj = policy_object::Object {
            programs: vec![policy_object::Program {
                name: "p".into(),
                section: "tuner".into(),
                insns: policy_object::asm::assemble("mov %r0, 0\nexit").unwrap(),
                lines: vec![],
            }],
            maps: vec![],
        };
        let reg = shared_maps::Registry::new(
            std::env::temp_dir().join(format!("ncclbpf-stage-test-{}", std::process::id())),
        );
        ProgramSlot::new(
            policy_runtime::LoadedProgram::load(&obj, None, &reg, &Default::default()).unwrap(),
        )
    }

    fn context(h: &History, comm: u64, at: u64) -> (Arc<Watch>, Arc<AtomicU64>) {
        let seq = Arc::new(AtomicU64::new(at));
        let s = seq.clone();
        let w = h.watch(Watch {
            comm_id: comm,
            seq: Box::new(move || s.load(Ordering::Relaxed)),
            views: false,
            agreement: None,
        });
        (w, seq)
    }

    #[test]
    fn each_decision_number_has_one_program() {
        let h = History::new();
        let (_w, seq) = context(&h, 7, 10);
        let none = |n: u64| {
            let (p, next) = h.program_for(n);
            (p.is_none(), next)
        };
        assert_eq!(none(1), (true, u64::MAX));
        let g = h.generation();
        h.stage(1000, slot(), "a", "/a.o").unwrap();
        assert_ne!(h.generation(), g, "a stage changes the generation");
        h.stage(5000, slot(), "b", "/b.o").unwrap();
        let (a, b) = {
            let e = h.entries.lock().unwrap();
            (e[0].slot.unwrap(), e[1].slot.unwrap())
        };
        assert_eq!(none(999), (true, 1000));
        let (p, next) = h.program_for(1000);
        assert!(std::ptr::eq(p.unwrap(), a) && next == 5000);
        let (p, next) = h.program_for(4999);
        assert!(std::ptr::eq(p.unwrap(), a) && next == 5000);
        let (p, next) = h.program_for(5000);
        assert!(std::ptr::eq(p.unwrap(), b) && next == u64::MAX);
        assert_eq!(
            h.staged(),
            [
                (1000, "a".into(), "/a.o".into()),
                (5000, "b".into(), "/b.o".into())
            ]
        );
        // Starts must increase; zero is no decision number.
        assert_eq!(
            h.stage(5000, slot(), "c", "/c.o"),
            Err(Refusal::NotAfter {
                at: 5000,
                last: 5000
            })
        );
        assert_eq!(h.stage(0, slot(), "c", "/c.o"), Err(Refusal::Zero));
        // Unstage drops the last one while no context reached it.
        seq.store(4000, Ordering::Relaxed);
        assert_eq!(h.unstage(), Ok(Some(5000)));
        assert_eq!(
            h.unstage(),
            Err((1000, vec![(7, 4000)])),
            "comm 7 runs 'a' already"
        );
        assert_eq!(h.staged().len(), 1);
    }

    #[test]
    fn a_context_at_or_near_the_start_refuses_it() {
        let h = History::new();
        let (_a, _) = context(&h, 1, 100);
        let (b, _) = context(&h, 2, 1000);
        let err = h.stage(1000 + MARGIN, slot(), "x", "/x.o").unwrap_err();
        assert_eq!(
            err,
            Refusal::TooLate {
                at: 1000 + MARGIN,
                contexts: vec![(2, 1000)]
            }
        );
        assert!(
            err.to_string()
                .contains("comm 0x0000000000000002 at seq 1000"),
            "{err}"
        );
        assert!(h.staged().is_empty(), "nothing changed");
        h.stage(1001 + MARGIN, slot(), "x", "/x.o").unwrap();
        // A finished context no longer counts.
        drop(b);
        assert_eq!(h.contexts(), [(1, 100)]);
        assert_eq!(h.unstage(), Ok(Some(1001 + MARGIN)));
        assert_eq!(h.unstage(), Ok(None));
    }
}
