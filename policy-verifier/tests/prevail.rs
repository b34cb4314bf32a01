//! A differential oracle: every policy object in target/policies/{src,safe,unsafe} and a
//! bounded number of generated programs go through our verifier and through PREVAIL (the
//! `prevail` crate, an abstract-interpretation eBPF verifier) configured as an ncclbpf
//! platform (tests/prevail/platform.rs). Each program lands in one of four classes; a
//! program WE accept and PREVAIL rejects fails the test unless ALLOWED explains it.
//!
//! `NCCLBPF_PREVAIL_CASES` (default 200) sets how many programs are generated,
//! `NCCLBPF_PREVAIL_SEED` the first seed. See policy-verifier/PREVAIL.md.

#[path = "prevail/generator.rs"]
mod generator;
#[path = "prevail/platform.rs"]
mod platform;

use policy_object::insn::build::{alu64_imm, alu64_reg, exit, ja, jmp_imm, ldx, mov64_imm};
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, Object, Program};
use policy_verifier::{Limits, map_infos};
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A check on a program's instructions and the instruction a PREVAIL error is at.
type Shape = fn(&[Insn], Option<usize>) -> bool;

/// A difference in the dangerous direction (we accept, PREVAIL rejects) that is understood.
/// A program is allowed when EVERY error PREVAIL reports for it matches an entry.
struct Allowed {
    /// `dir/name` of a corpus object, or `gen` for any generated program.
    program: &'static str,
    /// A piece of PREVAIL's error message.
    prevail_says: &'static str,
    /// For generated programs: a check, on the instructions and the instruction PREVAIL's
    /// error is at, that the program has the shape the explanation is about (so an entry
    /// cannot swallow a new kind of difference that happens to print the same message).
    shape: Option<Shape>,
    /// Why the program is safe and why PREVAIL cannot prove it.
    why: &'static str,
}

