//! Soundness against hostile programs: every program the verifier accepts, run in the checking
//! interpreter on adversarial contexts and maps (fields holding host addresses, extremes), must
//!
//! * stay in bounds and terminate (no fault of the checking interpreter);
//! * not depend on where things are: two interpreter instances whose context, maps and stack
//!   live at different addresses, and the JIT, give the same r0, context and map bytes;
//! * never leak an address: no map key or value, and no r0, holds an address of the run's own
//!   context, map values, map objects or (JIT) stack;
//! * leave read-only maps (`.rodata`) as they were;
//! * never panic the verifier, the loader or the JIT.
//!
//! The programs come from `common::soundgen`. A failure is minimised (instructions removed while
//! the same violation remains) and printed with its disassembly. Case count: `SOUNDNESS_CASES`
//! (or `PROPTEST_CASES`; mutants: `SOUNDNESS_MUTANTS`), seed base: `SOUNDNESS_SEED`, one case
//! per class and feature set: `SOUNDNESS_GROUP=features`, every program and every rejection
//! on stderr: `SOUNDNESS_TRACE=1`, `SOUNDNESS_WHY=1`; `scripts/fuzz.sh` runs it long.

// Load and verification errors carry their diagnosis; they are not a hot path.
#![allow(clippy::result_large_err)]

mod common;
use common::soundgen::{self, Ending, RODATA};
use common::{dump, progen::Rng, registry};
use policy_object::Object;
use policy_object::insn::build::insn;
use policy_object::insn::{self as op, Insn};
use policy_runtime::ctx::Context;
use policy_runtime::interp::{self, Regions};
use policy_runtime::{LoadError, LoadOptions, LoadedProgram, NetCtx, Tier, TunerCtx};
use policy_verifier::Limits;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

const MAX_STEPS: u64 = 200_000;
const CONTEXTS: u64 = 3;

fn opts(tier: Tier) -> LoadOptions {
    LoadOptions {
        tier,
        limits: Limits {
            max_processed: 200_000,
            ..Limits::default()
        },
    }
}

/// A context on a page of its own, so contexts of different instances are far apart.
#[repr(C, align(4096))]
struct Page<C>(C);

/// What went wrong, with a class for grouping (one saved case per class).
#[derive(Debug, Clone)]
struct Violation {
    class: String,
    detail: String,
}

