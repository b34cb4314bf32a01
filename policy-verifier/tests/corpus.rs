//! The unsafe corpus: every program in policies/unsafe must be rejected with the kind its
//! header names, at the instruction recorded here, and the message must point at the C line
//! marked `/* REJECT */`.

use policy_object::Object;
use policy_verifier::{Limits, map_infos, verify};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// (program, expected kind, expected instruction) for clang 14 -O2 -mcpu=v3.
const EXPECTED: &[(&str, &str, usize)] = &[
    ("atomic_misaligned", "bad_insn", 9),
    ("atomic_on_ctx", "invalid_mem_access", 1), // R1 invalid mem access 'ctx (atomics work on map values and the stack)'
    ("ctx_oob", "ctx_out_of_bounds", 0), // R1 invalid context access off=1600 size=8: not a field of the 56-byte context
    ("ctx_padding", "ctx_out_of_bounds", 0), // R1 invalid context access off=52 size=4: not a field of the 56-byte context
    ("ctx_var_offset", "ctx_variable_offset", 5), // R1 variable context access: context fields must be read at constant offsets
    ("ctx_write_ro", "ctx_read_only", 1), // R1 write to read-only context field 'msg_size' (off=0 size=8)
    ("ctx_write_ro_net", "ctx_read_only", 1), // R1 write to read-only context field 'status' (off=48 size=4)
    ("div_by_zero", "div_by_zero", 2), // division or modulo by R1, which may be zero: test it against 0 first
    ("div_by_zero_imm", "div_by_zero", 1), // division or modulo by the constant 0
    ("helper_ctx_as_map", "bad_helper_arg", 4), // R1 type=ctx expected=map_ptr (argument of bpf_map_lookup_elem)
    ("helper_not_allowed", "helper_not_allowed", 1), // helper bpf_ktime_get_ns#5 is not allowed in 'tuner' programs (tuner decisions must be identical on every rank, so clocks and CPU ids are not available)
    ("helper_not_allowed_cpu", "helper_not_allowed", 1), // helper bpf_get_smp_processor_id#8 is not allowed in 'tuner' programs (tuner decisions must be identical on every rank, so clocks and CPU ids are not available)
    ("helper_null_key", "null_deref", 10), // R2 invalid mem access 'map_value_or_null': check the result of bpf_map_lookup_elem for NULL before using it
    ("helper_scalar_key", "bad_helper_arg", 3), // R2 type=scalar expected=fp or map_value (argument of bpf_map_lookup_elem)
    ("helper_short_value", "uninit_stack", 11), // invalid read from stack R3 off -16 size 16: bytes never written
    ("helper_unknown", "unknown_helper", 0),    // unknown helper function #9999
    ("jump_into_lddw", "jump_into_lddw", 1),    // jump into the middle of ldimm64 insn 2
    ("jump_out_of_range", "jump_out_of_range", 0), // jump out of range to insn 101
    ("loop_counter_unbounded", "unbounded_loop", 6), // loop at insn 6 is not provably bounded (infinite loop or no proof within 1000001 processed instructions)
    ("loop_infinite", "unbounded_loop", 1), // loop at insn 1 is not provably bounded (infinite loop or no proof within 5 processed instructions)
    ("loop_unbounded", "unbounded_loop", 1), // loop at insn 1 is not provably bounded (infinite loop or no proof within 1000001 processed instructions)
    ("map_oob_const", "map_out_of_bounds", 8), // R0 invalid access to map value of 'arr', value_size=8 off=16 size=8
    ("map_oob_negative", "map_out_of_bounds", 8), // R0 invalid access to map value of 'arr', value_size=8 off=-1 size=1
    ("map_oob_unbounded", "unbounded_access", 11), // R1 unbounded memory access, make sure to bounds check any such access
    ("map_oob_var", "map_out_of_bounds", 13), // R0 invalid access to map value of 'arr', value_size=32 off=0..56 size=8: bound the index first
    ("map_read_only", "map_read_only", 3),    // R2 write into read-only map '.rodata'
    ("mod_by_zero", "div_by_zero", 3), // division or modulo by R2, which may be zero: test it against 0 first
    ("null_deref", "null_deref", 7), // R0 invalid mem access 'map_value_or_null': check the result of bpf_map_lookup_elem for NULL before using it
    ("null_deref_wrong_branch", "null_deref", 11), // R1 invalid mem access 'map_value_or_null': check the result of bpf_map_lookup_elem for NULL before using it
    ("pointer_arith_32", "pointer_arithmetic", 0), // R1 pointer arithmetic prohibited: 32-bit arithmetic on a pointer
    ("pointer_arith_mul", "pointer_arithmetic", 0), // R1 pointer arithmetic prohibited: * on ctx
    ("pointer_arith_null", "pointer_arithmetic", 7), // R0 pointer arithmetic prohibited: on map_value_or_null: null-check it first
    ("pointer_compare", "pointer_arithmetic", 1), // R1 pointer arithmetic prohibited: comparison of ctx with scalar
    ("pointer_leak_ctx", "pointer_leak", 0), // R1 leaks a pointer: pointer stored into the context
    ("pointer_leak_map", "pointer_leak", 9), // R0 leaks a pointer: pointer stored into map 'arr' (maps are shared with other processes)
    ("pointer_leak_partial", "pointer_leak", 1), // R10 leaks a pointer: partial read of a spilled pointer
    ("pointer_leak_return", "pointer_leak", 1),  // R0 leaks a pointer: returning ctx
    ("scalar_deref", "invalid_mem_access", 1),   // R1 invalid mem access 'scalar'
    ("stack_oob_deep", "stack_out_of_bounds", 1), // R10 invalid stack access off=-520..-520 size=8: the stack is fp-512 .. fp-1
    ("stack_oob_read", "stack_out_of_bounds", 7), // R2 invalid stack access off=-16..1007 size=1: the stack is fp-512 .. fp-1
    ("stack_oob_write", "stack_out_of_bounds", 1), // R10 invalid stack access off=8..8 size=8: the stack is fp-512 .. fp-1
    ("too_large", "too_large", 0), // program has 5002 instructions, over the limit of 4096
    ("uninit_key", "uninit_stack", 6), // invalid read from stack R2 off -8 size 8: bytes never written
    ("uninit_r0_exit", "uninit_register", 0), // R0 !read_ok: register read before it was written
    ("uninit_register", "uninit_register", 0), // R3 !read_ok: register read before it was written
    ("uninit_stack", "uninit_stack", 0), // invalid read from stack R10 off -8 size 8: bytes never written
];