/// Reproducers for the PREVAIL behaviour each entry relies on are in PREVAIL.md.
const ALLOWED: &[Allowed] = &[
    Allowed {
        program: "safe/bounds32",
        prevail_says: "Lower bound must be at least 0",
        shape: None,
        why: "`r1 = *(u32 *)(ctx +20); if w1 > 7 goto out; r1 <<= 3; r2 = r0 + r1`: r1 is a \
              zero-extended 32-bit load, so the JMP32 bound is a 64-bit bound (0..7); PREVAIL \
              does not refine the 64-bit register from a 32-bit comparison (as for div_checked)",
    },
    Allowed {
        program: "safe/signed32_cmp",
        prevail_says: "Lower bound must be at least 0",
        shape: None,
        why: "`if w1 s< 0` / `if w1 s> 6` bound the low 32 bits to 0..6, then `r1 <<= 32; r1 \
              s>>= 32` sign-extends them: the index is 0..6. PREVAIL does not refine from the \
              JMP32 compares and notes 'arsh32 is not allowed'",
    },
    Allowed {
        program: "safe/v4_idioms",
        prevail_says: "Possible division by zero (r2 != 0)",
        shape: None,
        why: "r2 is a sign-extending 32-bit load (`*(s32 *)`) tested by `if w2 == 0`: a \
              sign-extended value is zero exactly when its low 32 bits are, so the 64-bit \
              `s/=` cannot divide by zero; PREVAIL does not refine from the JMP32 test",
    },
    Allowed {
        program: "safe/ptr_eq_nonnull",
        prevail_says: "Cannot subtract pointers to non-singleton regions",
        shape: None,
        why: "the program compares two lookup results for equality (`if v2 == v1`); PREVAIL \
              models a pointer comparison as a subtraction and refuses it for map-value (shared) \
              regions. Equality reveals no address; ordered compares of such pointers are \
              rejected by us too",
    },
    Allowed {
        program: "safe/loop64_branchy",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "`for (int i = 0; i < 64; i++)` compiles to an equality exit (`if r2 == 0x40`), \
              which PREVAIL's widened intervals cannot use to bound the loop (as for loop_const)",
    },
    Allowed {
        program: "safe/loop64_counters",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "the same 64-iteration loop with an equality exit as loop64_branchy",
    },
    Allowed {
        program: "safe/loop_addr_counter",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "the counter is the lookup key, kept in 4 bytes of the stack and reloaded every \
              iteration, and the exit is the 32-bit `if w1 < 8`: PREVAIL does not refine a \
              register from a JMP32 compare (as for loop_var_bounded), so after widening the \
              counter is unbounded for it",
    },
    Allowed {
        program: "safe/loop_addr_two_counters",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "the same address-taken counter as loop_addr_counter, beside a second 4-byte key in \
              the same stack slot",
    },
    Allowed {
        program: "safe/loop_spills",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "a loop of at most 16 iterations (`n` clamped to 16) with more live values than \
              callee-saved registers: the counter and its bound are spilled across the two \
              lookups and reloaded each iteration, and the exit is `if r9 < r2` between two \
              reloaded registers; after widening PREVAIL keeps no relation between them, so its \
              termination check cannot bound the loop (its other checks pass)",
    },
    Allowed {
        program: "safe/bpf_to_bpf_stack",
        prevail_says: "Upper bound must be at most total_stack_size",
        shape: None,
        why: "the callee `sum` reads the caller's 4-element stack buffer in a loop bounded by \
              `i < 4 && i < n` (a 64-bit `r3 > 2` exit after the first element); after widening \
              PREVAIL loses the relation between the counter and the pointer's offset, so the \
              offset looks unbounded above; our verifier follows the loop to its exit",
    },
    Allowed {
        program: "src/net_stats:on_complete",
        prevail_says: "prevail did not finish",
        shape: None,
        why: "no verdict: PREVAIL 0.2.6's ascending (widening) iteration never reaches a fixpoint \
              on the latency-bucket loop (32-bit counter `w3 > 13` next to `r2 >>= 1` of a \
              divided value); prevail::fwd_analyzer::process_cycle has no iteration cap",
    },
    Allowed {
        program: "safe/div_checked",
        prevail_says: "Possible division by zero (r2 != 0)",
        shape: None,
        why: "r2 is a zero-extended 32-bit load tested by `if w2 == 0`, so r2 == w2 != 0; \
              PREVAIL does not refine a register from a 32-bit (JMP32) equality test with 0 \
              (the same program with `if r2 == 0` passes)",
    },
    Allowed {
        program: "safe/loop_const",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "`for (i = 0; i < 16; i++)` compiles to `w7 += 1; if w7 == 16 goto out`: an \
              equality exit. Once widened, an interval cannot exclude the single value 16, so \
              PREVAIL's termination check cannot bound the loop (its other checks pass)",
    },
    Allowed {
        program: "safe/loop_var_bounded",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "`for (i = 0; i < n; i++)` with n <= 64 compiles to `if w9 < w7`: PREVAIL does not \
              relate two registers through a 32-bit register comparison (the 64-bit `r9 < r7` \
              form passes), so the counter is unbounded for it",
    },
    Allowed {
        program: "safe/shift_loop",
        prevail_says: "Loop counter is too large",
        shape: None,
        why: "`while (x) x >>= 1;` ends within 64 iterations because of the width of x; \
              intervals and zones cannot express halving, so PREVAIL cannot bound it",
    },
    Allowed {
        program: "safe/stack_or_index:bytes",
        prevail_says: "Invalid type",
        shape: Some(or_of_two_registers_at),
        why: "`&buf[i]` into an 8-aligned stack buffer with `i < 8` compiles to `r3 = r10; r3 += -8; \
              r3 |= r1`; we take the `|` as an add (the frame pointer is 8-aligned in both \
              engines, the offset is a multiple of 8 and r1 is within [0, 7]); PREVAIL turns a \
              pointer or-ed with anything into a number (unprivileged: no pointer may meet a \
              bitwise operation) and refuses the access through it",
    },
    Allowed {
        program: "safe/stack_or_index:halves",
        prevail_says: "Invalid type",
        shape: Some(or_of_two_registers_at),
        why: "`&buf[i]` into an 8-aligned stack buffer with `i < 8` compiles to `r3 = r10; r3 += -8; \
              r3 |= r1`; we take the `|` as an add (the frame pointer is 8-aligned in both \
              engines, the offset is a multiple of 8 and r1 is within [0, 7]); PREVAIL turns a \
              pointer or-ed with anything into a number (unprivileged: no pointer may meet a \
              bitwise operation) and refuses the access through it",
    },
    Allowed {
        program: "safe/stack_or_index:tuner_bytes",
        prevail_says: "Invalid type",
        shape: Some(or_of_two_registers_at),
        why: "`&buf[i]` into an 8-aligned stack buffer with `i < 8` compiles to `r3 = r10; r3 += -8; \
              r3 |= r1`; we take the `|` as an add (the frame pointer is 8-aligned in both \
              engines, the offset is a multiple of 8 and r1 is within [0, 7]); PREVAIL turns a \
              pointer or-ed with anything into a number (unprivileged: no pointer may meet a \
              bitwise operation) and refuses the access through it",
    },
    Allowed {
        program: "gen",
        prevail_says: "Loop counter is too large",
        shape: Some(counted_loop_at),
        why: "a counted loop (`mov c, A` before it, one `add c, S` in it, `if c op B` back) that \
              exits when simulated concretely; PREVAIL's termination check fails on `!=` exits \
              and, as of 0.2.6, on counted loops whose body assigns a loop-invariant value \
              (`r8 = 7` or `r8 &= r8` in the body: the same loop with `r8 += 1` passes). \
              PREVAIL checks termination only after every other check passed",
    },
    Allowed {
        program: "gen",
        prevail_says: "prevail did not finish",
        shape: Some(has_counted_loop_32),
        why: "no verdict: PREVAIL's widening does not converge on loops with a 32-bit counter \
              (reproducer: `w4 = 10; w4 += -1; if w4 != 0 goto -2` never finishes); the loop \
              terminates when simulated concretely",
    },
    Allowed {
        program: "gen",
        prevail_says: "Possible division by zero",
        shape: Some(odd_or_before_divisor),
        why: "the divisor was or-ed with an odd constant by the instruction just before (no \
              jump lands between), so its low bit is 1; PREVAIL has no known-bits domain and \
              cannot see it",
    },
];

