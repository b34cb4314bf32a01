//! ncclbpf as a PREVAIL platform: one program type per hook, our five helpers, our three map
//! kinds. Written from `policies/include/ncclbpf.h` (the contract policies are compiled
//! against), not derived from `policy_verifier::platform`, so that a mistake in our tables
//! shows up as a difference instead of being copied into the oracle.

use policy_object::{MapDef, MapKind, Program};
use prevail::crab::ebpf_domain::DomainContext;
use prevail::crab::var_registry::VariableRegistry;
use prevail::elf_loader::UnmarshalError;
use prevail::fwd_analyzer;
use prevail::ir::program::Program as PrevailProgram;
use prevail::ir::unmarshal;
use prevail::linux::linux_platform::conformance_groups;
use prevail::linux::spec_prototypes::HelperPrototype;
use prevail::platform::EbpfPlatform;
use prevail::spec::config::{EbpfRuntimeConfig, EbpfVerifierOptions, VerbosityOptions};
use prevail::spec::ebpf_base::{EbpfArgumentType as A, EbpfCtxDescriptor, EbpfReturnType};
use prevail::spec::type_descriptors::{
    EbpfMapDescriptor, EbpfMapType, EbpfMapValueType, EbpfProgramType, ProgramInfo,
};
use prevail::spec::vm_isa::EbpfInst;

/// `sizeof(struct ncclbpf_net_ctx)`: 56 bytes, trailing `reserved` word included. No packet
/// pointers in any context (data/end/meta = -1).
pub const CTX_SIZE: i32 = 56;
/// `sizeof(struct ncclbpf_tuner_ctx)`: 64 bytes (the cost-table fields end it).
static TUNER_CTX: EbpfCtxDescriptor = ctx(64);
const fn ctx(size: i32) -> EbpfCtxDescriptor {
    EbpfCtxDescriptor {
        size,
        data: -1,
        end: -1,
        meta: -1,
    }
}
static CTX: EbpfCtxDescriptor = ctx(CTX_SIZE);
/// `sizeof(struct ncclbpf_tuner_chunk_ctx)`: 48 bytes.
static CHUNK_CTX: EbpfCtxDescriptor = ctx(48);
/// `sizeof(struct ncclbpf_tuner_init_ctx)`: a 32-byte header and NCCL's 1152 bytes of constants.
static INIT_CTX: EbpfCtxDescriptor = ctx(32 + 1152);
/// `sizeof(struct ncclbpf_tuner_epoch_ctx)`: a 48-byte header, `state[32]` and the two net
/// busy times.
static EPOCH_CTX: EbpfCtxDescriptor = ctx(48 + 32 * 8 + 16);
/// `sizeof(struct ncclbpf_profiler_ctx)`: 104 bytes.
static PROFILER_CTX: EbpfCtxDescriptor = ctx(104);

/// The hooks ncclbpf.h names, with the helpers each may call (tuner hooks: map helpers only;
/// net hooks: also clocks and CPU ids) and their context.
pub const SECTIONS: &[(&str, &[i32], &EbpfCtxDescriptor)] = &[
    ("tuner", &[1, 2, 3], &TUNER_CTX),
    ("tuner/chunk", &[1, 2, 3], &CHUNK_CTX),
    ("tuner/init", &[1, 2, 3], &INIT_CTX),
    ("tuner/epoch", &[1, 2, 3], &EPOCH_CTX),
    ("net/connect", NET_HELPERS, &CTX),
    ("net/accept", NET_HELPERS, &CTX),
    ("net/isend", NET_HELPERS, &CTX),
    ("net/irecv", NET_HELPERS, &CTX),
    ("net/complete", NET_HELPERS, &CTX),
    ("net/close", NET_HELPERS, &CTX),
    ("profiler/coll", NET_HELPERS, &PROFILER_CTX),
    ("profiler/p2p", NET_HELPERS, &PROFILER_CTX),
    ("profiler/proxy_op", NET_HELPERS, &PROFILER_CTX),
    ("profiler/proxy_step", NET_HELPERS, &PROFILER_CTX),
    ("profiler/kernel_ch", NET_HELPERS, &PROFILER_CTX),
    ("profiler/net", NET_HELPERS, &PROFILER_CTX),
];
const NET_HELPERS: &[i32] = &[1, 2, 3, 5, 8];

const fn proto(name: &'static str, ret: EbpfReturnType, args: [A; 5]) -> HelperPrototype {
    HelperPrototype {
        name,
        return_type: ret,
        argument_type: args,
        reallocate_packet: false,
        ctx_descriptor: None,
        unsupported: false,
        might_sleep: false,
        zero_args_mask: 0,
        allowed_map_types: 0,
    }
}

