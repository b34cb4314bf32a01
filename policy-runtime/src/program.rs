//! Loading a policy: maps bound, verified, map references patched to addresses, compiled.

use crate::ctx::{Context, CtxKind};
use crate::helpers;
use crate::interp;
use crate::jit::compile::{InlineArray, JitError, MAP_LOOKUP, translate_with};
use crate::jit::exec::ExecBuf;
use policy_object::insn::{self as op, Insn};
use policy_object::{MapKind, Object, ObjectError};
use policy_verifier::platform::HELPER_MAP_LOOKUP;
use policy_verifier::{Limits, Stats, VerifyError};
use shared_maps::{
    Map, MapIdentity, MapReduce, MapScope, MapSpec, MapType, Registry, RegistryError,
};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How programs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Jit,
    Interpreter,
}

impl Tier {
    /// JIT on x86-64 unless `NCCL_BPF_JIT=0`; the interpreter elsewhere.
    pub fn from_env() -> Tier {
        let off = std::env::var("NCCL_BPF_JIT").is_ok_and(|v| v.trim() == "0");
        if cfg!(target_arch = "x86_64") && !off {
            Tier::Jit
        } else {
            Tier::Interpreter
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    pub tier: Tier,
    pub limits: Limits,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            tier: Tier::from_env(),
            limits: Limits::default(),
        }
    }
}

/// Why a policy did not load.
#[derive(Debug)]
pub enum LoadError {
    Object(ObjectError),
    NoProgram {
        wanted: String,
        available: Vec<String>,
    },
    Verify {
        program: String,
        error: VerifyError,
    },
    Map(RegistryError),
    Jit(JitError),
    Exec(std::io::Error),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Object(e) => write!(f, "{e}"),
            LoadError::NoProgram { wanted, available } => {
                write!(
                    f,
                    "no program '{wanted}' in the object (it has: {})",
                    available.join(", ")
                )
            }
            LoadError::Verify { program, error } => {
                write!(f, "program '{program}' rejected by the verifier:\n{error}")
            }
            LoadError::Map(e) => write!(f, "{e}"),
            LoadError::Jit(e) => write!(f, "{e}"),
            LoadError::Exec(e) => write!(f, "cannot map JIT code executable: {e}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// Programs alive in this process (for leak tests and diagnostics).
pub static LIVE_PROGRAMS: AtomicUsize = AtomicUsize::new(0);

/// Load timings.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadTimes {
    pub verify: Duration,
    pub compile: Duration,
}

/// A verified program, ready to run.
pub struct LoadedProgram {
    pub name: String,
    pub section: String,
    pub stats: Stats,
    pub times: LoadTimes,
    insns: Vec<Insn>,
    maps: Vec<Arc<Map>>,
    /// The object's definitions of `maps`, index for index.
    defs: Vec<policy_object::MapDef>,
    exec: Option<ExecBuf>,
    /// Array lookups the JIT computes inline instead of calling the helper.
    inlined_lookups: usize,
    /// A number callers may set to tell versions apart (e.g. a reload generation).
    pub tag: u64,
    /// The context the section's programs take (`run` checks it per call).
    kind: Option<CtxKind>,
}

impl fmt::Debug for LoadedProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LoadedProgram({} in {}, {} insns, {:?})",
            self.name,
            self.section,
            self.insns.len(),
            self.tier()
        )
    }
}

fn spec_of(m: &policy_object::MapDef, name: String) -> MapSpec {
    MapSpec {
        name,
        kind: match m.kind {
            MapKind::Hash => MapType::Hash,
            MapKind::Array => MapType::Array,
            MapKind::PercpuArray => MapType::PercpuArray,
        },
        key_size: m.key_size,
        value_size: m.value_size,
        max_entries: m.max_entries,
    }
}

/// What the registry compares when another program declares a map of the same name: the shape
/// and every property the verifier (scope, read-only, global data: `MapInfo`), the locality rule
/// (scope) and the agreement (epoch source, reduction) took from this declaration.
pub fn identity_of(m: &policy_object::MapDef) -> MapIdentity {
    MapIdentity {
        spec: spec_of(m, m.name.clone()),
        scope: match m.scope {
            policy_object::Scope::Local => MapScope::Local,
            policy_object::Scope::Agreed => MapScope::Agreed,
            policy_object::Scope::Config => MapScope::Config,
        },
        source: m.source,
        reduce: match m.reduce {
            policy_object::Reduce::Sum => MapReduce::Sum,
            policy_object::Reduce::Max => MapReduce::Max,
            policy_object::Reduce::Min => MapReduce::Min,
        },
        read_only: m.read_only,
        global_data: m.initial.is_some(),
    }
}

/// How a program is named as a map's declarer in registry errors: `<object> (<section> program
/// '<name>')`, or without the object when `origin` is empty.
pub fn owner(origin: &str, section: &str, name: &str) -> String {
    if origin.is_empty() {
        format!("{section}:{name}")
    } else {
        format!("{origin} ({section} program '{name}')")
    }
}