fn class_of(i: &Insn) -> u8 {
    i.code & 0x07
}
fn is_cond_jump(i: &Insn) -> bool {
    matches!(class_of(i), op::JMP | op::JMP32) && !matches!(i.op(), op::JA | op::CALL | op::EXIT)
}
/// Where a jump at `k` goes, if it is one.
fn jump_target(insns: &[Insn], k: usize) -> Option<usize> {
    let i = &insns[k];
    let jumps =
        matches!(class_of(i), op::JMP | op::JMP32) && !matches!(i.op(), op::CALL | op::EXIT);
    jumps.then(|| (k as i64 + 1 + i64::from(i.off)) as usize)
}

/// Whether `if v <op> imm` (32- or 64-bit) is taken.
fn taken(o: u8, v: u64, imm: i32, narrow: bool) -> bool {
    let (a, b, sa, sb) = if narrow {
        let a = v as u32;
        let b = imm as u32;
        (
            u64::from(a),
            u64::from(b),
            i64::from(a as i32),
            i64::from(imm),
        )
    } else {
        (v, imm as i64 as u64, v as i64, i64::from(imm))
    };
    match o {
        op::JEQ => a == b,
        op::JNE => a != b,
        op::JGT => a > b,
        op::JGE => a >= b,
        op::JLT => a < b,
        op::JLE => a <= b,
        op::JSGT => sa > sb,
        op::JSGE => sa >= sb,
        op::JSLT => sa < sb,
        op::JSLE => sa <= sb,
        _ => a & b != 0, // JSET
    }
}