const DC: A = A::DontCare;

/// The prototypes of ncclbpf.h's helpers, in PREVAIL's argument vocabulary (the same as
/// the kernel's for these five).
static HELPERS: [(i32, HelperPrototype); 5] = [
    (
        1,
        proto(
            "bpf_map_lookup_elem",
            EbpfReturnType::PtrToMapValueOrNull,
            [A::PtrToMap, A::PtrToMapKey, DC, DC, DC],
        ),
    ),
    (
        2,
        proto(
            "bpf_map_update_elem",
            EbpfReturnType::Integer,
            [
                A::PtrToMap,
                A::PtrToMapKey,
                A::PtrToMapValue,
                A::Anything,
                DC,
            ],
        ),
    ),
    (
        3,
        proto(
            "bpf_map_delete_elem",
            EbpfReturnType::Integer,
            [A::PtrToMap, A::PtrToMapKey, DC, DC, DC],
        ),
    ),
    (
        5,
        proto("bpf_ktime_get_ns", EbpfReturnType::Integer, [DC; 5]),
    ),
    (
        8,
        proto("bpf_get_smp_processor_id", EbpfReturnType::Integer, [DC; 5]),
    ),
];

/// Kernel numbering, as ncclbpf.h defines it.
fn map_type_number(k: MapKind) -> u32 {
    match k {
        MapKind::Hash => 1,
        MapKind::Array => 2,
        MapKind::PercpuArray => 6,
    }
}

/// One program's platform: its hook's helpers and its object's maps (fd = index in
/// `Object::maps`, which is what our loader puts in `lddw` immediates).
pub struct NcclPlatform {
    section: String,
    helpers: &'static [i32],
    ctx: &'static EbpfCtxDescriptor,
    maps: Vec<EbpfMapDescriptor>,
}

impl NcclPlatform {
    pub fn new(section: &str, maps: &[MapDef]) -> Option<NcclPlatform> {
        let &(_, helpers, ctx) = SECTIONS.iter().find(|(s, _, _)| *s == section)?;
        Some(NcclPlatform {
            section: section.to_string(),
            helpers,
            ctx,
            maps: maps
                .iter()
                .enumerate()
                .map(|(i, m)| EbpfMapDescriptor {
                    original_fd: i as i32,
                    map_type: map_type_number(m.kind),
                    key_size: m.key_size,
                    value_size: m.value_size,
                    max_entries: m.max_entries,
                    inner_map_fd: -1,
                    name: m.name.clone(),
                    is_inner_map_template: false,
                })
                .collect(),
        })
    }

    fn program_type(&self) -> EbpfProgramType {
        EbpfProgramType {
            name: self.section.clone(),
            ctx_descriptor: Some(self.ctx),
            platform_specific_data: 0,
            section_prefixes: vec![self.section.clone()],
            // Unprivileged: pointers may not leak into maps, helper scalars or r0, and
            // pointers may not be compared with numbers.
            is_privileged: false,
            is_sleepable: false,
        }
    }
}

impl EbpfPlatform for NcclPlatform {
    fn get_program_type(&self, _section: &str, _path: &str) -> EbpfProgramType {
        self.program_type()
    }
    fn get_helper_prototype(&self, n: i32) -> &HelperPrototype {
        self.try_get_helper_prototype(n)
            .unwrap_or_else(|| panic!("no helper #{n}"))
    }
    fn try_get_helper_prototype(&self, n: i32) -> Option<&HelperPrototype> {
        HELPERS.iter().find(|(id, _)| *id == n).map(|(_, p)| p)
    }
    fn is_helper_usable(&self, n: i32) -> bool {
        self.helpers.contains(&n)
    }
    fn map_record_size(&self) -> usize {
        0
    }
    fn parse_maps_section(
        &mut self,
        _: &mut Vec<EbpfMapDescriptor>,
        _: &[u8],
        _: usize,
        _: usize,
        _: &EbpfVerifierOptions,
    ) {
        unreachable!("maps come from policy_object, not from prevail's ELF loader")
    }
    fn resolve_inner_map_references(
        &self,
        _: &mut Vec<EbpfMapDescriptor>,
    ) -> Result<(), UnmarshalError> {
        Ok(())
    }
    fn get_map_descriptor(&self, fd: i32) -> Option<&EbpfMapDescriptor> {
        self.maps.iter().find(|m| m.original_fd == fd)
    }
    fn get_map_type(&self, t: u32) -> EbpfMapType {
        let (name, is_array) = match t {
            1 => ("hash", false),
            2 => ("array", true),
            6 => ("percpu_array", true),
            _ => ("unspec", false),
        };
        EbpfMapType {
            platform_specific_type: t,
            name: name.into(),
            is_array,
            value_type: EbpfMapValueType::Any,
        }
    }
    fn supported_conformance_groups(&self) -> u32 {
        // No packet access, no indirect calls.
        conformance_groups::DEFAULT_GROUPS
    }
}

