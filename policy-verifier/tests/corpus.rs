//! The unsafe corpus: every program in policies/unsafe must be rejected with the kind its
//! header names, at the instruction recorded here, and the message must point at the C line
//! marked `/* REJECT */`.

use policy_object::Object;
use policy_verifier::{Limits, map_infos, verify};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// (program, expected kind, expected instruction) for clang 14 -O2 -mcpu=v3 (clang-19 -mcpu=v4
/// for the programs whose header says `// requires: v4`). The instruction is the one that
/// performs the bad access, store, call or jump; for a loop, its head; for a subprogram that
/// runs past its end, its last instruction.
const EXPECTED: &[(&str, &str, usize)] = &[
    ("agreed_write_net", "map_read_only", 10), // a net hook stores into an agreed map
    ("atomic_misaligned", "bad_insn", 9),
    ("atomic_misaligned_stack", "bad_insn", 3), // lock *(u32 *)(r10 -6) += w2: 4-byte atomic at a 2-aligned offset
    ("atomic_on_ctx", "invalid_mem_access", 1), // R1 invalid mem access 'ctx (atomics work on map values and the stack)'
    ("atomic_stack_add32_ptr", "corrupt_spill", 2), // lock add *(u32 *)(r10 -16) over a spilled ctx
    ("atomic_stack_add_ptr", "corrupt_spill", 2), // lock add *(u64 *)(r10 -8) over a spilled ctx
    ("atomic_stack_and32_ptr", "corrupt_spill", 2), // lock and *(u32 *)(r10 -8) over a spilled ctx
    ("atomic_stack_cmpxchg_ptr", "corrupt_spill", 3), // cmpxchg_64 over a spilled ctx
    ("atomic_stack_const_add_oob", "map_out_of_bounds", 16), // *(u8 *)(r0 +0), r0 = value + [1, 255]
    ("atomic_stack_const_cmpxchg_oob", "map_out_of_bounds", 18), // *(u64 *)(r6 +0), r6 = value + [1, 255]
    (
        "atomic_stack_const_fetch_add32_oob",
        "stack_out_of_bounds",
        11,
    ), // *(u8 *)(r2 +0), r2 = fp-16 + [1, 255]
    ("atomic_stack_const_or_oob", "stack_out_of_bounds", 10), // *(u8 *)(r2 +0), r2 = fp-64 + [1, 255]
    ("atomic_stack_const_xchg_oob", "map_out_of_bounds", 16), // *(u64 *)(r0 +0), r0 = value + [1, 255]
    ("atomic_stack_fetch_add_ptr", "corrupt_spill", 2),       // atomic_fetch_add over a spilled ctx
    ("atomic_stack_or_ptr", "corrupt_spill", 2), // lock or *(u64 *)(r10 -24) over a spilled ctx
    ("atomic_stack_uninit", "uninit_stack", 1),  // lock add on a slot never written
    ("atomic_stack_xchg32_ptr", "corrupt_spill", 2), // xchg32 over a spilled ctx
    ("atomic_stack_xchg_ptr", "corrupt_spill", 2), // xchg_64 hands the spilled ctx back as a scalar
    ("atomic_stack_xor_ptr", "corrupt_spill", 10), // atomic_fetch_xor over a spilled map value pointer
    ("bounds_add_wrap", "map_out_of_bounds", 13),  // off=8..23 on an 8-byte value
    ("bounds_jmp32_upper", "unbounded_access", 13), // r0 += r6, r6 up to 2^32+7
    ("bounds_signed_index", "unbounded_access", 16), // off=-1024..24 on a 32-byte value
    ("call_helper_dst_set", "bad_insn", 1),        // call with dst=3
    ("call_helper_off_set", "bad_insn", 1),        // call with off=4
    ("call_reserved_bits", "bad_insn", 2),         // opcode 0x8d (call with the X bit)
    ("config_write_update", "map_read_only", 11),  // bpf_map_update_elem on a config map
    ("ctx_misaligned_read", "ctx_out_of_bounds", 0), // u32 at off 2, inside msg_size
    ("ctx_oob", "ctx_out_of_bounds", 0), // R1 invalid context access off=1600 size=8: not a field of the 56-byte context
    ("ctx_or_index", "pointer_arithmetic", 2), // r1 |= r2 on the context
    ("ctx_past_end_net", "ctx_out_of_bounds", 0), // *(u32 *)(r1 +56): past `reserved`, the net context's last field
    ("ctx_reserved_overrun", "ctx_out_of_bounds", 0), // *(u64 *)(r1 +52): 4 bytes past the 56-byte context
    ("ctx_var_offset", "ctx_variable_offset", 5), // R1 variable context access: context fields must be read at constant offsets
    ("ctx_write_reserved", "ctx_read_only", 1),   // net `reserved` is read-only
    ("ctx_write_ro", "ctx_read_only", 1), // R1 write to read-only context field 'msg_size' (off=0 size=8)
    ("ctx_write_ro_net", "ctx_read_only", 1), // R1 write to read-only context field 'status' (off=48 size=4)
    ("ctx_write_var", "ctx_variable_offset", 5), // *(u32 *)(r1 +36) = w2, r1 = ctx + {0, 4}
    ("div32_upper_bits", "div_by_zero", 3),   // w3 /= w2, r2 != 0 but w2 may be 0
    ("div_by_zero", "div_by_zero", 2), // division or modulo by R1, which may be zero: test it against 0 first
    ("div_by_zero_imm", "div_by_zero", 1), // division or modulo by the constant 0
    ("epoch_write_agreed", "map_read_only", 9), // a tuner/epoch program counts into an agreed map
    ("fill_byte_over_bounded", "map_out_of_bounds", 17), // off=0..2040 on a 32-byte value
    ("fill_partial_uninit", "uninit_stack", 2), // u64 fill of fp-8, only fp-8..fp-5 written
    ("fill_uninit_byte", "uninit_stack", 2), // u16 fill of fp-16, only fp-16 written
    ("helper_ctx_as_map", "bad_helper_arg", 4), // R1 type=ctx expected=map_ptr (argument of bpf_map_lookup_elem)
    ("helper_not_allowed", "helper_not_allowed", 1), // helper bpf_ktime_get_ns#5 is not allowed in 'tuner' programs (tuner decisions must be identical on every rank, so clocks and CPU ids are not available)
    ("helper_not_allowed_cpu", "helper_not_allowed", 1), // helper bpf_get_smp_processor_id#8 is not allowed in 'tuner' programs (tuner decisions must be identical on every rank, so clocks and CPU ids are not available)
    ("helper_null_key", "null_deref", 10), // R2 invalid mem access 'map_value_or_null': check the result of bpf_map_lookup_elem for NULL before using it
    ("helper_scalar_key", "bad_helper_arg", 3), // R2 type=scalar expected=fp or map_value (argument of bpf_map_lookup_elem)
    ("helper_short_value", "uninit_stack", 11), // invalid read from stack R3 off -16 size 16: bytes never written
    ("helper_unknown", "unknown_helper", 0),    // unknown helper function #9999
    ("jmp32_null_check", "pointer_arithmetic", 7), // if w0 == 0 on map_value_or_null
    ("jump_into_lddw", "jump_into_lddw", 1),    // jump into the middle of ldimm64 insn 2
    ("jump_out_of_range", "jump_out_of_range", 0), // jump out of range to insn 101
    ("loop_counter_unbounded", "unbounded_loop", 6), // loop at insn 6 is not provably bounded (infinite loop or no proof within 1000001 processed instructions)
    ("loop_infinite", "unbounded_loop", 1), // loop at insn 1 is not provably bounded (infinite loop or no proof within 5 processed instructions)
    ("loop_map_bound", "unbounded_loop", 14), // loop head; bound is a map value
    ("loop_unbounded", "unbounded_loop", 1), // loop at insn 1 is not provably bounded (infinite loop or no proof within 1000001 processed instructions)
    ("map_oob_const", "map_out_of_bounds", 8), // R0 invalid access to map value of 'arr', value_size=8 off=16 size=8
    ("map_oob_end", "map_out_of_bounds", 13),  // off=0..16 size=4 on a 16-byte value
    ("map_oob_neg_var", "map_out_of_bounds", 13), // off=-16..12 on a 16-byte value
    ("map_oob_negative", "map_out_of_bounds", 8), // R0 invalid access to map value of 'arr', value_size=8 off=-1 size=1
    ("map_oob_unbounded", "unbounded_access", 11), // R1 unbounded memory access, make sure to bounds check any such access
    ("map_oob_var", "map_out_of_bounds", 13), // R0 invalid access to map value of 'arr', value_size=32 off=0..56 size=8: bound the index first
    ("map_read_only", "map_read_only", 3),    // R2 write into read-only map '.rodata'
    ("map_value_or_index", "pointer_arithmetic", 10), // r0 |= r6 on a map value
    ("mod32_upper_bits", "div_by_zero", 3),   // w0 %= w2, r2 != 0 but w2 may be 0
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
    ("precision_spill_branch", "map_out_of_bounds", 15), // off=8 on an 8-byte value, on the path where the fill is 1
    ("precision_spill_offset", "map_out_of_bounds", 15), // off=16 on a 16-byte value, on the path where the fill is 16
    ("ptr_sub_ctx", "pointer_arithmetic", 10),           // map_value - ctx
    ("ptr_sub_offset", "pointer_arithmetic", 18),        // w0 -= w6: two map values
    ("ptr_sub_two_lookups", "pointer_arithmetic", 18),   // r0 -= r7: values of two lookups
    ("ptr_sub_two_maps", "pointer_arithmetic", 16),      // r1 -= r0: values of two maps
    ("rank_local_branch", "rank_local", 12), // algo written under a branch on a net map value
    ("rank_local_profiler", "rank_local", 12), // algo from a map the profiler writes
    ("rank_local_chunk", "rank_local", 11),  // tuner/chunk's chunk_size from a net map
    ("rank_local_chunk_agreed", "rank_local", 10), // tuner/chunk has no view of agreed maps
    ("rank_local_chunk_config", "rank_local", 10), // nor of config maps other than .rodata
    ("rank_local_ctx_copy", "rank_local", 25), // algo from usable, in a struct copy of the context (8-byte words)
    ("rank_local_ctx_word", "rank_local", 6), // algo from usable, the upper half of one 8-byte load at nchannels
    ("rank_local_direct", "rank_local", 11),  // nchannels from a map a net hook counts into
    ("rank_local_early_return", "rank_local", 11), // algo after an early return on a net map value
    ("rank_local_epoch", "rank_local", 10),   // tuner/epoch state from the rank's own epoch source
    ("rank_local_epoch_branch", "rank_local", 12), // tuner/epoch state under a rank-local branch
    ("rank_local_global", "rank_local", 8),   // nchannels from .bss
    ("rank_local_init", "rank_local", 10),    // tuner/init constant from a net map
    ("rank_local_init_config", "rank_local", 10), // tuner/init constant from a config map
    ("rank_local_loop", "rank_local", 17),    // a count from a loop bounded by a net map value
    ("rank_local_merge", "rank_local", 16), // a constant chosen on a rank-local branch, after the join
    ("rank_local_percpu", "rank_local", 11), // algo from a per-CPU map
    ("rank_local_presence", "rank_local", 10), // proto set where a rank-local entry exists
    ("rank_local_subprog", "rank_local", 2), // proto from a subprogram that read a net map
    ("rank_local_via_key", "rank_local", 19), // a config value picked by a rank-local key
    ("rank_local_via_stack", "rank_local", 36), // the value through a spill and a byte copy
    ("rank_local_usable", "rank_local", 4), // algo from which entries of the cost table are usable
    ("rodata_atomic", "map_read_only", 3),  // lock add into .rodata
    ("rodata_delete", "map_read_only", 8),  // bpf_map_delete_elem(.rodata map)
    ("rodata_lookup_write", "map_read_only", 11), // store into a value of the .rodata map
    ("rodata_update", "map_read_only", 13), // bpf_map_update_elem(.rodata map)
    ("scalar_deref", "invalid_mem_access", 1), // R1 invalid mem access 'scalar'
    ("spill_mapptr_as_value", "pointer_leak", 19), // update value holds a map value pointer
    ("spill_misaligned_ptr", "pointer_leak", 0), // *(u64 *)(r10 -12) = r1 (ctx)
    ("spill_misaligned_ptr_net", "pointer_leak", 10), // *(u64 *)(r10 -21) = r0 (map value)
    ("spill_overwrite_byte", "corrupt_spill", 1), // *(u8 *)(r10 -8) = 0x40 into a spilled ctx
    ("spill_overwrite_half", "corrupt_spill", 10), // *(u16 *)(r10 -14) = w2 into a spilled map value pointer
    ("spill_overwrite_word", "corrupt_spill", 2),  // *(u32 *)(r10 -4) = w2 into a spilled ctx
    ("spill_ptr_as_key", "pointer_leak", 10),      // update key holds ctx
    ("spill_ptr_as_value", "pointer_leak", 12),    // update value holds ctx
    ("stack_oob_deep", "stack_out_of_bounds", 1), // R10 invalid stack access off=-520..-520 size=8: the stack is fp-512 .. fp-1
    ("stack_oob_read", "stack_out_of_bounds", 7), // R2 invalid stack access off=-16..1007 size=1: the stack is fp-512 .. fp-1
    ("stack_oob_write", "stack_out_of_bounds", 1), // R10 invalid stack access off=8..8 size=8: the stack is fp-512 .. fp-1
    ("stack_or_misaligned", "pointer_arithmetic", 6), // (fp-12) | [0, 3]: not 8-aligned
    ("stack_or_var_base", "pointer_arithmetic", 10), // (fp-16 + {0, 8}) | [0, 7]: variable base
    ("stack_or_wide", "pointer_arithmetic", 7),    // (fp-16) | [0, 15]: may reach bit 3
    ("subprog_caller_stack_oob", "stack_out_of_bounds", 9), // callee reads caller fp+0
    ("subprog_fallthrough", "bad_subprog", 1),     // main's last insn is r0 += 1, then the callee
    ("subprog_jump_across", "bad_subprog", 5),     // jump from first() into second()
    ("subprog_last_cond_jump", "bad_subprog", 6),  // first() ends with a conditional jump
    ("subprog_last_not_exit", "bad_subprog", 5),   // first() ends with r0 += 2
    ("subprog_return_stack_ptr", "uninit_register", 1), // caller reads r0 = callee fp-8, dead at its exit
    ("subprog_return_value_unchecked", "null_deref", 2), // caller reads a returned lookup result unchecked
    ("subprog_return_value_unchecked_depth3", "null_deref", 3), // ... passed up through three frames
    ("subprog_stack_ptr_depth2", "uninit_register", 7), // r2 = r0: frame 2's stack pointer, dead in frame 1
    ("subprog_stack_ptr_to_caller", "pointer_leak", 9), // callee fp-8 stored into caller's frame
    ("subprog_void_stack_r0", "uninit_register", 2),    // void callee left its fp-16 in r0
    ("too_large", "too_large", 0), // program has 5002 instructions, over the limit of 4096
    ("uninit_key", "uninit_stack", 6), // invalid read from stack R2 off -8 size 8: bytes never written
    ("uninit_r0_exit", "uninit_register", 0), // R0 !read_ok: register read before it was written
    ("uninit_register", "uninit_register", 0), // R3 !read_ok: register read before it was written
    ("uninit_stack", "uninit_stack", 0), // invalid read from stack R10 off -8 size 8: bytes never written
    ("v4_ldsx_index", "map_out_of_bounds", 12), // clang-19 -mcpu=v4; off=-128..15 on a 16-byte value
    ("v4_movsx_index", "unbounded_access", 13), // clang-19 -mcpu=v4; off=-262144..56 on a 64-byte value
    ("v4_sdiv_by_zero", "div_by_zero", 2),      // clang-19 -mcpu=v4; r0 s/= r2
];