/// The loop with head `head` is counted and exits: `mov c, A` at head-1, a back-edge
/// `if c <op> B goto head` with an immediate, one `add c, S` between them and no other write
/// of c, no call or jump between them, no jump into it from outside; simulated, the counter
/// makes it exit within 10000 iterations.
fn counted_loop_at(insns: &[Insn], head: Option<usize>) -> bool {
    let Some(head) = head.filter(|&h| h > 0 && h < insns.len()) else {
        return false;
    };
    let Some(back) = (head..insns.len())
        .find(|&k| is_cond_jump(&insns[k]) && jump_target(insns, k) == Some(head))
    else {
        return false;
    };
    let (init, j) = (insns[head - 1], insns[back]);
    let c = j.dst;
    let mov_k = |i: &Insn| {
        matches!(class_of(i), op::ALU | op::ALU64) && i.op() == op::MOV && !i.is_reg_src()
    };
    if j.is_reg_src() || !mov_k(&init) || init.dst != c {
        return false;
    }
    let mut step = None;
    for i in &insns[head..back] {
        // No call (it would clobber c) and no jump (it could skip the step).
        if matches!(class_of(i), op::JMP | op::JMP32) {
            return false;
        }
        let fetch = i.code & 0xe7 == op::STX | op::ATOMIC && i.imm & op::FETCH != 0;
        let writes_c = (i.dst == c
            && matches!(class_of(i), op::ALU | op::ALU64 | op::LDX | op::LD))
            || (fetch && i.src == c);
        if writes_c {
            let add_k =
                matches!(class_of(i), op::ALU | op::ALU64) && i.op() == op::ADD && !i.is_reg_src();
            if !add_k || step.is_some() {
                return false;
            }
            step = Some(*i);
        }
    }
    // Entered only through `mov c, A`: no jump from outside lands inside, head included.
    let inside = head..=back;
    if (0..insns.len())
        .any(|k| !inside.contains(&k) && jump_target(insns, k).is_some_and(|t| inside.contains(&t)))
    {
        return false;
    }
    let Some(step) = step else {
        return false;
    };
    let wrap = |v: u64, alu32: bool| if alu32 { u64::from(v as u32) } else { v };
    let mut v = wrap(init.imm as i64 as u64, class_of(&init) == op::ALU);
    let narrow = class_of(&j) == op::JMP32;
    for _ in 0..10_000 {
        v = wrap(
            v.wrapping_add(step.imm as i64 as u64),
            class_of(&step) == op::ALU,
        );
        if !taken(j.op(), v, j.imm, narrow) {
            return true;
        }
    }
    false
}

/// The program has a counted loop (see [`counted_loop_at`]) with a 32-bit counter.
fn has_counted_loop_32(insns: &[Insn], _: Option<usize>) -> bool {
    (0..insns.len()).any(|k| {
        class_of(&insns[k]) == op::JMP32
            && is_cond_jump(&insns[k])
            && jump_target(insns, k).is_some_and(|t| t <= k && counted_loop_at(insns, Some(t)))
    })
}

/// The division at `at` is by a register or-ed with an odd constant just before.
fn odd_or_before_divisor(insns: &[Insn], at: Option<usize>) -> bool {
    let Some(at) = at.filter(|&a| a > 0 && a < insns.len()) else {
        return false;
    };
    let (d, o) = (insns[at], insns[at - 1]);
    let alu = |i: &Insn| matches!(class_of(i), op::ALU | op::ALU64);
    alu(&d)
        && matches!(d.op(), op::DIV | op::MOD)
        && d.is_reg_src()
        && alu(&o)
        && o.op() == op::OR
        && !o.is_reg_src()
        && o.dst == d.src
        && o.imm & 1 == 1
        && !(0..insns.len()).any(|k| jump_target(insns, k) == Some(at))
}

