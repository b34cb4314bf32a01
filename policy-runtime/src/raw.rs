//! Running raw instruction sequences, without the verifier: for conformance vectors and
//! engine tests. Both engines take exactly the programs [`check`] accepts (valid RFC 9669
//! encodings, r10 never written, control flow that stays inside each function, no helpers:
//! see [`crate::jit::compile::check_program`]); they start with r1 = `mem.as_ptr()`,
//! r2 = `mem.len()`, and every other register 0.

use crate::interp::{self, Checked, Fault, Regions};
use crate::jit::compile::{JitError, check_program, translate};
use crate::jit::exec::ExecBuf;
use policy_object::insn::Insn;
use std::fmt;

/// Instructions a raw interpreter run may execute before it is [`Fault::TooManySteps`].
pub const MAX_STEPS: u64 = 1 << 24;

/// Why a raw JIT run did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawError {
    /// The program is not one the JIT translates (see [`check`]).
    Compile(JitError),
    /// The code could not be made executable, or this host is not x86-64.
    Exec(String),
}

impl fmt::Display for RawError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawError::Compile(e) => write!(f, "{e}"),
            RawError::Exec(e) => write!(f, "cannot run JIT code: {e}"),
        }
    }
}

impl std::error::Error for RawError {}

/// Whether both engines take `insns`, and if not, why (the same check `run_jit` makes).
pub fn check(insns: &[Insn]) -> Result<(), RawError> {
    check_program(insns, &|_| None)
        .map(|_| ())
        .map_err(RawError::Compile)
}

/// Runs insns in the interpreter with memory checking (only `mem` and the stack),
/// r1 = mem.as_ptr(), r2 = mem.len(); no verification. Never panics; bad
/// instructions/accesses are Faults.
///
/// A program [`check`] rejects is [`Fault::BadInsn`] at the first offending instruction;
/// reads of stack bytes never written are [`Fault::UninitStackRead`]; more than
/// [`MAX_STEPS`] instructions are [`Fault::TooManySteps`]. Host addresses may flow anywhere
/// (the escape check is off).
pub fn run_interpreter(insns: &[Insn], mem: &mut [u8]) -> Result<u64, Fault> {
    if let Err(e) = check_program(insns, &|_| None) {
        let pc = match e {
            JitError::Unsupported { pc, .. }
            | JitError::UnknownHelper { pc, .. }
            | JitError::Invalid { pc, .. } => pc,
        };
        return Err(Fault::BadInsn { pc });
    }
    let regions = Regions(vec![(mem.as_mut_ptr() as usize, mem.len())]);
    let checked = Checked {
        pointer_escape: false,
        ..Checked::new(&regions, MAX_STEPS)
    };
    interp::run_with(
        insns,
        mem.as_mut_ptr() as u64,
        mem.len() as u64,
        Some(&checked),
        &|_| None,
    )
}

/// Compiles insns without verification and runs them with r1 = mem, r2 = len. Unsafe:
/// unverified code runs natively.
///
/// # Safety
/// The program must only access `mem` (within its length) and its own stack, and must
/// terminate: nothing checks either.
pub unsafe fn run_jit(insns: &[Insn], mem: &mut [u8]) -> Result<u64, RawError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(RawError::Exec("the JIT emits x86-64 code".into()));
    }
    let code = translate(insns, &|_| None).map_err(RawError::Compile)?;
    let exec = ExecBuf::new(&code).map_err(|e| RawError::Exec(e.to_string()))?;
    // SAFETY: the code was translated for no helpers and touches only what the program
    // touches; the caller guarantees that is `mem` and the stack, and that it terminates.
    Ok(unsafe { exec.call_with(mem.as_mut_ptr() as u64, mem.len() as u64) })
}
