//! Properties over random programs:
//!
//! * differential: for every program the verifier accepts, the JIT, our interpreter and the
//!   rbpf interpreter (for programs without atomics, which rbpf 0.4.1 lacks) give the same
//!   results, context writes and map contents;
//! * soundness: accepted programs, run in the checking interpreter, never touch memory outside
//!   their context, stack and map values, and terminate;
//! * robustness: mutated programs never make the verifier panic, and any mutant it accepts is
//!   still sound.
//!
//! Case counts are bounded for CI (`PROPTEST_CASES` raises them; `scripts/fuzz.sh` runs long).

mod common;
use common::progen::{self, Rng};
use common::{dump, registry};
use policy_object::insn::{self as op, Insn};
use policy_runtime::ctx::Context;
use policy_runtime::{LoadError, LoadOptions, LoadedProgram, NetCtx, Tier, TunerCtx};
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cases per property: `PROPTEST_CASES` when set (`with_cases` alone would ignore it).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn opts(tier: Tier) -> LoadOptions {
    LoadOptions {
        tier,
        ..LoadOptions::default()
    }
}

static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static RBPF_RUNS: AtomicU64 = AtomicU64::new(0);

fn listing(p: &LoadedProgram) -> String {
    (0..p.insns().len())
        .map(|i| format!("{i:3}: {}", op::disasm(p.insns(), i)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rbpf_run(p: &LoadedProgram, ctx: &mut [u8]) -> Option<u64> {
    // rbpf 0.4.1 has no atomics, and zero-extends the immediate of 64-bit conditional jumps
    // (the ISA and the kernel sign-extend it): leave such programs to the other two engines.
    let rbpf_differs = |i: &Insn| {
        (i.class() == op::STX && i.mode() == op::ATOMIC)
            || (i.class() == op::JMP
                && !i.is_reg_src()
                && i.imm < 0
                && !matches!(i.op(), op::JA | op::CALL | op::EXIT))
    };
    if p.insns().iter().any(rbpf_differs) {
        return None;
    }
    let bytes: Vec<u8> = p.insns().iter().flat_map(|i| i.encode()).collect();
    let mut vm = rbpf::EbpfVmRaw::new(Some(&bytes)).ok()?;
    vm.register_helper(1, |a, b, c, d, e| {
        policy_runtime::helpers::map_lookup_elem(a, b, c, d, e)
    })
    .ok()?;
    vm.register_helper(2, |a, b, c, d, e| {
        policy_runtime::helpers::map_update_elem(a, b, c, d, e)
    })
    .ok()?;
    vm.register_helper(3, |a, b, c, d, e| {
        policy_runtime::helpers::map_delete_elem(a, b, c, d, e)
    })
    .ok()?;
    for m in p.maps() {
        for (s, l) in m.value_ranges() {
            vm.register_allowed_memory(s as u64..(s + l) as u64);
        }
    }
    // SAFETY of the oracle: rbpf checks every access against ctx, its stack and the ranges.
    let r = vm.execute_program(ctx).ok()?;
    RBPF_RUNS.fetch_add(1, Ordering::Relaxed);
    Some(r)
}

fn as_bytes<T>(v: &mut T) -> &mut [u8] {
    // SAFETY: the contexts are plain-old-data repr(C) structs.
    unsafe { std::slice::from_raw_parts_mut(v as *mut T as *mut u8, std::mem::size_of::<T>()) }
}

/// Runs one context through the JIT, the checking interpreter and (while it can) rbpf:
/// their return values, and whether the context writes agree.
fn three_engines<C: Context + Copy + PartialEq>(
    jit: &LoadedProgram,
    int: &LoadedProgram,
    orc: &LoadedProgram,
    ctx: C,
    use_rbpf: &mut bool,
    seed: u64,
) -> (u64, u64, Option<u64>, bool) {
    let (mut a, mut b, mut c) = (ctx, ctx, ctx);
    let ra = jit.run(&mut a);
    let rb = int
        .run_checked(&mut b, 10_000_000)
        .unwrap_or_else(|f| panic!("seed {seed}: unsound: {f}\n{}", listing(int)));
    let rc = if *use_rbpf {
        rbpf_run(orc, as_bytes(&mut c))
    } else {
        None
    };
    if rc.is_none() {
        *use_rbpf = false;
    }
    (ra, rb, rc, a == b && (rc.is_none() || b == c))
}

/// Checks one generated program; returns whether the verifier accepted it.
fn differential(seed: u64) -> bool {
    let section = if seed.is_multiple_of(3) {
        "net/isend"
    } else {
        "tuner"
    };
    let obj = progen::program(seed, section);
    let (ra, rb, rc) = (registry(), registry(), registry());
    let jit = match LoadedProgram::load(&obj, None, &ra, &opts(Tier::Jit)) {
        Ok(p) => p,
        Err(LoadError::Verify { .. }) => return false,
        Err(e) => panic!("seed {seed}: {e}"),
    };
    let int = LoadedProgram::load(&obj, None, &rb, &opts(Tier::Interpreter)).unwrap();
    let orc = LoadedProgram::load(&obj, None, &rc, &opts(Tier::Interpreter)).unwrap();
    let mut r = Rng(seed ^ 0xabcdef);
    let mut use_rbpf = true;
    for _ in 0..6 {
        let base = TunerCtx {
            msg_size: r.next() >> r.below(64),
            comm_id: r.next(),
            coll_type: r.below(8) as u32,
            nranks: r.below(200) as u32,
            nnodes: r.below(9) as u32,
            num_pipe_ops: 1,
            reg_buff: 0,
            max_channels: r.below(64) as u32,
            algo: -1,
            proto: -1,
            nchannels: 0,
            usable: 0,
            nccl_algo: -1,
            nccl_proto: -1,
        };
        let (ret_a, ret_b, ret_c, same_ctx) = if section == "tuner" {
            three_engines(&jit, &int, &orc, base, &mut use_rbpf, seed)
        } else {
            let n = NetCtx {
                conn_id: r.below(4),
                bytes: r.next() >> r.below(64),
                op: r.below(8) as u32,
                ..NetCtx::default()
            };
            three_engines(&jit, &int, &orc, n, &mut use_rbpf, seed)
        };
        assert_eq!(
            ret_a,
            ret_b,
            "seed {seed}: JIT vs interpreter\n{}",
            listing(&int)
        );
        if let Some(c) = ret_c {
            assert_eq!(
                ret_b,
                c,
                "seed {seed}: interpreter vs rbpf\n{}",
                listing(&int)
            );
        }
        assert!(
            same_ctx,
            "seed {seed}: context writes differ\n{}",
            listing(&int)
        );
    }
    for (k, (ma, mb)) in jit.maps().iter().zip(int.maps()).enumerate() {
        assert_eq!(
            dump(ma),
            dump(mb),
            "seed {seed}: map {} JIT vs interpreter\n{}",
            ma.spec().name,
            listing(&int)
        );
        if use_rbpf {
            assert_eq!(
                dump(mb),
                dump(&orc.maps()[k]),
                "seed {seed}: map {} vs rbpf\n{}",
                mb.spec().name,
                listing(&int)
            );
        }
    }
    ACCEPTED.fetch_add(1, Ordering::Relaxed);
    true
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(400)))]

    #[test]
    fn accepted_programs_agree_and_stay_in_bounds(seed in any::<u64>()) {
        differential(seed);
    }

    #[test]
    fn mutants_never_panic_the_verifier_and_stay_sound(seed in any::<u64>(), muts in proptest::collection::vec((any::<u16>(), any::<u64>()), 1..4)) {
        let section = if seed % 2 == 0 { "tuner" } else { "net/complete" };
        let mut obj = progen::program(seed, section);
        let insns = &mut obj.programs[0].insns;
        for (at, bits) in muts {
            let i = at as usize % insns.len();
            let old = insns[i];
            insns[i] = match bits % 5 {
                0 => Insn { imm: (bits >> 8) as i32, ..old },
                1 => Insn { off: (bits >> 8) as i16, ..old },
                2 => Insn { dst: ((bits >> 8) % 11) as u8, ..old },
                3 => Insn { src: ((bits >> 8) % 11) as u8, ..old },
                _ => Insn::decode(&(bits >> 3).to_le_bytes()),
            };
        }
        let reg = registry();
        if let Ok(p) = LoadedProgram::load(&obj, None, &reg, &opts(Tier::Interpreter)) {
            let mut c = TunerCtx { msg_size: seed >> 7, nranks: 4, nnodes: 2, algo: -1, proto: -1, ..TunerCtx::default() };
            let mut n = NetCtx { bytes: seed >> 9, conn_id: 1, ..NetCtx::default() };
            let res = if section == "tuner" { p.run_checked(&mut c, 10_000_000) } else { p.run_checked(&mut n, 10_000_000) };
            prop_assert!(res.is_ok(), "accepted mutant is unsound: {:?}\n{}", res, listing(&p));
        }
    }
}