/// The instruction at `at` is a 64-bit `rX |= rY` (the `|` of a stack pointer and an index
/// that our verifier takes as an add, see `or_is_add` in src/check/alu.rs).
fn or_of_two_registers_at(insns: &[Insn], at: Option<usize>) -> bool {
    at.and_then(|a| insns.get(a)).is_some_and(|i| {
        class_of(i) == op::ALU64 && i.op() == op::OR && i.is_reg_src() && i.dst != i.src
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    BothAccept,
    BothReject,
    /// We accept, PREVAIL rejects: the dangerous direction.
    OnlyWeAccept,
    /// We reject, PREVAIL accepts.
    OnlyPrevailAccepts,
}

impl Class {
    const ALL: [Class; 4] = [
        Class::BothAccept,
        Class::BothReject,
        Class::OnlyWeAccept,
        Class::OnlyPrevailAccepts,
    ];
    fn name(self) -> &'static str {
        match self {
            Class::BothAccept => "both accept",
            Class::BothReject => "both reject",
            Class::OnlyWeAccept => "we accept / prevail rejects",
            Class::OnlyPrevailAccepts => "we reject / prevail accepts",
        }
    }
}

struct Outcome {
    name: String,
    prog: Program,
    class: Class,
    ours: String,
    theirs: platform::Verdict,
}

impl Outcome {
    fn generated(&self) -> bool {
        self.name.starts_with("gen/")
    }
    /// The allow-list entry explaining PREVAIL's error `e`, if any.
    fn explains(&self, e: &(Option<usize>, String)) -> Option<&'static Allowed> {
        ALLOWED.iter().find(|a| {
            (a.program == self.name || (self.generated() && a.program == "gen"))
                && e.1.contains(a.prevail_says)
                && a.shape.is_none_or(|f| f(&self.prog.insns, e.0))
        })
    }
    /// For the dangerous class: the entries explaining every PREVAIL error, or None.
    fn allowance(&self) -> Option<Vec<&'static Allowed>> {
        self.theirs
            .errors
            .iter()
            .map(|e| self.explains(e))
            .collect()
    }
    fn theirs(&self) -> String {
        let v = &self.theirs;
        let mut s = if v.accepted {
            "accept".to_string()
        } else {
            let (at, msg) = &v.errors[0];
            let line = at
                .and_then(|i| self.prog.line_for(i))
                .map(|l| format!(" (line {}: {})", l.line, l.text.trim()))
                .unwrap_or_default();
            let more = match v.errors.len() {
                1 => String::new(),
                n => format!(" (+{} more)", n - 1),
            };
            format!("reject: {msg}{line}{more}")
        };
        if !v.notes.is_empty() {
            let _ = write!(s, " (notes: {})", v.notes);
        }
        s
    }
}

/// Where a program comes from; a child process rebuilds it from this.
#[derive(Clone)]
enum Source {
    Corpus(PathBuf, usize),
    Gen(u64),
}

impl Source {
    fn spec(&self) -> String {
        match self {
            Source::Corpus(p, i) => format!("corpus\t{}\t{i}", p.display()),
            Source::Gen(seed) => format!("gen\t{seed}"),
        }
    }
    fn parse(spec: &str) -> Source {
        let f: Vec<&str> = spec.split('\t').collect();
        match f[..] {
            ["corpus", p, i] => Source::Corpus(p.into(), i.parse().unwrap()),
            ["gen", seed] => Source::Gen(seed.parse().unwrap()),
            _ => panic!("bad job {spec:?}"),
        }
    }
    fn load(&self) -> (Program, Vec<MapDef>) {
        match self {
            Source::Corpus(p, i) => {
                let o = Object::parse(&std::fs::read(p).unwrap()).unwrap();
                (o.programs[*i].clone(), o.maps)
            }
            Source::Gen(seed) => {
                let o = generator::program(*seed);
                (o.programs[0].clone(), o.maps)
            }
        }
    }
}

const CHILD: &str = "NCCLBPF_PREVAIL_CHILD";

/// Child mode: run PREVAIL on one program, print its verdict: a `notes` line, then
/// `ACCEPT`, or one `REJECT <insn> <message>` line per error.
fn child(spec: &str) {
    let (p, maps) = Source::parse(spec).load();
    let v = platform::verify(&p, &maps);
    let flat = |s: &str| s.replace(['\n', '\t'], " ");
    println!("NOTES\t-\t{}", flat(&v.notes));
    if v.accepted {
        println!("ACCEPT\t-\t");
    }
    for (at, msg) in &v.errors {
        let at = at.map_or("-".into(), |i| i.to_string());
        println!("REJECT\t{at}\t{}", flat(msg));
    }
}

