//! The locality rule against random tuner programs: every program the verifier accepts for a
//! deciding hook (`tuner`, `tuner/epoch`) must decide the same on every rank. Each accepted
//! program (from `common::localgen`) runs as several ranks that share the agreed data (the
//! context's agreed fields, `.rodata`, the config map) and differ in the rank-local data
//! (`reg_buff`, `usable`, `.bss`, which keys the rank-local hash holds), on the checking
//! interpreter and on the JIT; the decisions (`algo`, `proto`, `nchannels`; `state[]`) must be
//! equal across ranks and engines, and the checking interpreter must not fault.
//!
//! Cases: `LOCALITY_CASES` (default 400), seed base: `LOCALITY_SEED` (printed), the programs
//! that break the rule are listed with their disassembly; `scripts/fuzz.sh` runs it long.

// Load errors carry their diagnosis; they are not a hot path.
#![allow(clippy::result_large_err)]

mod common;
use common::localgen::{self, BSS, CFG, Hook, SEEN, Shapes, VALUE};
use common::{progen::Rng, registry};
use policy_object::Object;
use policy_object::insn as op;
use policy_runtime::ctx::Context;
use policy_runtime::{LoadOptions, LoadedProgram, Tier, TunerCtx, TunerEpochCtx};
use policy_verifier::Limits;

const MAX_STEPS: u64 = 100_000;
const RANKS: usize = 4;
/// Agreed data sets each program runs under (each with `RANKS` rank-local variants).
const ROUNDS: usize = 2;