/// Instructions whose line info is `line` (what the `/* REJECT */` marker covers).
fn insns_at_line(p: &policy_object::Program, line: usize) -> Vec<usize> {
    (0..p.insns.len())
        .filter(|&i| p.line_for(i).is_some_and(|l| l.line as usize == line))
        .collect()
}

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
        let expected = EXPECTED.iter().find(|(n, _, _)| *n == name);
        if expected.is_none() {
            failures.push(format!("{name}: no entry in EXPECTED"));
        }
        let at = |insn: usize| policy_object::insn::disasm(&p.insns, insn);
        match verify(p, &maps, Limits::default()) {
            Ok(_) => {
                let want = expected.map_or(String::new(), |&(_, _, i)| {
                    format!(" at insn {i} ({})", at(i))
                });
                let lines = marker.map_or(String::new(), |l| {
                    format!("; marker line {l} covers insns {:?}", insns_at_line(p, l))
                });
                failures.push(format!("{name}: accepted, expected {kind}{want}{lines}"));
            }
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
                if let Some(&(_, _, insn)) = expected
                    && insn != e.insn
                {
                    failures.push(format!(
                        "{name}: rejected at insn {}, expected {insn} ({})",
                        e.insn,
                        at(insn)
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

/// Every entry of EXPECTED names a program that exists, and each marker covers its instruction.
#[test]
fn expected_table_matches_the_corpus() {
    let mut failures = vec![];
    for &(name, kind, insn) in EXPECTED {
        let c = root().join(format!("policies/unsafe/{name}.c"));
        let Ok(src) = std::fs::read_to_string(&c) else {
            failures.push(format!("{name}: no {}", c.display()));
            continue;
        };
        if !src
            .lines()
            .any(|l| l.trim() == format!("// expect: {kind}"))
        {
            failures.push(format!("{name}: header does not say '// expect: {kind}'"));
        }
        let marker = src
            .lines()
            .position(|l| l.contains("/* REJECT */"))
            .map(|i| i + 1);
        let obj = root().join(format!("target/policies/unsafe/{name}.o"));
        let bytes = std::fs::read(&obj)
            .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", obj.display()));
        let o = Object::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = &o.programs[0];
        if let Some(line) = marker
            && !p.lines.is_empty()
            && !insns_at_line(p, line).contains(&insn)
        {
            failures.push(format!(
                "{name}: insn {insn} is not on the marked line {line} (that line has {:?})",
                insns_at_line(p, line)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