/// PREVAIL's verdict, from a child process killed after `timeout`.
fn prevail_verdict(src: &Source, timeout: Duration) -> platform::Verdict {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, src.spec())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a child");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > timeout {
            let _ = c.kill();
            let _ = c.wait();
            return platform::Verdict::reject(
                format!(
                    "prevail did not finish within {} ms (no verdict)",
                    timeout.as_millis()
                ),
                None,
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut v = platform::Verdict {
        accepted: false,
        errors: vec![],
        notes: String::new(),
    };
    for line in out.lines() {
        match line.splitn(3, '\t').collect::<Vec<_>>()[..] {
            ["NOTES", _, n] => v.notes = n.to_string(),
            ["ACCEPT", ..] => v.accepted = true,
            ["REJECT", at, msg] => v.errors.push((at.parse().ok(), msg.to_string())),
            _ => {}
        }
    }
    if !v.accepted && v.errors.is_empty() {
        v.errors.push((
            None,
            format!("prevail child failed ({status}) with no verdict"),
        ));
    }
    v
}

/// Programs up to this many instructions get the base timeout; a longer one gets it once per
/// this many instructions (net_autotune's epoch program, about 1,300 instructions, takes
/// PREVAIL 1.5 to 3 s on the 2-core build machine).
const TIMEOUT_INSNS: usize = 256;

fn compare(name: &str, src: &Source, timeout: Duration) -> Outcome {
    let (prog, maps) = src.load();
    let ours = policy_verifier::verify(&prog, &map_infos(&maps), Limits::default());
    let scale = prog.insns.len().div_ceil(TIMEOUT_INSNS).max(1) as u32;
    let theirs = prevail_verdict(src, timeout * scale);
    let class = match (ours.is_ok(), theirs.accepted) {
        (true, true) => Class::BothAccept,
        (false, false) => Class::BothReject,
        (true, false) => Class::OnlyWeAccept,
        (false, true) => Class::OnlyPrevailAccepts,
    };
    Outcome {
        name: name.to_string(),
        class,
        ours: match ours {
            Ok(s) => format!("accept ({} processed)", s.processed),
            Err(e) => format!("reject [{}] at {}: {}", e.kind(), e.insn, e.reject),
        },
        theirs,
        prog,
    }
}

/// The program (around `at` when long), for the report of an unexplained difference.
fn listing(p: &Program, at: Option<usize>) -> String {
    let (lo, hi) = match at {
        Some(a) if p.insns.len() > 40 => (a.saturating_sub(24), (a + 8).min(p.insns.len())),
        _ => (0, p.insns.len()),
    };
    let mut s = String::new();
    for k in lo..hi {
        let mark = if Some(k) == at { "=>" } else { "  " };
        let _ = writeln!(
            s,
            "      {mark} {k:4}: {}",
            policy_object::insn::disasm(&p.insns, k)
        );
    }
    s
}

/// Compares every case, a few at a time (each PREVAIL run is a child process).
fn compare_all(cases: &[(String, Source)]) -> Vec<Outcome> {
    // PREVAIL verifies most of these programs in milliseconds when it finishes at all, the
    // largest in seconds (the timeout grows with a program's length: TIMEOUT_INSNS); an
    // unoptimized build is ten times slower.
    let default = if cfg!(debug_assertions) { 30_000 } else { 3000 };
    let timeout = Duration::from_millis(env_u64("NCCLBPF_PREVAIL_TIMEOUT_MS", default));
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(8);
    let next = AtomicUsize::new(0);
    let results = Mutex::new((0..cases.len()).map(|_| None).collect::<Vec<_>>());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((name, src)) = cases.get(k) else {
                        break;
                    };
                    let o = compare(name, src, timeout);
                    results.lock().unwrap()[k] = Some(o);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect()
}

