//! Rejections: a typed reason with the numbers, rendered like the kernel verifier's log.

use std::fmt;

/// Why a program is rejected. Tests match on these; the text is for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reject {
    /// Dereference of a map lookup result that may be NULL.
    NullDeref { reg: u8 },
    /// Context access outside every field, or across padding.
    CtxOutOfBounds {
        reg: u8,
        off: i64,
        size: u32,
        ctx_size: u32,
    },
    /// Context access with an offset that is not a constant.
    CtxVariableOffset { reg: u8 },
    /// Write to a read-only context field.
    CtxReadOnly {
        reg: u8,
        field: &'static str,
        off: i64,
        size: u32,
    },
    /// Map value access outside `[0, value_size)`.
    MapOutOfBounds {
        reg: u8,
        map: String,
        min_off: i64,
        max_off: i64,
        size: u32,
        value_size: u32,
    },
    /// Write to a map programs may not write: `.rodata`, or an agreed or config map.
    MapReadOnly {
        reg: u8,
        map: String,
        scope: policy_object::Scope,
    },
    /// A tuner decision (a writable context field) that may depend on a rank-local value:
    /// `from` names it ("map 'net_bytes'"), `why` says why it may differ between ranks
    /// ("which is rank-local: ..."); `branch` is the conditional jump on it the write depends
    /// on, when the dependence is through control flow.
    RankLocal {
        reg: Option<u8>,
        field: &'static str,
        from: String,
        why: String,
        branch: Option<usize>,
    },
    /// Stack access outside `[-512, 0)`.
    StackOutOfBounds {
        reg: u8,
        min_off: i64,
        max_off: i64,
        size: u32,
    },
    /// Read of stack bytes never written.
    UninitStack { reg: u8, off: i64, size: u32 },
    /// Read of a register never written.
    UninitRegister { reg: u8 },
    /// Memory access through a register that is not a pointer, or not one that can be used so.
    InvalidMemAccess { reg: u8, ty: String },
    /// A memory access whose offset has no proven bound.
    UnboundedAccess { reg: u8 },
    /// Helper id that does not exist.
    UnknownHelper { id: i32 },
    /// Helper that exists but may not be called at this hook.
    HelperNotAllowed {
        id: i32,
        name: &'static str,
        hook: String,
        note: &'static str,
    },
    /// Helper argument of the wrong kind.
    BadHelperArg {
        reg: u8,
        helper: &'static str,
        expected: String,
        got: String,
    },
    /// A loop whose termination was not proven within the budget, or that repeats a state.
    /// `exceeded`: the limit of the budget ([`crate::budget`]) that ran out on a path through
    /// the loop (none: the same state came back).
    UnboundedLoop {
        head: usize,
        processed: usize,
        exceeded: Option<crate::budget::Exceeded>,
    },
    /// A limit of the verification budget ran out ([`crate::budget`]): the processed
    /// instructions outside any loop, the states held, their memory, the work, the time.
    TooComplex {
        exceeded: crate::budget::Exceeded,
        processed: usize,
    },
    /// Division or modulo by a register that may be zero (or by the constant 0).
    DivByZero { reg: Option<u8> },
    /// A pointer stored where it escapes (map value, context, other frame), or returned.
    PointerLeak { reg: u8, what: String },
    /// Arithmetic on a pointer that forbids it.
    PointerArithmetic { reg: u8, what: String },
    /// An instruction that is malformed or not supported.
    BadInsn { what: String },
    /// A store or atomic that would change part of a spilled pointer (the rest would then
    /// read as a number).
    CorruptSpill { off: i64, what: String },
    /// Subprogram boundaries broken: a fall-through into the next subprogram, a jump out of
    /// one.
    BadSubprog { what: String },
    /// A jump or call outside the program.
    JumpOutOfRange { target: i64 },
    /// A jump into the second half of a 64-bit immediate load.
    JumpIntoLddw { target: usize },
    /// The last instruction can fall through past the end.
    FallOffEnd,
    /// More instructions than allowed.
    TooLarge { insns: usize, limit: usize },
    /// Nested calls deeper than allowed.
    CallTooDeep { depth: usize },
    /// `lddw` of a map that does not exist.
    BadMapRef { index: i64 },
    /// The program's section names no hook.
    UnknownHook { section: String },
    /// The verifier itself failed (a bug, caught): the program is refused.
    Internal { what: String },
}