impl LoadedProgram {
    /// Parses `bytes` and loads program `name` (or the only program).
    pub fn from_elf(
        bytes: &[u8],
        name: Option<&str>,
        registry: &Registry,
        opts: &LoadOptions,
    ) -> Result<LoadedProgram, LoadError> {
        let obj = Object::parse(bytes).map_err(LoadError::Object)?;
        LoadedProgram::load(&obj, name, registry, opts)
    }

    pub fn load(
        obj: &Object,
        name: Option<&str>,
        registry: &Registry,
        opts: &LoadOptions,
    ) -> Result<LoadedProgram, LoadError> {
        LoadedProgram::check(obj, name, opts)?.bind(registry, opts)
    }

    /// [`load`](Self::load) with the object's path (`origin`) named in map conflicts, as
    /// [`Verified::bind_as`].
    pub fn load_as(
        obj: &Object,
        name: Option<&str>,
        origin: &str,
        registry: &Registry,
        opts: &LoadOptions,
    ) -> Result<LoadedProgram, LoadError> {
        LoadedProgram::check(obj, name, opts)?.bind_as(registry, opts, origin)
    }

    /// The first step of [`load`](Self::load): finds program `name` (or the only program) and
    /// verifies it, touching no map. [`Verified::bind`] finishes the load. Loading several
    /// programs all or nothing: check every one, then [`check_maps`], then bind them.
    pub fn check<'a>(
        obj: &'a Object,
        name: Option<&str>,
        opts: &LoadOptions,
    ) -> Result<Verified<'a>, LoadError> {
        let prog = match name {
            Some(n) => obj.program(n),
            None if obj.programs.len() == 1 => obj.programs.first(),
            None => None,
        }
        .ok_or_else(|| LoadError::NoProgram {
            wanted: name.unwrap_or("<the only program>").to_string(),
            available: obj
                .programs
                .iter()
                .map(|p| format!("{} ({})", p.name, p.section))
                .collect(),
        })?;
        let infos = policy_verifier::map_infos(&obj.maps);
        let t0 = Instant::now();
        let stats = policy_verifier::verify(prog, &infos, opts.limits).map_err(|error| {
            LoadError::Verify {
                program: prog.name.clone(),
                error,
            }
        })?;
        Ok(Verified {
            obj,
            prog,
            stats,
            verify: t0.elapsed(),
        })
    }
}

/// Checks that every named map of `obj` can be bound in `registry`: a map of the same name
/// that already exists there has the same identity ([`identity_of`]). Creates nothing. `owner`
/// names the declaration in the message ([`owner`](fn@owner)).
pub fn check_maps(obj: &Object, registry: &Registry, owner: &str) -> Result<(), LoadError> {
    for m in obj.maps.iter().filter(|m| m.initial.is_none()) {
        registry
            .check(&identity_of(m), owner)
            .map_err(LoadError::Map)?;
    }
    Ok(())
}

/// A program that passed the verifier, not yet bound to maps or compiled.
pub struct Verified<'a> {
    obj: &'a Object,
    prog: &'a policy_object::Program,
    pub stats: Stats,
    /// How long verification took.
    pub verify: Duration,
}