/// Prints the table and the per-program list; returns the unexplained dangerous differences.
fn report(title: &str, outcomes: &[Outcome]) -> Vec<String> {
    let mut out = format!("\n== {title}: {} programs\n", outcomes.len());
    for c in Class::ALL {
        let n = outcomes.iter().filter(|o| o.class == c).count();
        let _ = writeln!(out, "  {:<30} {n:>5}", c.name());
    }
    let mut unexplained = vec![];
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by_key(|o| std::cmp::Reverse(o.class));
    let _ = writeln!(out);
    for o in sorted {
        let _ = writeln!(
            out,
            "  {:<30} {:<28} ours: {} | prevail: {}",
            o.name,
            o.class.name(),
            o.ours,
            o.theirs()
        );
        if o.class != Class::OnlyWeAccept {
            continue;
        }
        match o.allowance() {
            Some(why) => {
                let mut seen = vec![];
                for a in why {
                    if !seen.iter().any(|w: &&Allowed| std::ptr::eq(*w, a)) {
                        let _ = writeln!(out, "      ALLOWED: {}", a.why);
                        seen.push(a);
                    }
                }
            }
            None => {
                let _ = writeln!(out, "      UNEXPLAINED");
                let errors: String = o
                    .theirs
                    .errors
                    .iter()
                    .filter(|e| o.explains(e).is_none())
                    .map(|(at, m)| format!("\n    prevail: {m} (insn {at:?})"))
                    .collect();
                unexplained.push(format!(
                    "{}: ours {}; prevail: {}{errors}\n{}",
                    o.name,
                    o.ours,
                    o.theirs(),
                    listing(&o.prog, o.theirs.errors[0].0)
                ));
            }
        }
    }
    println!("{out}");
    unexplained
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn corpus() -> Vec<(String, Source)> {
    let mut v = vec![];
    for dir in ["src", "safe", "unsafe"] {
        let d = root().join("target/policies").join(dir);
        let mut files: Vec<_> = std::fs::read_dir(&d)
            .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", d.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "o"))
            .collect();
        files.sort();
        for f in files {
            let name = format!("{dir}/{}", f.file_stem().unwrap().to_string_lossy());
            // The loader's own rejections (bad ELF, ...) are not the verifiers' business;
            // corpus.rs and shipped.rs cover them.
            let Ok(o) = Object::parse(&std::fs::read(&f).unwrap()) else {
                continue;
            };
            for (k, p) in o.programs.iter().enumerate() {
                let n = if o.programs.len() == 1 {
                    name.clone()
                } else {
                    format!("{name}:{}", p.name)
                };
                v.push((n, Source::Corpus(f.clone(), k)));
            }
        }
    }
    v
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Corpus objects: no unexplained dangerous difference, and no stale allow-list entry.
fn corpus_agrees_with_prevail() -> Vec<String> {
    let cases = corpus();
    assert!(cases.len() >= 50, "only {} programs", cases.len());
    let outcomes = compare_all(&cases);
    let mut failures = report("policy objects", &outcomes);
    for a in ALLOWED.iter().filter(|a| a.program != "gen") {
        let used = outcomes.iter().any(|o| {
            o.class == Class::OnlyWeAccept
                && o.theirs
                    .errors
                    .iter()
                    .any(|e| o.explains(e).is_some_and(|x| std::ptr::eq(x, a)))
        });
        if !used {
            failures.push(format!(
                "allow-list entry {} ('{}') is no longer needed: remove it",
                a.program, a.prevail_says
            ));
        }
    }
    // An oracle that cannot say yes or no tests nothing.
    for c in [Class::BothAccept, Class::BothReject] {
        if !outcomes.iter().any(|o| o.class == c) {
            failures.push(format!("no corpus program in class '{}'", c.name()));
        }
    }
    failures
}

/// Generated programs: no unexplained dangerous difference.
fn generated_programs_agree_with_prevail() -> Vec<String> {
    let n = env_u64("NCCLBPF_PREVAIL_CASES", 200);
    let seed0 = env_u64("NCCLBPF_PREVAIL_SEED", 1);
    let cases: Vec<_> = (seed0..seed0 + n)
        .map(|s| (format!("gen/{s}"), Source::Gen(s)))
        .collect();
    let outcomes = compare_all(&cases);
    let mut failures = report("generated programs", &outcomes);
    if !failures.is_empty() {
        failures
            .push("(replay one with NCCLBPF_PREVAIL_SEED=<n> NCCLBPF_PREVAIL_CASES=1)".to_string());
    }
    if n >= 100 {
        // A generator whose programs all land on one side tests nothing.
        let both = outcomes
            .iter()
            .filter(|o| o.class == Class::BothAccept)
            .count();
        if both * 10 < outcomes.len() {
            failures.push(format!("only {both} generated programs accepted by both"));
        }
        if !outcomes.iter().any(|o| o.class == Class::BothReject) {
            failures.push("no generated program rejected by both".into());
        }
    }
    failures
}

/// The shape checks that excuse generated programs must say no to the programs they are not
/// about.
fn shape_checks_say_no() -> Vec<String> {
    let mov = |imm| mov64_imm(4, imm);
    let add = |imm| alu64_imm(op::ADD, 4, imm);
    let body = alu64_imm(op::ADD, 7, 1);
    let exit = [mov64_imm(0, 0), exit()];
    let prog = |v: &[Insn]| [v, &exit[..]].concat();
    let lt = |b| jmp_imm(op::JLT, 4, b, -3);
    let ne = |b| jmp_imm(op::JNE, 4, b, -3);
    // (what, program, loop head, whether it is a counted loop that exits)
    let ld = ldx(op::W, 4, 1, 0);
    let ja = ja(1);
    let cases = [
        (
            "counts up to 10",
            prog(&[mov(0), body, add(1), lt(10)]),
            1,
            true,
        ),
        (
            "counts down to 0 with !=",
            prog(&[mov(9), body, add(-1), ne(0)]),
            1,
            true,
        ),
        (
            "steps over its bound",
            prog(&[mov(0), body, add(2), ne(7)]),
            1,
            false,
        ),
        ("never steps", prog(&[mov(0), body, body, lt(10)]), 1, false),
        (
            "reloads its counter",
            prog(&[mov(0), ld, add(1), lt(10)]),
            1,
            false,
        ),
        (
            "is entered past its initialization",
            prog(&[ja, mov(0), body, add(1), lt(10)]),
            2,
            false,
        ),
    ];
    let mut failures = vec![];
    for (what, insns, head, expect) in cases {
        if counted_loop_at(&insns, Some(head)) != expect {
            failures.push(format!(
                "counted_loop_at: a loop that {what}: should be {expect}"
            ));
        }
    }
    let div = |pre: Insn| vec![pre, alu64_reg(op::DIV, 3, 2), mov64_imm(0, 0)];
    if !odd_or_before_divisor(&div(alu64_imm(op::OR, 2, 1)), Some(1)) {
        failures.push("odd_or_before_divisor: r2 |= 1 should pass".into());
    }
    for (what, pre) in [
        ("r2 |= 2", alu64_imm(op::OR, 2, 2)),
        ("r3 |= 1", alu64_imm(op::OR, 3, 1)),
        ("r2 += 1", alu64_imm(op::ADD, 2, 1)),
    ] {
        if odd_or_before_divisor(&div(pre), Some(1)) {
            failures.push(format!("odd_or_before_divisor: {what} should fail"));
        }
    }
    let or = |i: Insn| or_of_two_registers_at(&[i], Some(0));
    if !or(alu64_reg(op::OR, 3, 1)) {
        failures.push("or_of_two_registers_at: r3 |= r1 should pass".into());
    }
    for (what, i) in [
        ("r3 |= 1", alu64_imm(op::OR, 3, 1)),
        ("r3 += r1", alu64_reg(op::ADD, 3, 1)),
        (
            "w3 |= w1",
            policy_object::insn::build::alu32_reg(op::OR, 3, 1),
        ),
    ] {
        if or(i) {
            failures.push(format!("or_of_two_registers_at: {what} should fail"));
        }
    }
    failures
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    // Like libtest: names on the command line select tests; flags are ignored.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    type Test = fn() -> Vec<String>;
    let tests: [(&str, Test); 3] = [
        ("shape_checks_say_no", shape_checks_say_no),
        ("corpus_agrees_with_prevail", corpus_agrees_with_prevail),
        (
            "generated_programs_agree_with_prevail",
            generated_programs_agree_with_prevail,
        ),
    ];
    let mut failed = vec![];
    for (name, f) in tests {
        if !filters.is_empty() && !filters.iter().any(|x| name.contains(x.as_str())) {
            continue;
        }
        let t = Instant::now();
        let failures = f();
        let verdict = if failures.is_empty() { "ok" } else { "FAILED" };
        println!(
            "test {name} ... {verdict} ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        if !failures.is_empty() {
            failed.push(format!("{name}:\n  {}", failures.join("\n  ")));
        }
    }
    if !failed.is_empty() {
        eprintln!(
            "\nwe accept and PREVAIL rejects, unexplained (or other failures):\n{}",
            failed.join("\n")
        );
        std::process::exit(1);
    }
}