impl Reject {
    /// A stable short name of the kind (what tests and the corpus assert on).
    pub fn kind(&self) -> &'static str {
        match self {
            Reject::NullDeref { .. } => "null_deref",
            Reject::CtxOutOfBounds { .. } => "ctx_out_of_bounds",
            Reject::CtxVariableOffset { .. } => "ctx_variable_offset",
            Reject::CtxReadOnly { .. } => "ctx_read_only",
            Reject::MapOutOfBounds { .. } => "map_out_of_bounds",
            Reject::MapReadOnly { .. } => "map_read_only",
            Reject::RankLocal { .. } => "rank_local",
            Reject::StackOutOfBounds { .. } => "stack_out_of_bounds",
            Reject::UninitStack { .. } => "uninit_stack",
            Reject::UninitRegister { .. } => "uninit_register",
            Reject::InvalidMemAccess { .. } => "invalid_mem_access",
            Reject::UnboundedAccess { .. } => "unbounded_access",
            Reject::UnknownHelper { .. } => "unknown_helper",
            Reject::HelperNotAllowed { .. } => "helper_not_allowed",
            Reject::BadHelperArg { .. } => "bad_helper_arg",
            Reject::UnboundedLoop { .. } => "unbounded_loop",
            Reject::TooComplex { .. } => "too_complex",
            Reject::DivByZero { .. } => "div_by_zero",
            Reject::PointerLeak { .. } => "pointer_leak",
            Reject::PointerArithmetic { .. } => "pointer_arithmetic",
            Reject::BadInsn { .. } => "bad_insn",
            Reject::CorruptSpill { .. } => "corrupt_spill",
            Reject::BadSubprog { .. } => "bad_subprog",
            Reject::JumpOutOfRange { .. } => "jump_out_of_range",
            Reject::JumpIntoLddw { .. } => "jump_into_lddw",
            Reject::FallOffEnd => "fall_off_end",
            Reject::TooLarge { .. } => "too_large",
            Reject::CallTooDeep { .. } => "call_too_deep",
            Reject::BadMapRef { .. } => "bad_map_ref",
            Reject::UnknownHook { .. } => "unknown_hook",
            Reject::Internal { .. } => "internal_error",
        }
    }

    /// For `too_complex` (and `unbounded_loop` when the budget ran out in a loop), the limit of the budget that ran out ([`crate::budget::Exceeded`]'s
    /// name: processed, states, memory, work, time).
    pub fn limit(&self) -> Option<&'static str> {
        match self {
            Reject::TooComplex { exceeded, .. }
            | Reject::UnboundedLoop {
                exceeded: Some(exceeded),
                ..
            } => Some(exceeded.name()),
            _ => None,
        }
    }

    /// The register the reason is about, if any.
    pub fn reg(&self) -> Option<u8> {
        match self {
            Reject::NullDeref { reg }
            | Reject::CtxOutOfBounds { reg, .. }
            | Reject::CtxVariableOffset { reg }
            | Reject::CtxReadOnly { reg, .. }
            | Reject::MapOutOfBounds { reg, .. }
            | Reject::MapReadOnly { reg, .. }
            | Reject::StackOutOfBounds { reg, .. }
            | Reject::UninitStack { reg, .. }
            | Reject::UninitRegister { reg }
            | Reject::InvalidMemAccess { reg, .. }
            | Reject::UnboundedAccess { reg }
            | Reject::BadHelperArg { reg, .. }
            | Reject::PointerLeak { reg, .. }
            | Reject::PointerArithmetic { reg, .. } => Some(*reg),
            Reject::DivByZero { reg } | Reject::RankLocal { reg, .. } => *reg,
            _ => None,
        }
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::NullDeref { reg } => write!(
                f,
                "R{reg} invalid mem access 'map_value_or_null': check the result of bpf_map_lookup_elem for NULL before using it"
            ),
            Reject::CtxOutOfBounds {
                reg,
                off,
                size,
                ctx_size,
            } => write!(
                f,
                "R{reg} invalid context access off={off} size={size}: not one field of the {ctx_size}-byte context (accesses are naturally aligned and within one field; writes replace a whole field)"
            ),
            Reject::CtxVariableOffset { reg } => write!(
                f,
                "R{reg} variable context access: context fields must be read at constant offsets"
            ),
            Reject::CtxReadOnly {
                reg,
                field,
                off,
                size,
            } => {
                write!(
                    f,
                    "R{reg} write to read-only context field '{field}' (off={off} size={size})"
                )
            }
            Reject::MapOutOfBounds {
                reg,
                map,
                min_off,
                max_off,
                size,
                value_size,
            } => {
                if min_off == max_off {
                    write!(
                        f,
                        "R{reg} invalid access to map value of '{map}', value_size={value_size} off={min_off} size={size}"
                    )
                } else {
                    write!(
                        f,
                        "R{reg} invalid access to map value of '{map}', value_size={value_size} off={min_off}..{max_off} size={size}: bound the index first"
                    )
                }
            }
            Reject::MapReadOnly { reg, map, scope } => match scope {
                policy_object::Scope::Agreed => write!(
                    f,
                    "R{reg} write into agreed map '{map}': only the agreement between the ranks of a communicator fills it, so that every rank holds the same"
                ),
                policy_object::Scope::Config if !map.starts_with(".rodata") => write!(
                    f,
                    "R{reg} write into config map '{map}': configuration changes only through staged updates, which take effect at the same collective on every rank"
                ),
                _ => write!(f, "R{reg} write into read-only map '{map}'"),
            },
            Reject::RankLocal {
                reg,
                field,
                from,
                why,
                branch,
            } => {
                let why = format!("{from}, {why}");
                match (branch, reg) {
                    (Some(b), _) => write!(
                        f,
                        "the write to '{field}' depends on the branch at insn {b} on a value of {why}"
                    ),
                    (None, Some(r)) => {
                        write!(f, "R{r} writes '{field}' from a value of {why}")
                    }
                    (None, None) => write!(f, "the write to '{field}' depends on {why}"),
                }
            }
            Reject::StackOutOfBounds {
                reg,
                min_off,
                max_off,
                size,
            } => {
                write!(
                    f,
                    "R{reg} invalid stack access off={min_off}..{max_off} size={size}: the stack is fp-512 .. fp-1"
                )
            }
            Reject::UninitStack { reg, off, size } => write!(
                f,
                "invalid read from stack R{reg} off {off} size {size}: bytes never written"
            ),
            Reject::UninitRegister { reg } => {
                write!(f, "R{reg} !read_ok: register read before it was written")?;
                if *reg == 0 {
                    // The one register a subprogram's exit can leave unreadable.
                    write!(
                        f,
                        " (after a call, r0 is unreadable when the subprogram left a pointer \
                         into its own stack there: that stack is gone once it returns)"
                    )?;
                }
                Ok(())
            }
            Reject::InvalidMemAccess { reg, ty } => write!(f, "R{reg} invalid mem access '{ty}'"),
            Reject::UnboundedAccess { reg } => {
                write!(
                    f,
                    "R{reg} unbounded memory access, make sure to bounds check any such access"
                )
            }
            Reject::UnknownHelper { id } => write!(f, "unknown helper function #{id}"),
            Reject::HelperNotAllowed {
                id,
                name,
                hook,
                note,
            } => {
                write!(f, "helper {name}#{id} is not allowed in '{hook}' programs")?;
                if !note.is_empty() {
                    write!(f, " ({note})")?;
                }
                Ok(())
            }
            Reject::BadHelperArg {
                reg,
                helper,
                expected,
                got,
            } => {
                write!(
                    f,
                    "R{reg} type={got} expected={expected} (argument of {helper})"
                )
            }
            Reject::UnboundedLoop {
                head,
                processed,
                exceeded: None | Some(crate::budget::Exceeded::Processed { .. }),
            } => write!(
                f,
                "loop at insn {head} is not provably bounded (infinite loop or no proof within {processed} processed instructions)"
            ),
            Reject::UnboundedLoop {
                head,
                processed,
                exceeded: Some(exceeded),
            } => write!(
                f,
                "loop at insn {head} is not provably bounded (infinite loop, or no proof within the budget: {exceeded}; limit '{}', after {processed} processed instructions)",
                exceeded.name()
            ),
            Reject::TooComplex {
                exceeded,
                processed,
            } => write!(
                f,
                "BPF program is too complex: {exceeded} (limit '{}', after {processed} processed insns): \
                 fewer branches whose outcomes the verifier must follow apart (values that \
                 differ on each path, loops with many iterations), or the work split into \
                 more programs or smaller subprograms, bring it within the budget",
                exceeded.name()
            ),
            Reject::DivByZero { reg: Some(r) } => {
                write!(
                    f,
                    "division or modulo by R{r}, which may be zero: test it against 0 first"
                )
            }
            Reject::DivByZero { reg: None } => write!(f, "division or modulo by the constant 0"),
            Reject::PointerLeak { reg, what } => write!(f, "R{reg} leaks a pointer: {what}"),
            Reject::PointerArithmetic { reg, what } => {
                write!(f, "R{reg} pointer arithmetic prohibited: {what}")
            }
            Reject::BadInsn { what } => write!(f, "invalid instruction: {what}"),
            Reject::CorruptSpill { off, what } => write!(
                f,
                "attempt to corrupt spilled pointer on stack at fp{off}: {what}"
            ),
            Reject::BadSubprog { what } => write!(f, "{what}"),
            Reject::JumpOutOfRange { target } => write!(f, "jump out of range to insn {target}"),
            Reject::JumpIntoLddw { target } => {
                write!(f, "jump into the middle of ldimm64 insn {target}")
            }
            Reject::FallOffEnd => write!(
                f,
                "the program can fall off its last instruction: end every path with exit"
            ),
            Reject::TooLarge { insns, limit } => write!(
                f,
                "program has {insns} instructions, over the limit of {limit}"
            ),
            Reject::CallTooDeep { depth } => write!(f, "call stack deeper than {depth} frames"),
            Reject::BadMapRef { index } => write!(
                f,
                "reference to map #{index}, which the object does not define"
            ),
            Reject::UnknownHook { section } => {
                let hooks: Vec<&str> = crate::platform::HOOKS.iter().map(|h| h.section).collect();
                write!(
                    f,
                    "section '{section}' names no hook ({})",
                    hooks.join(", ")
                )
            }
            Reject::Internal { what } => write!(
                f,
                "internal verifier error ({what}): the program is refused; please report it"
            ),
        }
    }
}

/// A rejection at an instruction, with what an author needs to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    pub insn: usize,
    pub reject: Reject,
    /// The instruction in the kernel's notation.
    pub disasm: String,
    /// Register state before the instruction (only initialized registers).
    pub state: String,
    /// `file:line: text` when the object has line info.
    pub source: Option<String>,
    /// Branches taken on the failing path, oldest first: `(from, to)`.
    pub path: Vec<(usize, usize)>,
    pub processed: usize,
}

impl VerifyError {
    pub fn kind(&self) -> &'static str {
        self.reject.kind()
    }
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "insn {}: {}: {}", self.insn, self.disasm, self.reject)?;
        if let Some(s) = &self.source {
            write!(f, "\n  at {s}")?;
        }
        if !self.state.is_empty() {
            write!(f, "\n  state: {}", self.state)?;
        }
        if !self.path.is_empty() {
            let p: Vec<String> = self.path.iter().map(|(a, b)| format!("{a}->{b}")).collect();
            write!(f, "\n  path: {}", p.join(" "))?;
        }
        write!(f, "\n  processed {} insns", self.processed)
    }
}

impl std::error::Error for VerifyError {}