impl Verified<'_> {
    pub fn name(&self) -> &str {
        &self.prog.name
    }

    pub fn section(&self) -> &str {
        &self.prog.section
    }

    /// Binds the object's maps through `registry`, patches map references and compiles.
    pub fn bind(self, registry: &Registry, opts: &LoadOptions) -> Result<LoadedProgram, LoadError> {
        self.bind_as(registry, opts, "")
    }

    /// [`bind`](Self::bind), naming the object's path `origin` (with the program) as the
    /// declarer in map conflicts: the registry's error then names both objects.
    pub fn bind_as(
        self,
        registry: &Registry,
        opts: &LoadOptions,
        origin: &str,
    ) -> Result<LoadedProgram, LoadError> {
        let Verified {
            obj,
            prog,
            stats,
            verify,
        } = self;
        // Bind maps: named maps are shared by name and identity (the registry compares every
        // property this program was verified against); global data is private.
        let owner = owner(origin, &prog.section, &prog.name);
        let mut maps = Vec::with_capacity(obj.maps.len());
        for m in &obj.maps {
            let map = if let Some(init) = &m.initial {
                let map = registry
                    .private(&spec_of(m, m.name.clone()), &owner)
                    .map_err(LoadError::Map)?;
                let _ = map.update(&0u32.to_le_bytes(), init, shared_maps::BPF_ANY);
                map
            } else {
                registry
                    .declare(&identity_of(m), &owner)
                    .map_err(LoadError::Map)?
            };
            maps.push(map);
        }

        // Patch map references into plain 64-bit immediates, noting which `lddw` loads which
        // array map (for the JIT's inline lookups).
        let mut insns = prog.insns.clone();
        let mut arrays: Vec<Option<InlineArray>> = vec![None; insns.len()];
        let mut pc = 0;
        while pc < insns.len() {
            if insns[pc].is_lddw() {
                let addr = match insns[pc].src {
                    op::PSEUDO_MAP_FD => {
                        let m = &maps[insns[pc].imm as usize];
                        arrays[pc] = m.array_layout().map(|l| InlineArray {
                            values: l.values as u64,
                            max_entries: l.max_entries,
                            stride: l.stride as u64,
                        });
                        Some(Arc::as_ptr(m) as u64)
                    }
                    op::PSEUDO_MAP_VALUE => {
                        let m = &maps[insns[pc].imm as usize];
                        // The verifier allows src 2 only into global data, a one-entry array.
                        let base = m.lookup_ptr(&0u32.to_le_bytes()).ok_or_else(|| {
                            LoadError::Jit(JitError::Unsupported {
                                pc,
                                what: format!(
                                    "direct value reference into map '{}'",
                                    m.spec().name
                                ),
                            })
                        })?;
                        Some(base as u64 + insns[pc + 1].imm as u32 as u64)
                    }
                    _ => None,
                };
                if let Some(a) = addr {
                    insns[pc].src = 0;
                    insns[pc].imm = a as u32 as i32;
                    insns[pc + 1].imm = (a >> 32) as u32 as i32;
                }
                pc += 2;
            } else {
                pc += 1;
            }
        }

        let t1 = Instant::now();
        let mut inlined_lookups = 0;
        let exec = match opts.tier {
            Tier::Jit => {
                // The inlined helper is `helpers::map_lookup_elem` (`by_id(MAP_LOOKUP)`), which
                // answers for an array map as `Map::array_layout` describes; the maps stay
                // alive with the program.
                const _: () = assert!(MAP_LOOKUP == HELPER_MAP_LOOKUP);
                let (code, n) = translate_with(
                    &insns,
                    &|id| helpers::by_id(id).map(|f| f as usize as u64),
                    &|pc| arrays.get(pc).copied().flatten(),
                )
                .map_err(LoadError::Jit)?;
                inlined_lookups = n;
                Some(ExecBuf::new(&code).map_err(LoadError::Exec)?)
            }
            Tier::Interpreter => None,
        };
        let compile = t1.elapsed();
        LIVE_PROGRAMS.fetch_add(1, Ordering::Relaxed);
        Ok(LoadedProgram {
            name: prog.name.clone(),
            section: prog.section.clone(),
            stats,
            times: LoadTimes { verify, compile },
            insns,
            maps,
            defs: obj.maps.clone(),
            exec,
            inlined_lookups,
            tag: 0,
            kind: CtxKind::of(&prog.section),
        })
    }
}

impl LoadedProgram {
    pub fn tier(&self) -> Tier {
        if self.exec.is_some() {
            Tier::Jit
        } else {
            Tier::Interpreter
        }
    }

    /// The maps the program uses, in the object's order.
    pub fn maps(&self) -> &[Arc<Map>] {
        &self.maps
    }

    /// The object's definitions of [`maps`](Self::maps), index for index: scope, epoch source
    /// and reduction of each (what the agreement needs to record, combine and fill them).
    pub fn map_defs(&self) -> &[policy_object::MapDef] {
        &self.defs
    }

    /// The patched instructions (map references as addresses).
    pub fn insns(&self) -> &[Insn] {
        &self.insns
    }

    /// How many `map_lookup_elem` calls the JIT computes inline (array maps known at the call
    /// site; 0 for the interpreter).
    pub fn inlined_lookups(&self) -> usize {
        self.inlined_lookups
    }

    /// Size of the JIT code in bytes (0 for the interpreter).
    pub fn code_len(&self) -> usize {
        self.exec.as_ref().map_or(0, |e| e.code_len())
    }

    /// Runs the program on `ctx`. A context of the wrong kind for the program's hook returns
    /// 0 without running (never undefined behaviour).
    #[inline]
    pub fn run<C: Context>(&self, ctx: &mut C) -> u64 {
        if self.kind != Some(C::KIND) {
            return 0;
        }
        let p = ctx.as_mut_ptr();
        match &self.exec {
            // SAFETY: the code was translated from this verified program, for this context
            // type (checked above), and `self.maps` keeps every map it references alive.
            Some(e) => unsafe { e.call(p) },
            None => interp::run(&self.insns, p, None).unwrap_or(0),
        }
    }

    /// Runs in the checking interpreter: every access must fall in the context, a live stack
    /// or a map value.
    pub fn run_checked<C: Context>(
        &self,
        ctx: &mut C,
        max_steps: u64,
    ) -> Result<u64, interp::Fault> {
        let mut regions =
            interp::Regions(vec![(ctx.as_mut_ptr() as usize, std::mem::size_of::<C>())]);
        for m in &self.maps {
            regions.0.extend(m.value_ranges());
        }
        interp::run(&self.insns, ctx.as_mut_ptr(), Some((&regions, max_steps)))
    }

    /// Runs in the interpreter regardless of the tier (for differential tests).
    pub fn run_interpreted<C: Context>(&self, ctx: &mut C) -> u64 {
        interp::run(&self.insns, ctx.as_mut_ptr(), None).unwrap_or(0)
    }
}

impl Drop for LoadedProgram {
    fn drop(&mut self) {
        LIVE_PROGRAMS.fetch_sub(1, Ordering::Relaxed);
    }
}