fn violation(class: impl Into<String>, detail: impl Into<String>) -> Violation {
    Violation {
        class: class.into(),
        detail: detail.into(),
    }
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f` under catch_unwind, without the panic message on stderr (the panic becomes a
/// violation that is reported with the program).
fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                prev(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    r
}

fn panic_text(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

pub fn listing(insns: &[Insn]) -> String {
    let mut out = vec![];
    let mut pc = 0;
    while pc < insns.len() {
        out.push(format!("{pc:3}: {}", op::disasm(insns, pc)));
        pc += if insns[pc].is_lddw() { 2 } else { 1 };
    }
    out.join("\n")
}

/// The program as a Rust literal for the regression list.
fn literal(section: &str, insns: &[Insn]) -> String {
    let body: Vec<String> = insns
        .iter()
        .map(|i| {
            format!(
                "({:#04x}, {}, {}, {}, {})",
                i.code, i.dst, i.src, i.off, i.imm
            )
        })
        .collect();
    format!("(\"{section}\", &[{}])", body.join(", "))
}

/// One run's observable result.
#[derive(PartialEq, Eq, Debug)]
struct Outcome {
    r0: u64,
    ctx: Vec<u8>,
    maps: Vec<Vec<(Vec<u8>, Vec<u8>)>>,
}

fn bytes_of<C>(c: &C) -> Vec<u8> {
    // SAFETY: the contexts are plain-old-data repr(C) structs.
    unsafe { std::slice::from_raw_parts(c as *const C as *const u8, std::mem::size_of::<C>()) }
        .to_vec()
}

/// A context of type `C` made of these bytes.
fn from_bytes<C: Copy>(b: &[u8]) -> C {
    assert_eq!(b.len(), std::mem::size_of::<C>());
    // SAFETY: C is a repr(C) struct of integers, valid for any bit pattern.
    unsafe { (b.as_ptr() as *const C).read_unaligned() }
}

/// Values that break careless assumptions, plus addresses of the first instance's objects.
fn pool(planted: &[u64]) -> Vec<u64> {
    let mut v = vec![
        0,
        1,
        u32::MAX as u64,
        i64::MIN as u64,
        u64::MAX,
        0x7fff_ffff,
        0x8000_0000,
        4095,
        4096,
        15,
        16,
        17,
        32,
        56,
        512,
        0xffff_ffff_0000_0000,
    ];
    v.extend_from_slice(planted);
    v
}

fn adversarial(r: &mut Rng, pool: &[u64], len: usize) -> Vec<u8> {
    let mut b = vec![];
    while b.len() < len {
        let w = if r.below(3) == 0 {
            let lo = pool[r.below(pool.len() as u64) as usize] as u32;
            let hi = pool[r.below(pool.len() as u64) as usize] as u32;
            u64::from(lo) | (u64::from(hi) << 32)
        } else if r.below(8) == 0 {
            r.next()
        } else {
            pool[r.below(pool.len() as u64) as usize]
        };
        b.extend_from_slice(&w.to_le_bytes());
    }
    b.truncate(len);
    b
}

struct Instance {
    p: LoadedProgram,
}

impl Instance {
    /// Address ranges a leak would reveal: context page, map segments, map objects.
    fn live(&self, ctx: usize) -> Vec<(u64, u64)> {
        let mut v = vec![(ctx as u64, ctx as u64 + 4096)];
        for m in self.p.maps() {
            let (b, l) = m.memory();
            v.push((b as u64, (b + l) as u64));
            let a = std::sync::Arc::as_ptr(m) as u64;
            v.push((a, a + 64));
        }
        v
    }

    fn outcome(&self, r0: u64, ctx: Vec<u8>) -> Outcome {
        Outcome {
            r0,
            ctx,
            maps: self.p.maps().iter().map(|m| dump(m)).collect(),
        }
    }

    fn fill_maps(&self, r: &mut Rng, pool: &[u64]) {
        for (k, m) in self.p.maps().iter().enumerate() {
            if k as i32 == RODATA {
                continue;
            }
            let s = m.spec().clone();
            let keys: Vec<Vec<u8>> = if s.kind == shared_maps::MapType::Hash {
                let n = 1 + r.below(5);
                (0..n)
                    .map(|_| adversarial(r, pool, s.key_size as usize))
                    .collect()
            } else {
                (0..s.max_entries)
                    .map(|k| k.to_le_bytes()[..s.key_size as usize].to_vec())
                    .collect()
            };
            for key in keys {
                let v = adversarial(r, pool, s.value_size as usize);
                let _ = m.update(&key, &v, 0);
            }
        }
    }
}

fn scan(out: &Outcome, live: &[(u64, u64)], who: &str) -> Result<(), Violation> {
    let hit = |v: u64| live.iter().any(|&(a, b)| v >= a && v < b);
    if hit(out.r0) {
        return Err(violation(
            "leak: address in r0",
            format!("{who}: r0 = {:#x} is a live address", out.r0),
        ));
    }
    for (k, m) in out.maps.iter().enumerate() {
        for (key, val) in m {
            for (what, b) in [("key", key), ("value", val)] {
                for w in b.windows(8) {
                    let v = u64::from_le_bytes(w.try_into().unwrap());
                    if hit(v) {
                        return Err(violation(
                            format!("leak: address in a map {what}"),
                            format!("{who}: map {k} {what} holds live address {v:#x}"),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A run in the checking interpreter: bounds, steps, uninitialised stack reads and, with
/// `escape`, host addresses of this run stored outside the stack or returned. (Instances whose
/// data holds planted addresses run without the escape check; see `clean` in `check`.)
fn checked(
    p: &LoadedProgram,
    ctx: *mut u8,
    ctx_len: usize,
    escape: bool,
) -> Result<u64, interp::Fault> {
    let mut regions = Regions(vec![(ctx as usize, ctx_len)]);
    for m in p.maps() {
        regions.0.extend(m.value_ranges());
    }
    let check = interp::Checked {
        pointer_escape: escape,
        ..interp::Checked::new(&regions, MAX_STEPS)
    };
    interp::run_with(
        p.insns(),
        ctx as u64,
        0,
        Some(&check),
        &policy_runtime::helpers::by_id,
    )
}

fn fault_class(f: &interp::Fault) -> String {
    let d = format!("{f:?}");
    let name = d.split([' ', '{', '(']).next().unwrap_or("").to_string();
    match f {
        interp::Fault::OutOfBounds { write: true, .. } => "fault: OutOfBounds write".into(),
        interp::Fault::OutOfBounds { write: false, .. } => "fault: OutOfBounds read".into(),
        _ => format!("fault: {name}"),
    }
}

/// Loads `obj` three times (JIT, interpreter, interpreter at other addresses) and checks it
/// on adversarial contexts. Ok(false): rejected; Ok(true): accepted and sound.
fn check<C: Context + Copy>(obj: &Object, seed: u64) -> Result<bool, Violation> {
    let load = |tier| {
        let reg = registry();
        quietly(|| LoadedProgram::load(obj, None, &reg, &opts(tier)))
    };
    let int = match load(Tier::Interpreter) {
        Err(e) => return Err(violation("verifier panic", panic_text(&e))),
        Ok(Err(LoadError::Verify { .. })) => return Ok(false),
        // Accepted but not loadable (e.g. a direct reference into a non-global map).
        Ok(Err(_)) => return Ok(false),
        Ok(Ok(p)) => Instance { p },
    };
    let int2 = match load(Tier::Interpreter) {
        Ok(Ok(p)) => Instance { p },
        _ => return Err(violation("loader differs", "second load failed")),
    };
    // The escape check needs data free of host addresses: arithmetic on a planted address of
    // the first instance (`+= 4096`) can land on another instance's memory, which is often
    // adjacent. A fourth load, on address-free data, runs with it.
    let clean = match load(Tier::Interpreter) {
        Ok(Ok(p)) => Instance { p },
        _ => return Err(violation("loader differs", "third load failed")),
    };
    let jit = match load(if cfg!(target_arch = "x86_64") {
        Tier::Jit
    } else {
        Tier::Interpreter
    }) {
        Err(e) => return Err(violation("JIT panic", panic_text(&e))),
        Ok(Err(e)) => return Err(violation("JIT refused", e.to_string())),
        Ok(Ok(p)) => Instance { p },
    };
    let n = std::mem::size_of::<C>();
    let zero = from_bytes::<C>(&vec![0u8; n]);
    let (mut ci, mut ci2, mut cj, mut cc) = (
        Box::new(Page(zero)),
        Box::new(Page(zero)),
        Box::new(Page(zero)),
        Box::new(Page(zero)),
    );
    let addr = |c: &mut Box<Page<C>>| c.0.as_mut_ptr() as usize;
    let (ai, ai2, aj) = (addr(&mut ci), addr(&mut ci2), addr(&mut cj));
    let mut planted = vec![ai as u64, ai as u64 + 8];
    for m in int.p.maps() {
        let (b, _) = m.value_ranges()[0];
        planted.push(b as u64);
        planted.push(b as u64 + 8);
    }
    let pool = pool(&planted);
    let mut r = Rng(seed ^ 0x50u64.rotate_left(40));
    let map_seed = r.next();
    for inst in [&int, &int2, &jit] {
        inst.fill_maps(&mut Rng(map_seed), &pool);
    }
    let clean_pool = self::pool(&[]);
    let mut rc = Rng(seed ^ 0xc1ea_u64.rotate_left(24));
    clean.fill_maps(&mut Rng(map_seed), &clean_pool);
    let rodata = int.p.maps()[RODATA as usize].get(&0u32.to_le_bytes());
    // The JIT's stack lies below this frame.
    let here = &r as *const Rng as u64;
    let mut live_j = jit.live(aj);
    live_j.push((here.saturating_sub(1 << 20), here + 4096));
    let live_i2 = int2.live(ai2);
    for _ in 0..CONTEXTS {
        let bytes = adversarial(&mut r, &pool, n);
        ci.0 = from_bytes(&bytes);
        ci2.0 = from_bytes(&bytes);
        cj.0 = from_bytes(&bytes);
        let listing_err = |f: &interp::Fault| violation(fault_class(f), f.to_string());
        let ri = checked(&int.p, ci.0.as_mut_ptr(), n, false).map_err(|f| listing_err(&f))?;
        // Hold an allocation the size of a stack so the second instance's stack moves.
        let hold = Box::new([0u64; 64]);
        let ri2 = checked(&int2.p, ci2.0.as_mut_ptr(), n, false).map_err(|f| listing_err(&f))?;
        drop(hold);
        cc.0 = from_bytes(&adversarial(&mut rc, &clean_pool, n));
        checked(&clean.p, cc.0.as_mut_ptr(), n, true).map_err(|f| listing_err(&f))?;
        let oi = int.outcome(ri, bytes_of(&ci.0));
        let oi2 = int2.outcome(ri2, bytes_of(&ci2.0));
        if oi != oi2 {
            // Name the leak when the difference is one of this instance's addresses.
            scan(&oi2, &live_i2, "interpreter")?;
            return Err(violation(
                "result depends on addresses",
                format!("interpreter at one place: {oi:?}\nat another: {oi2:?}"),
            ));
        }
        let rj = jit.p.run(&mut cj.0);
        let oj = jit.outcome(rj, bytes_of(&cj.0));
        if oj != oi {
            scan(&oj, &live_j, "JIT")?;
            return Err(violation(
                "JIT differs from the interpreter",
                format!("JIT: {oj:?}\ninterpreter: {oi:?}"),
            ));
        }
        if int.p.maps()[RODATA as usize].get(&0u32.to_le_bytes()) != rodata {
            return Err(violation(
                "read-only map written",
                ".rodata changed".to_string(),
            ));
        }
    }
    Ok(true)
}

fn check_here(obj: &Object, seed: u64) -> Result<bool, Violation> {
    if obj.programs[0].section == "tuner" {
        check::<TunerCtx>(obj, seed)
    } else {
        check::<NetCtx>(obj, seed)
    }
}

/// Runs `f` in a child process, so that a program that corrupts memory (a verifier bug that
/// also fools the checking interpreter, a helper given a bad pointer) or hangs the JIT is a
/// violation rather than the end of the test. The maps are shared memory, but each check
/// creates its own.
fn isolated(f: impl FnOnce() -> Result<bool, Violation>) -> Result<bool, Violation> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only computes, writes to the pipe and _exits; it takes no lock another
    // thread could hold except the allocator's, which glibc makes safe across fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: in the child; alarm bounds a JIT run that never ends.
        unsafe {
            libc::close(fds[0]);
            libc::alarm(20);
        }
        let msg = match f() {
            Ok(true) => "1".to_string(),
            Ok(false) => "0".to_string(),
            Err(v) => format!("E{}\0{}", v.class, v.detail),
        };
        let b = msg.as_bytes();
        let mut at = 0;
        while at < b.len() {
            // SAFETY: writing our own buffer to our pipe.
            let n = unsafe { libc::write(fds[1], b[at..].as_ptr().cast(), b.len() - at) };
            if n <= 0 {
                break;
            }
            at += n as usize;
        }
        // SAFETY: leave without running the parent's destructors or the test harness.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: closing the parent's copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut out = vec![];
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into our buffer from our pipe.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    let mut status = 0;
    // SAFETY: our descriptor and our child.
    unsafe {
        libc::close(fds[0]);
        libc::waitpid(pid, &mut status, 0);
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let what = if sig == libc::SIGALRM {
            "hang (no exit in 20 s)".to_string()
        } else {
            format!("crash (signal {sig})")
        };
        return Err(violation(
            what,
            "the checked run or the JIT killed the process",
        ));
    }
    let s = String::from_utf8_lossy(&out);
    match s.as_ref() {
        "1" => Ok(true),
        "0" => Ok(false),
        e => {
            let e = e.strip_prefix('E').unwrap_or(e);
            let (class, detail) = e.split_once('\0').unwrap_or((e, ""));
            Err(violation(class, detail))
        }
    }
}

/// What became of one program.
enum Verdict {
    Rejected(&'static str),
    Sound,
    Unsound(Violation),
}

/// Verifies `obj` here (a panic is a violation), checks the structure of what was accepted,
/// then runs it in a child.
fn verdict(obj: &Object, seed: u64) -> Verdict {
    let infos = policy_verifier::map_infos(&obj.maps);
    let v = quietly(|| {
        policy_verifier::verify(&obj.programs[0], &infos, opts(Tier::Interpreter).limits)
    });
    match v {
        Err(e) => Verdict::Unsound(violation("verifier panic", panic_text(&e))),
        Ok(Err(e)) => {
            if std::env::var_os("SOUNDNESS_WHY").is_some() {
                let t = e.to_string();
                eprintln!("REJ {}", t.lines().next().unwrap_or(""));
            }
            Verdict::Rejected(e.kind())
        }
        Ok(Ok(_)) => {
            if let Err(v) = structure(&obj.programs[0].insns) {
                return Verdict::Unsound(v);
            }
            match isolated(|| check_here(obj, seed)) {
                Ok(true) => Verdict::Sound,
                Ok(false) => Verdict::Rejected("not loadable"),
                Err(v) => Verdict::Unsound(v),
            }
        }
    }
}

fn check_any(obj: &Object, seed: u64) -> Result<bool, Violation> {
    match verdict(obj, seed) {
        Verdict::Rejected(_) => Ok(false),
        Verdict::Sound => Ok(true),
        Verdict::Unsound(v) => Err(v),
    }
}

/// What an accepted program must look like whatever the state analysis says: calls and exits
/// without reserved bits, subprograms that end in `exit` or `goto` (no falling into the next
/// one), jumps that stay inside their subprogram.
fn structure(insns: &[Insn]) -> Result<(), Violation> {
    let n = insns.len() as i64;
    let bad = |what: String| Err(violation("structure: accepted a malformed program", what));
    let mut starts = vec![0i64];
    let mut pc = 0usize;
    while pc < insns.len() {
        let i = insns[pc];
        if i.class() == op::JMP && i.op() == op::CALL {
            if i.code != op::JMP | op::CALL || i.dst != 0 || i.off != 0 || i.src > 1 {
                return bad(format!("insn {pc}: call with reserved fields set ({i:?})"));
            }
            if i.src == op::PSEUDO_CALL {
                starts.push(pc as i64 + 1 + i64::from(i.imm));
            }
        }
        if i.class() == op::JMP
            && i.op() == op::EXIT
            && (i.code != op::JMP | op::EXIT
                || i.dst != 0
                || i.src != 0
                || i.off != 0
                || i.imm != 0)
        {
            return bad(format!("insn {pc}: exit with reserved fields set ({i:?})"));
        }
        pc += if i.is_lddw() { 2 } else { 1 };
    }
    starts.sort();
    starts.dedup();
    if starts.iter().any(|&s| s < 0 || s >= n) {
        return bad(format!("call target outside the program: {starts:?}"));
    }
    let sub_of = |pc: i64| starts.iter().rposition(|&s| s <= pc).unwrap_or(0);
    let mut pc = 0usize;
    while pc < insns.len() {
        let i = insns[pc];
        let next = pc + if i.is_lddw() { 2 } else { 1 };
        let ends_sub = next == insns.len() || starts.contains(&(next as i64));
        let is_jmp = matches!(i.class(), op::JMP | op::JMP32);
        let jumps_always = matches!(i.op(), op::EXIT | op::JA)
            && (i.class() == op::JMP || (i.class() == op::JMP32 && i.op() == op::JA));
        if ends_sub && !jumps_always {
            return bad(format!(
                "insn {pc} ({}) runs into the next subprogram or off the end",
                op::disasm(insns, pc)
            ));
        }
        if is_jmp && !matches!(i.op(), op::EXIT | op::CALL) {
            let rel = if i.class() == op::JMP32 && i.op() == op::JA {
                i64::from(i.imm)
            } else {
                i64::from(i.off)
            };
            let t = pc as i64 + 1 + rel;
            if sub_of(t) != sub_of(pc as i64) {
                return bad(format!("insn {pc}: jump to {t}, in another subprogram"));
            }
        }
        pc = next;
    }
    Ok(())
}

/// Removes instructions while the same class of violation remains (`first` is the violation
/// found; address-dependent ones may not show on every run).
fn minimize(obj: &Object, seed: u64, first: &Violation) -> (Object, Violation) {
    let class = first.class.as_str();
    let mut best = obj.clone();
    let mut v = first.clone();
    loop {
        let insns = best.programs[0].insns.clone();
        let mut shrunk = false;
        for k in (0..insns.len()).rev() {
            if k > 0 && insns[k - 1].is_lddw() {
                continue;
            }
            let mut cand = best.clone();
            cand.programs[0].insns = soundgen::remove(&insns, k);
            if cand.programs[0].insns.is_empty() {
                continue;
            }
            if let Err(w) = check_any(&cand, seed)
                && w.class == class
            {
                best = cand;
                v = w;
                shrunk = true;
                break;
            }
        }
        if !shrunk {
            return (best, v);
        }
    }
}

struct Found {
    seed: u64,
    obj: Object,
    count: u64,
    first: Violation,
}

#[derive(Default)]
struct Tally {
    generated: AtomicU64,
    accepted: AtomicU64,
    violations: AtomicU64,
    features: Mutex<BTreeMap<&'static str, (u64, u64)>>,
    endings: Mutex<BTreeMap<String, (u64, u64)>>,
    rejects: Mutex<BTreeMap<&'static str, u64>>,
    found: Mutex<BTreeMap<String, Found>>,
}

fn section_for(seed: u64) -> &'static str {
    if seed.is_multiple_of(3) {
        "net/isend"
    } else {
        "tuner"
    }
}

fn one(seed: u64, t: &Tally) {
    let g = soundgen::program(seed, section_for(seed));
    if std::env::var_os("SOUNDNESS_TRACE").is_some() {
        eprintln!("seed {seed:#x}\n{}", listing(&g.obj.programs[0].insns));
    }
    t.generated.fetch_add(1, Ordering::Relaxed);
    let res = match verdict(&g.obj, seed) {
        Verdict::Rejected(k) => {
            *t.rejects.lock().unwrap().entry(k).or_default() += 1;
            Ok(false)
        }
        Verdict::Sound => Ok(true),
        Verdict::Unsound(v) => Err(v),
    };
    let accepted = match &res {
        Ok(a) => *a,
        Err(v) => v.class != "verifier panic",
    };
    if accepted {
        t.accepted.fetch_add(1, Ordering::Relaxed);
    }
    {
        let mut f = t.features.lock().unwrap();
        for name in g.features.names() {
            let e = f.entry(name).or_default();
            e.0 += 1;
            e.1 += u64::from(accepted);
        }
        let mut e = t.endings.lock().unwrap();
        let x = e.entry(format!("{:?}", g.ending)).or_default();
        x.0 += 1;
        x.1 += u64::from(accepted);
    }
    if let Err(v) = res {
        t.violations.fetch_add(1, Ordering::Relaxed);
        let mut f = t.found.lock().unwrap();
        // SOUNDNESS_GROUP=features keeps one case per violation class and feature set (more
        // cases to look at after a long run); by default one per violation class.
        let key = if std::env::var("SOUNDNESS_GROUP").is_ok_and(|g| g == "features") {
            format!(
                "{} | {:?} | {}",
                v.class,
                g.ending,
                g.features.names().join(", ")
            )
        } else {
            v.class.clone()
        };
        f.entry(key).and_modify(|x| x.count += 1).or_insert(Found {
            seed,
            obj: g.obj.clone(),
            count: 1,
            first: v.clone(),
        });
    }
}

fn env_u64(names: &[&str], default: u64) -> u64 {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok()?.trim().parse().ok())
        .unwrap_or(default)
}

#[test]
fn accepted_programs_are_sound() {
    let cases = env_u64(&["SOUNDNESS_CASES", "PROPTEST_CASES"], 6000);
    let base = env_u64(&["SOUNDNESS_SEED"], 0x500d_5eed);
    let t = Tally::default();
    let threads = env_u64(&["SOUNDNESS_THREADS"], 0);
    let threads = if threads > 0 {
        threads
    } else {
        std::thread::available_parallelism().map_or(2, |n| n.get() as u64)
    };
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for w in 0..threads {
            let t = &t;
            s.spawn(move || {
                let mut k = w;
                while k < cases {
                    one(base.wrapping_add(k), t);
                    k += threads;
                }
            });
        }
    });
    let generated = t.generated.load(Ordering::Relaxed);
    let accepted = t.accepted.load(Ordering::Relaxed);
    let violations = t.violations.load(Ordering::Relaxed);
    println!(
        "soundness: {generated} programs generated, {accepted} accepted ({:.1}%), {accepted} run, {violations} violations ({:.1}% accepted and sound), {:.1} s (seed base {base:#x})",
        100.0 * accepted as f64 / generated.max(1) as f64,
        100.0 * (accepted - violations) as f64 / generated.max(1) as f64,
        t0.elapsed().as_secs_f64()
    );
    for (name, (n, a)) in t.features.lock().unwrap().iter() {
        println!("  {name:32} {n:7} generated {a:7} accepted");
    }
    for (name, (n, a)) in t.endings.lock().unwrap().iter() {
        println!("  ending {name:25} {n:7} generated {a:7} accepted");
    }
    for (k, n) in t.rejects.lock().unwrap().iter() {
        println!("  rejected {k:30} {n:7}");
    }
    let found = t.found.lock().unwrap();
    let mut report = String::new();
    for (class, f) in found.iter() {
        let (min, v) = minimize(&f.obj, f.seed, &f.first);
        let p = &min.programs[0];
        report += &format!(
            "\n=== {class}: {} programs (first: seed {:#x}, {} insns, minimised to {})\n{}\n{}\n{}\n",
            f.count,
            f.seed,
            f.obj.programs[0].insns.len(),
            p.insns.len(),
            v.detail,
            listing(&p.insns),
            literal(&p.section, &p.insns)
        );
    }
    println!("{report}");
    assert!(
        accepted * 100 >= generated * 30,
        "only {accepted}/{generated} accepted: the property would be vacuous"
    );
    assert_eq!(violations, 0, "unsound verifier:{report}");
}

#[test]
fn the_generator_covers_every_weak_spot() {
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut endings = BTreeMap::new();
    let mut lens = vec![];
    for s in 0..2000u64 {
        let g = soundgen::program(s, section_for(s));
        for n in g.features.names() {
            *seen.entry(n).or_default() += 1;
        }
        *endings.entry(format!("{:?}", g.ending)).or_insert(0u64) += 1;
        lens.push(g.obj.programs[0].insns.len());
    }
    let all = soundgen::Features {
        spill_ptr: true,
        misaligned: true,
        partial: true,
        atomic_stack: true,
        atomic_value: true,
        ptr_sub: true,
        alu32_ptr: true,
        helper_ptr_buf: true,
        rodata_ptr: true,
        bpf_call: true,
        edge_jump: true,
        tripwire: true,
        loops: true,
        narrow_fill: true,
    };
    for n in all.names() {
        assert!(seen.get(n).copied().unwrap_or(0) >= 20, "{n}: {seen:?}");
    }
    for e in [
        Ending::Plain,
        Ending::FallIntoSub,
        Ending::CondJumpLast,
        Ending::IntoLddw,
        Ending::JumpToLen,
        Ending::OddCall,
    ] {
        assert!(
            endings.contains_key(&format!("{e:?}")),
            "{e:?}: {endings:?}"
        );
    }
    lens.sort();
    let median = lens[lens.len() / 2];
    assert!((5..=60).contains(&median), "median length {median}");
}

/// Minimal programs the fuzzer found against the verifier of 2026-12 (one per class of bug),
/// run through the same check: each must be rejected, or accepted and sound.
type Raw = &'static [(u8, u8, u8, i16, i32)];
const REGRESSIONS: &[(&str, &str, Raw)] = &[
    (
        // The slot still "holds" the context pointer after xchg put 8 in it: the load through
        // it reads address 0x18.
        "atomic on a stack slot holding a spilled pointer",
        "tuner",
        &[
            (0x7b, 10, 1, -8, 0),   // *(u64 *)(r10 -8) = r1
            (0xb7, 5, 0, 0, 8),     // r5 = 8
            (0xdb, 10, 5, -8, 225), // r5 = xchg((u64 *)(r10 -8), r5)
            (0x79, 0, 10, -8, 0),   // r0 = *(u64 *)(r10 -8)
            (0x79, 0, 0, 16, 0),    // r0 = *(u64 *)(r0 +16)
            (0x95, 0, 0, 0, 0),     // exit
        ],
    ),
    (
        // The slot "still holds" 0 after the xor: the branch is believed decided and the NULL
        // load behind it runs.
        "atomic on a stack slot holding a spilled constant",
        "net/isend",
        &[
            (0xb7, 9, 0, 0, 0),      // r9 = 0
            (0xb7, 5, 0, 0, 0),      // r5 = 0
            (0x7b, 10, 5, -96, 0),   // *(u64 *)(r10 -96) = r5
            (0xb7, 4, 0, 0, -1),     // r4 = -1
            (0xdb, 10, 4, -96, 160), // lock xor *(u64 *)(r10 -96), r4
            (0x79, 2, 10, -96, 0),   // r2 = *(u64 *)(r10 -96)
            (0x15, 2, 0, 1, 0),      // if r2 == 0x0 goto +1
            (0x71, 0, 0, 0, 0),      // r0 = *(u8 *)(r0 +0)
            (0xbf, 0, 9, 0, 0),      // r0 = r9
            (0x95, 0, 0, 0, 0),      // exit
        ],
    ),
    (
        // Two values of one array (keys 0 and 3) are 48 bytes apart; the verifier says 0.
        "pointer - pointer of two map values taken as 0",
        "net/isend",
        &[
            (0x62, 10, 0, -8, 0), // *(u32 *)(r10 -8) = 0
            (0x18, 1, 1, 0, 0),   // r1 = map[0] ll
            (0x00, 0, 0, 0, 0),
            (0xbf, 2, 10, 0, 0),  // r2 = r10
            (0x07, 2, 0, 0, -8),  // r2 += -8
            (0x85, 0, 0, 0, 1),   // call 1
            (0x15, 0, 0, 13, 0),  // if r0 == 0x0 goto +13
            (0xbf, 7, 0, 0, 0),   // r7 = r0
            (0x62, 10, 0, -8, 3), // *(u32 *)(r10 -8) = 3
            (0x18, 1, 1, 0, 0),   // r1 = map[0] ll
            (0x00, 0, 0, 0, 0),
            (0xbf, 2, 10, 0, 0),   // r2 = r10
            (0x07, 2, 0, 0, -8),   // r2 += -8
            (0x85, 0, 0, 0, 1),    // call 1
            (0x15, 0, 0, 5, 0),    // if r0 == 0x0 goto +5
            (0xbf, 2, 7, 0, 0),    // r2 = r7
            (0x1f, 2, 0, 0, 0),    // r2 -= r0
            (0x27, 2, 0, 0, 4096), // r2 *= 4096
            (0x0f, 7, 2, 0, 0),    // r7 += r2
            (0x71, 0, 7, 0, 0),    // r0 = *(u8 *)(r7 +0)
            (0x95, 0, 0, 0, 0),    // exit
        ],
    ),
    (
        // A pointer stored at a misaligned offset reads back as a scalar: returned to the host.
        "8-byte pointer store at a misaligned stack offset",
        "tuner",
        &[
            (0x7b, 10, 1, -47, 0), // *(u64 *)(r10 -47) = r1
            (0x79, 9, 10, -47, 0), // r9 = *(u64 *)(r10 -47)
            (0xbf, 0, 9, 0, 0),    // r0 = r9
            (0x95, 0, 0, 0, 0),    // exit
        ],
    ),
    (
        // One byte of a spilled pointer overwritten: the other seven read back as a scalar.
        "partial overwrite of a spilled pointer",
        "tuner",
        &[
            (0x7b, 10, 1, -8, 0), // *(u64 *)(r10 -8) = r1
            (0x72, 10, 0, -1, 0), // *(u8 *)(r10 -1) = 0
            (0x79, 0, 10, -8, 0), // r0 = *(u64 *)(r10 -8)
            (0x95, 0, 0, 0, 0),   // exit
        ],
    ),
    (
        // The key buffer holds the spilled context pointer: it becomes a key of a shared map.
        "spilled pointer as a map_update_elem key",
        "tuner",
        &[
            (0x7b, 10, 1, -48, 0),  // *(u64 *)(r10 -48) = r1
            (0x7a, 10, 0, -64, 27), // *(u64 *)(r10 -64) = 27
            (0x7a, 10, 0, -56, 14), // *(u64 *)(r10 -56) = 14
            (0x18, 1, 1, 0, 1),     // r1 = map[1] ll
            (0x00, 0, 0, 0, 0),
            (0xbf, 2, 10, 0, 0),  // r2 = r10
            (0x07, 2, 0, 0, -48), // r2 += -48
            (0xbf, 3, 10, 0, 0),  // r3 = r10
            (0x07, 3, 0, 0, -64), // r3 += -64
            (0xb7, 4, 0, 0, 0),   // r4 = 0
            (0x85, 0, 0, 0, 2),   // call 2
            (0x95, 0, 0, 0, 0),   // exit
        ],
    ),
    (
        // `lddw src=1` to .rodata makes it a map argument: map_update_elem rewrites constants.
        ".rodata map pointer accepted by map_update_elem",
        "tuner",
        &[
            (0xbf, 2, 10, 0, 0),   // r2 = r10
            (0x62, 10, 0, -16, 0), // *(u32 *)(r10 -16) = 0
            (0x7a, 10, 0, -64, 0), // *(u64 *)(r10 -64) = 0
            (0x7a, 10, 0, -56, 0), // *(u64 *)(r10 -56) = 0
            (0x18, 1, 1, 0, 3),    // r1 = map[3] ll
            (0x00, 0, 0, 0, 0),
            (0x07, 2, 0, 0, -16), // r2 += -16
            (0xbf, 3, 10, 0, 0),  // r3 = r10
            (0x07, 3, 0, 0, -64), // r3 += -64
            (0xb7, 4, 0, 0, 0),   // r4 = 0
            (0x85, 0, 0, 0, 2),   // call 2
            (0x95, 0, 0, 0, 0),   // exit
        ],
    ),
    (
        // The main program's last instruction is a call; it then runs into the subprogram.
        "main program falling through into a subprogram",
        "tuner",
        &[
            (0x85, 0, 1, 0, 0), // call pc+0
            (0xb7, 0, 0, 0, 5), // r0 = 5
            (0x95, 0, 0, 0, 0), // exit
        ],
    ),
    (
        // Code 0x8d (call with the X bit) is taken for a helper call.
        "reserved bits in a call",
        "tuner",
        &[
            (0x62, 10, 0, -8, 0), // *(u32 *)(r10 -8) = 0
            (0x18, 1, 1, 0, 0),   // r1 = map[0] ll
            (0x00, 0, 0, 0, 0),
            (0xbf, 2, 10, 0, 0), // r2 = r10
            (0x07, 2, 0, 0, -8), // r2 += -8
            (0x8d, 0, 0, 0, 1),  // call 1 (0x8d)
            (0xb7, 0, 0, 0, 1),  // r0 = 1
            (0x95, 0, 0, 0, 0),  // exit
        ],
    ),
    (
        // The not-taken side of the last instruction is pc 7 = len: the verifier indexes it.
        "conditional jump as the last instruction",
        "tuner",
        &[
            (0x62, 10, 0, -8, 0), // *(u32 *)(r10 -8) = 0
            (0x18, 1, 1, 0, 0),   // r1 = map[0] ll
            (0x00, 0, 0, 0, 0),
            (0xbf, 2, 10, 0, 0), // r2 = r10
            (0x07, 2, 0, 0, -8), // r2 += -8
            (0x85, 0, 0, 0, 1),  // call 1
            (0x15, 0, 0, -1, 0), // if r0 == 0x0 goto -1
        ],
    ),
];

fn regression_object(section: &str, raw: Raw) -> Object {
    Object {
        programs: vec![policy_object::Program {
            name: "regression".into(),
            section: section.into(),
            insns: raw
                .iter()
                .map(|&(code, dst, src, off, imm)| insn(code, dst, src, off, imm))
                .collect(),
            lines: vec![],
        }],
        maps: soundgen::maps(),
    }
}

#[test]
fn regressions_are_rejected_or_sound() {
    let mut bad = vec![];
    for (k, (name, section, raw)) in REGRESSIONS.iter().enumerate() {
        let obj = regression_object(section, raw);
        if std::env::var_os("SOUNDNESS_WHY").is_some() {
            let infos = policy_verifier::map_infos(&obj.maps);
            if let Ok(Err(e)) =
                quietly(|| policy_verifier::verify(&obj.programs[0], &infos, Limits::default()))
            {
                eprintln!("{name}: rejected: {e}");
            }
        }
        if let Err(v) = check_any(&obj, k as u64) {
            bad.push(format!(
                "{name}: {}: {}\n{}",
                v.class,
                v.detail.lines().next().unwrap_or(""),
                listing(&obj.programs[0].insns)
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} regressions unsound:\n\n{}",
        bad.len(),
        REGRESSIONS.len(),
        bad.join("\n\n")
    );
}

#[test]
fn mutants_never_panic_the_verifier_the_loader_or_the_jit() {
    // Accepted mutants are loaded for the JIT (translated and mapped, not run: the soundness
    // property above is where programs run).
    let cases = env_u64(&["SOUNDNESS_MUTANTS", "PROPTEST_CASES"], 20000);
    let base = env_u64(&["SOUNDNESS_SEED"], 0x500d_5eed) ^ 0x6d75_7461;
    let mut panics = vec![];
    let mut loaded = 0;
    for k in 0..cases {
        let seed = base.wrapping_add(k);
        let mut obj = soundgen::program(seed, section_for(seed)).obj;
        let mut r = Rng(seed);
        let insns = &mut obj.programs[0].insns;
        for _ in 0..1 + r.below(3) {
            let at = r.below(insns.len() as u64) as usize;
            let old = insns[at];
            let bits = r.next();
            insns[at] = match bits % 6 {
                0 => Insn {
                    imm: (bits >> 8) as i32,
                    ..old
                },
                1 => Insn {
                    off: (bits >> 8) as i16,
                    ..old
                },
                2 => Insn {
                    dst: ((bits >> 8) % 16) as u8,
                    ..old
                },
                3 => Insn {
                    src: ((bits >> 8) % 16) as u8,
                    ..old
                },
                4 => Insn {
                    code: (bits >> 8) as u8,
                    ..old
                },
                _ => Insn::decode(&(bits >> 3).to_le_bytes()),
            };
        }
        let infos = policy_verifier::map_infos(&obj.maps);
        let p = &obj.programs[0];
        match quietly(|| policy_verifier::verify(p, &infos, opts(Tier::Jit).limits).is_ok()) {
            Err(e) => panics.push(format!(
                "verifier panicked ({}) on:\n{}",
                panic_text(&e),
                listing(&p.insns)
            )),
            Ok(false) => {}
            Ok(true) => {
                let reg = registry();
                match quietly(|| LoadedProgram::load(&obj, None, &reg, &opts(Tier::Jit)).is_ok()) {
                    Err(e) => panics.push(format!(
                        "loading for the JIT panicked ({}) on:\n{}",
                        panic_text(&e),
                        listing(&p.insns)
                    )),
                    Ok(ok) => loaded += u64::from(ok),
                }
            }
        }
    }
    println!(
        "{cases} mutants, {loaded} loaded for the JIT, {} panics",
        panics.len()
    );
    assert!(
        loaded > 0,
        "no mutant was loaded: the JIT path went untested"
    );
    panics.truncate(5);
    assert!(
        panics.is_empty(),
        "panics (first 5):\n\n{}",
        panics.join("\n\n")
    );
}