/// How PREVAIL is run: as close to our rules as its options go.
pub fn options() -> EbpfVerifierOptions {
    EbpfVerifierOptions {
        runtime: EbpfRuntimeConfig {
            // The extra checks of `strict` (singleton array-map keys) are not ours.
            strict: false,
            // We reject divisors that may be zero.
            allow_division_by_zero: false,
            setup_constraints: true,
            big_endian: false,
            // We reject loops we cannot bound.
            check_for_termination: true,
            subprogram_stack_size: 512,
            max_call_stack_frames: 8,
            max_packet_size: EbpfRuntimeConfig::DEFAULT_MAX_PACKET_SIZE,
        },
        verbosity_opts: VerbosityOptions::default(),
        must_have_exit: true,
        mock_map_fds: true,
    }
}

/// PREVAIL's answer for one program.
#[derive(Clone, Debug)]
pub struct Verdict {
    pub accepted: bool,
    /// Every error PREVAIL recorded (it goes on past a failed check, assuming it held), with
    /// the instruction it is at when known.
    pub errors: Vec<(Option<usize>, String)>,
    /// Unmarshal notes (e.g. a division by the constant 0), which do not fail a program.
    pub notes: String,
}

impl Verdict {
    pub fn reject(message: String, insn: Option<usize>) -> Verdict {
        Verdict {
            accepted: false,
            errors: vec![(insn, message)],
            notes: String::new(),
        }
    }
}

fn encode(prog: &Program) -> Vec<EbpfInst> {
    prog.insns
        .iter()
        .map(|i| EbpfInst {
            opcode: i.code,
            dst_src: (i.dst & 0x0f) | (i.src << 4),
            offset: i.off,
            imm: i.imm,
        })
        .collect()
}

/// Runs PREVAIL on `prog` (instructions exactly as our loader produced them) with `maps`.
pub fn verify(prog: &Program, maps: &[MapDef]) -> Verdict {
    let Some(platform) = NcclPlatform::new(&prog.section, maps) else {
        return Verdict::reject(format!("unknown hook '{}'", prog.section), None);
    };
    let opts = options();
    let mut info = ProgramInfo {
        map_descriptors: platform.maps.clone(),
        program_type: platform.program_type(),
        supported_conformance_groups: platform.supported_conformance_groups(),
        ..ProgramInfo::default()
    };
    let insts = encode(prog);
    // PREVAIL may panic on inputs it does not expect: that is a rejection too, reported.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut notes = vec![];
        let seq = match unmarshal::unmarshal(&insts, &mut notes, &info, &platform, &opts) {
            Ok(s) => s,
            Err(e) => {
                let pc = match &e {
                    unmarshal::UnmarshalError::InvalidInstruction { pc, .. } => Some(*pc),
                    _ => None,
                };
                return Verdict::reject(format!("unmarshal: {e}"), pc);
            }
        };
        let notes: Vec<String> = notes.into_iter().flatten().collect();
        let program = match PrevailProgram::from_sequence(&seq, &mut info, &platform, &opts) {
            Ok(p) => p,
            Err(e) => return Verdict::reject(format!("cfg: {}", e.message), None),
        };
        let ctx = DomainContext {
            program_info: &info,
            program: &program,
            runtime: &opts.runtime,
            options: &opts,
            platform: &platform,
        };
        let mut registry = VariableRegistry::new();
        let result = fwd_analyzer::analyze(&program, &ctx, &mut registry);
        if result.failed {
            let mut errors: Vec<(Option<usize>, String)> = result
                .invariants
                .values()
                .filter(|p| !p.pre.is_bottom())
                .filter_map(|p| p.error.as_ref())
                .map(|e| {
                    let insn = e.label.as_ref().and_then(|l| usize::try_from(l.from).ok());
                    (insn, e.to_string())
                })
                .collect();
            if errors.is_empty() {
                errors.push((None, "failed (no error recorded)".into()));
            }
            Verdict {
                accepted: false,
                errors,
                notes: notes.join("; "),
            }
        } else {
            Verdict {
                accepted: true,
                errors: vec![],
                notes: notes.join("; "),
            }
        }
    }));
    run.unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Verdict::reject(format!("prevail panicked: {what}"), None)
    })
}
