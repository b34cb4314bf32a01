//! The x86-64 JIT, in three layers: [`x86`] encodes x86 instructions, [`compile`] translates
//! BPF to them, [`exec`] owns the executable memory.

pub mod compile;
pub mod exec;
pub mod x86;