#[test]
fn every_unsafe_program_is_rejected_precisely() {
    let dir = root().join("policies/unsafe");
    let mut seen = vec![];
    let mut failures = vec![];
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    files.sort();
    for c in files {
        let name = c.file_stem().unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(&c).unwrap();
        let kind = src
            .lines()
            .find_map(|l| l.strip_prefix("// expect: "))
            .unwrap_or_else(|| panic!("{name}: no '// expect:' header"))
            .trim()
            .to_string();
        let marker = src
            .lines()
            .position(|l| l.contains("/* REJECT */"))
            .map(|i| i + 1);
        let obj = root().join(format!("target/policies/unsafe/{name}.o"));
        let bytes = std::fs::read(&obj)
            .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", obj.display()));
        let o = Object::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let maps = map_infos(&o.maps);
        let p = &o.programs[0];
        match verify(p, &maps, Limits::default()) {
            Ok(_) => failures.push(format!("{name}: accepted, expected {kind}")),
            Err(e) => {
                println!(
                    "(\"{name}\", \"{}\", {}),  // {}",
                    e.kind(),
                    e.insn,
                    e.reject
                );
                if e.kind() != kind {
                    failures.push(format!(
                        "{name}: rejected as {} ({e}), expected {kind}",
                        e.kind()
                    ));
                }
                if let Some(&(_, _, insn)) = EXPECTED.iter().find(|(n, _, _)| *n == name)
                    && insn != e.insn
                {
                    failures.push(format!(
                        "{name}: rejected at insn {}, expected {insn}",
                        e.insn
                    ));
                }
                if let (Some(line), Some(s)) = (marker, &e.source)
                    && !s.contains(&format!(":{line}:"))
                {
                    failures.push(format!(
                        "{name}: message points at '{s}', expected line {line}"
                    ));
                }
                seen.push(name);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(seen.len() >= 30, "only {} unsafe programs", seen.len());
}
