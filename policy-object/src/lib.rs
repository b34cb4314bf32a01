//! Policy objects, without any OS: what a `clang -target bpf` object holds and nothing more.
//!
//! * [`insn`]: the BPF instruction set, its decoding and a kernel-style disassembler, and
//!   [`insn::build`], constructors for single instructions (for tests and generators);
//! * [`asm`]: an assembler for the bpf_conformance text dialect, for tests;
//! * [`btf`]: the BTF subset needed for `.maps` definitions and `.BTF.ext` line info;
//! * [`epoch`]: epoch sources, agreed maps filled from them and the state map
//!   (`ncclbpf_source`, `ncclbpf_reduce`), checked at parse;
//! * [`elf`]: [`Object::parse`], which finds programs by section, maps (BTF `.maps`,
//!   `.rodata`/`.data`/`.bss`), applies map relocations (`lddw` with src 1 and 2) and links
//!   BPF-to-BPF calls into each program.
//!
//! A malformed, truncated or hostile object is an [`ObjectError`], never a panic.

#![forbid(unsafe_code)]

pub mod asm;
pub mod btf;
pub mod elf;
pub mod epoch;
pub mod insn;

pub use elf::{LineInfo, MapDef, MapKind, Object, ObjectError, Program, Scope};
pub use epoch::{Reduce, SOURCE_STATE};
pub use insn::Insn;