#[test]
fn generator_produces_mostly_accepted_programs() {
    let n = 300;
    let accepted = (0..n).filter(|&s| differential(0x5eed_0000 + s)).count();
    println!(
        "{accepted}/{n} generated programs accepted, {} rbpf runs",
        RBPF_RUNS.load(Ordering::Relaxed)
    );
    assert!(
        accepted * 4 >= n as usize,
        "only {accepted}/{n} accepted: the differential test would be vacuous"
    );
    assert!(RBPF_RUNS.load(Ordering::Relaxed) > 0, "rbpf never ran");
}

#[test]
fn regression_seeds() {
    {
        let seed = 7979256609433906822u64;
        differential(seed);
    }
}

#[test]
fn mutant_regressions() {
    // A mutant turned an lddw into a direct value reference (src 2) into a hash map.
    let seed = (0u64..)
        .find(|&s| {
            progen::program(s, "tuner").programs[0]
                .insns
                .iter()
                .any(|i| i.is_lddw())
        })
        .unwrap();
    let mut obj = progen::program(seed, "tuner");
    let i = obj.programs[0]
        .insns
        .iter_mut()
        .find(|i| i.is_lddw())
        .unwrap();
    i.src = op::PSEUDO_MAP_VALUE;
    i.imm = 1;
    assert!(matches!(
        LoadedProgram::load(&obj, None, &registry(), &opts(Tier::Jit)),
        Err(LoadError::Verify { .. })
    ));
}