fn opts(tier: Tier) -> LoadOptions {
    LoadOptions {
        tier,
        limits: Limits {
            max_processed: 100_000,
            ..Limits::default()
        },
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A context of type `C` made of these bytes.
fn from_bytes<C: Copy>(b: &[u8]) -> C {
    assert_eq!(b.len(), std::mem::size_of::<C>());
    // SAFETY: C is a repr(C) struct of integers, valid for any bit pattern.
    unsafe { (b.as_ptr() as *const C).read_unaligned() }
}

fn bytes_of<C>(c: &C) -> Vec<u8> {
    // SAFETY: the contexts are plain-old-data repr(C) structs.
    unsafe { std::slice::from_raw_parts(c as *const C as *const u8, std::mem::size_of::<C>()) }
        .to_vec()
}

/// Values programs compare against or use as keys, and random words.
fn word(r: &mut Rng) -> u64 {
    const POOL: [u64; 10] = [
        0,
        1,
        2,
        3,
        7,
        0x100,
        0xff,
        u32::MAX as u64,
        1 << 32,
        u64::MAX,
    ];
    if r.below(3) == 0 {
        r.next()
    } else {
        POOL[r.below(POOL.len() as u64) as usize]
    }
}

fn random(r: &mut Rng, len: usize) -> Vec<u8> {
    let mut b = vec![];
    while b.len() < len {
        b.extend_from_slice(&word(r).to_le_bytes());
    }
    b.truncate(len);
    b
}

/// Where a context's rank-local bytes and its decisions lie.
struct Layout {
    local: &'static [(usize, usize)],
    decisions: (usize, usize),
}

const TUNER: Layout = Layout {
    local: &[(32, 36), (52, 56)], // reg_buff, usable
    decisions: (40, 52),          // algo, proto, nchannels
};
const EPOCH: Layout = Layout {
    local: &[],
    decisions: (48, 48 + 8 * 32), // state[]
};

/// One rank's run on both engines: the decisions, or what went wrong.
fn run_rank<C: Context + Copy>(
    int: &LoadedProgram,
    jit: &LoadedProgram,
    ctx: &[u8],
    l: &Layout,
) -> Result<Vec<u8>, String> {
    let mut ci: C = from_bytes(ctx);
    let mut cj: C = from_bytes(ctx);
    int.run_checked(&mut ci, MAX_STEPS)
        .map_err(|f| format!("checking interpreter: {f}"))?;
    jit.run(&mut cj);
    let (bi, bj) = (bytes_of(&ci), bytes_of(&cj));
    let (a, b) = l.decisions;
    if bi[a..b] != bj[a..b] {
        return Err(format!(
            "JIT decides {:?}, the interpreter {:?}",
            &bj[a..b],
            &bi[a..b]
        ));
    }
    Ok(bi[a..b].to_vec())
}

/// Fills the maps of both instances: agreed contents from `agreed`, rank-local ones from
/// `local`.
fn fill(progs: [&LoadedProgram; 2], agreed: &mut Rng, local: &mut Rng) {
    let cfg: Vec<Vec<u8>> = (0..4).map(|_| random(agreed, VALUE as usize)).collect();
    let bss = random(local, VALUE as usize);
    let nkeys = local.below(4);
    let seen: Vec<(u32, Vec<u8>)> = (0..nkeys)
        .map(|_| (word(local) as u32, random(local, VALUE as usize)))
        .collect();
    for p in progs {
        let maps = p.maps();
        for (k, v) in cfg.iter().enumerate() {
            let _ = maps[CFG as usize].update(&(k as u32).to_le_bytes(), v, 0);
        }
        let _ = maps[BSS as usize].update(&0u32.to_le_bytes(), &bss, 0);
        let h = &maps[SEEN as usize];
        for (key, _) in h.entries() {
            let _ = h.delete(&key);
        }
        for (key, v) in &seen {
            let _ = h.update(&key.to_le_bytes(), v, 0);
        }
    }
}

/// Ok(false): rejected; Ok(true): accepted, and every rank decided the same.
fn check<C: Context + Copy>(obj: &Object, seed: u64, l: &Layout) -> Result<bool, String> {
    let load = |tier| LoadedProgram::load(obj, None, &registry(), &opts(tier));
    let Ok(int) = load(Tier::Interpreter) else {
        return Ok(false);
    };
    let jit = load(if cfg!(target_arch = "x86_64") {
        Tier::Jit
    } else {
        Tier::Interpreter
    })
    .map_err(|e| format!("accepted for the interpreter, refused for the JIT: {e}"))?;
    let n = std::mem::size_of::<C>();
    let mut r = Rng(seed ^ 0x10ca_u64.rotate_left(32));
    for _ in 0..ROUNDS {
        let agreed_seed = r.next();
        let ctx = random(&mut Rng(agreed_seed), n);
        let mut first: Option<(Vec<u8>, Vec<u8>)> = None;
        for _ in 0..RANKS {
            let mut local = Rng(r.next());
            let mut c = ctx.clone();
            for &(a, b) in l.local {
                c[a..b].copy_from_slice(&random(&mut local, b - a));
            }
            fill([&int, &jit], &mut Rng(agreed_seed), &mut local);
            let d = run_rank::<C>(&int, &jit, &c, l)?;
            match &first {
                None => first = Some((c, d)),
                Some((c0, d0)) if *d0 != d => {
                    return Err(format!(
                        "ranks decide differently:\n  context {c0:?}\n  decides {d0:?}\n  context {c:?}\n  decides {d:?}"
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(true)
}

fn listing(insns: &[policy_object::Insn]) -> String {
    let mut out = vec![];
    let mut pc = 0;
    while pc < insns.len() {
        out.push(format!("{pc:3}: {}", op::disasm(insns, pc)));
        pc += if insns[pc].is_lddw() { 2 } else { 1 };
    }
    out.join("\n")
}

#[test]
fn accepted_programs_decide_the_same_for_any_rank_local_data() {
    let cases = env_u64("LOCALITY_CASES").unwrap_or(400);
    let base = env_u64("LOCALITY_SEED").unwrap_or(0x5eed);
    let (mut accepted, mut violations) = (0u64, vec![]);
    let mut shapes = [0u64; 5];
    let mut shapes_ok = [0u64; 5];
    let count = |s: &Shapes, into: &mut [u64; 5]| {
        for (k, b) in [
            s.wide_ctx,
            s.partial_ctx,
            s.deep,
            s.region_call,
            s.stack_via_ptr,
        ]
        .into_iter()
        .enumerate()
        {
            into[k] += u64::from(b);
        }
    };
    for k in 0..cases {
        let seed = base.wrapping_add(k);
        let hook = if k % 3 == 2 { Hook::Epoch } else { Hook::Tuner };
        let (obj, s) = localgen::program(seed, hook);
        count(&s, &mut shapes);
        let verdict = match hook {
            Hook::Tuner => check::<TunerCtx>(&obj, seed, &TUNER),
            Hook::Epoch => check::<TunerEpochCtx>(&obj, seed, &EPOCH),
        };
        match verdict {
            Ok(true) => {
                accepted += 1;
                count(&s, &mut shapes_ok);
            }
            Ok(false) => {}
            Err(e) => violations.push(format!(
                "seed {seed} ({}): {e}\n{}",
                hook.section(),
                listing(&obj.programs[0].insns)
            )),
        }
    }
    eprintln!(
        "locality fuzz: seed base {base}, {cases} programs, {accepted} accepted, {} violations; \
         generated/accepted with wide context loads {}/{}, partial {}/{}, 3+ frames {}/{}, \
         calls in branches {}/{}, stack through other pointers {}/{}",
        violations.len(),
        shapes[0],
        shapes_ok[0],
        shapes[1],
        shapes_ok[1],
        shapes[2],
        shapes_ok[2],
        shapes[3],
        shapes_ok[3],
        shapes[4],
        shapes_ok[4],
    );
    for v in violations.iter().take(3) {
        eprintln!("{v}\n");
    }
    assert!(violations.is_empty(), "{} violations", violations.len());
    assert!(accepted > 0, "no program accepted: the generator is broken");
}
