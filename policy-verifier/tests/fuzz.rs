//! Fuzzing as properties (bounded in CI; `scripts/fuzz.sh` runs them long): hostile objects
//! never panic the loader, and hostile bytecode never panics or hangs the verifier. Each call
//! runs under `catch_unwind`, and a panic fails the test with the input that caused it.
//!
//! Hostile bytecode comes three ways: random words; plausible instructions with the edges
//! forced (a conditional jump or an `lddw` as the last instruction, jumps to `len` and beyond,
//! calls out of range or into an `lddw`, huge offsets and immediates, registers 11-15); and
//! mutants of the shipped policies' programs.

use policy_object::insn::build::{call_local, exit, insn, ja, jmp_imm, jmp32_imm, ldx, st};
use policy_object::insn::{self as op, Insn};
use policy_object::{MapDef, Object};
use policy_verifier::platform::{HOOKS, MapInfo};
use policy_verifier::{Limits, map_infos, verify, verify_insns};
use proptest::prelude::*;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::OnceLock;

fn corpus() -> &'static Vec<Vec<u8>> {
    static C: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    C.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies");
        let mut v = vec![];
        for dir in ["src", "safe", "unsafe"] {
            let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
                .expect("run policies/build.sh")
                .flatten()
                .map(|e| e.path())
                .collect();
            files.sort();
            for f in files {
                v.push(std::fs::read(f).unwrap());
            }
        }
        v
    })
}

/// A program of the corpus: instructions, its object's maps, its section.
type CorpusProgram = (Vec<Insn>, Vec<MapInfo>, String);

/// Every program of the corpus, with its object's maps.
fn corpus_programs() -> &'static Vec<CorpusProgram> {
    static P: OnceLock<Vec<CorpusProgram>> = OnceLock::new();
    P.get_or_init(|| {
        let mut v = vec![];
        for bytes in corpus() {
            if let Ok(o) = Object::parse(bytes) {
                let maps = map_infos(&o.maps);
                for p in o.programs {
                    v.push((p.insns, maps.clone(), p.section));
                }
            }
        }
        v
    })
}

fn limits() -> Limits {
    // A smaller budget keeps each case quick; exhaustion is itself a verdict.
    Limits {
        max_processed: 50_000,
        ..Limits::default()
    }
}

fn maps() -> Vec<MapInfo> {
    let m = |name: &str, k, v, n, ro, g| MapInfo {
        name: name.into(),
        key_size: k,
        value_size: v,
        max_entries: n,
        read_only: ro,
        scope: if ro {
            policy_object::Scope::Config
        } else {
            policy_object::Scope::Local
        },
        global_data: g,
        array: false,
    };
    vec![
        m("m", 4, 16, 4, false, false),
        m("h", 8, 8, 8, false, false),
        m(".rodata", 4, 24, 1, true, true),
        m(".bss", 4, 8, 1, false, true),
    ]
}

fn listing(insns: &[Insn]) -> String {
    insns
        .iter()
        .enumerate()
        .map(|(k, i)| {
            format!(
                "{k:3}: {:02x} dst={} src={} off={} imm={}  {}",
                i.code,
                i.dst,
                i.src,
                i.off,
                i.imm,
                op::disasm(insns, k)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f` under catch_unwind, without the panic message on stderr (the test reports it, with
/// the input).
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

/// Verifies under catch_unwind: Err(message) if the verifier panicked.
fn no_panic(insns: &[Insn], hook: usize, maps: &[MapInfo]) -> Result<(), String> {
    let hook = &HOOKS[hook % HOOKS.len()];
    quietly(|| verify_insns(insns, hook, maps, limits()).is_ok())
        .map(|_| ())
        .map_err(|e| {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!(
                "verifier panicked ({msg}) for hook {} on:\n{}",
                hook.section,
                listing(insns)
            )
        })
}

const CODES: &[u8] = &[
    op::ALU64 | op::ADD | op::K,
    op::ALU64 | op::MOV | op::X,
    op::ALU64 | op::MOV | op::K,
    op::ALU | op::ADD | op::X,
    op::ALU64 | op::ARSH | op::X,
    op::ALU | op::END | op::X,
    op::ALU64 | op::DIV | op::X,
    op::LDX | op::MEM | op::DW,
    op::LDX | op::MEM | op::B,
    op::STX | op::MEM | op::DW,
    op::STX | op::MEM | op::W,
    op::ST | op::MEM | op::H,
    op::STX | op::ATOMIC | op::DW,
    op::STX | op::ATOMIC | op::W,
    op::LDDW,
    op::JMP | op::JA,
    op::JMP | op::JEQ | op::K,
    op::JMP | op::JSGT | op::X,
    op::JMP32 | op::JLT | op::K,
    op::JMP32 | op::JA,
    op::JMP | op::CALL,
    op::JMP | op::CALL | op::X,
    op::JMP | op::EXIT,
];

/// One plausible instruction from raw randomness.
fn plausible(w: u64) -> Insn {
    let code = CODES[(w % CODES.len() as u64) as usize];
    let b = w >> 8;
    Insn {
        code,
        dst: (b & 0xf) as u8,
        src: ((b >> 4) & 0xf) as u8,
        off: match (b >> 8) & 3 {
            0 => ((b >> 10) % 16) as i16 - 8,
            1 => (b >> 10) as i16,
            2 => [i16::MIN, i16::MAX, -1, 0][((b >> 10) & 3) as usize],
            _ => -8 * ((b >> 10) % 64) as i16,
        },
        imm: match (b >> 26) & 3 {
            0 => ((b >> 28) % 16) as i32,
            1 => (b >> 28) as i32,
            2 => [i32::MIN, i32::MAX, -1, 0x100][((b >> 28) & 3) as usize],
            _ => [1, 2, 3, 5, 8, 0xe1, 0xf1, 0x41][((b >> 28) & 7) as usize],
        },
    }
}

/// Forces one edge case into `insns` (non-empty).
fn edge(insns: &mut Vec<Insn>, kind: u8, x: u64) {
    let n = insns.len();
    let at = (x % n as u64) as usize;
    let to = |pc: usize, t: i64| (t - pc as i64 - 1) as i16;
    match kind % 10 {
        // A conditional jump as the last instruction (taken or not).
        0 => {
            let off = to(n - 1, (x >> 8) as i64 % (n as i64 + 2) - 1);
            insns[n - 1] = Insn {
                code: op::JMP | op::JNE | op::K,
                dst: 0,
                src: 0,
                off,
                imm: 0,
            };
        }
        // An lddw as the last instruction (no second half).
        1 => {
            insns[n - 1] = Insn {
                code: op::LDDW,
                dst: 1,
                src: (x >> 8) as u8 % 3,
                off: 0,
                imm: (x >> 16) as i32 % 5,
            }
        }
        // A jump to len, len + 1, or -1.
        2 => {
            let t = [n as i64, n as i64 + 1, -1][((x >> 8) % 3) as usize];
            insns[at] = Insn {
                code: if x & 0x100 == 0 {
                    op::JMP | op::JA
                } else {
                    op::JMP | op::JGT | op::X
                },
                dst: 1,
                src: 2,
                off: to(at, t),
                imm: 0,
            };
        }
        // A BPF-to-BPF call out of range, to itself, into an lddw, or to len.
        3 => {
            let t =
                [n as i64, -1, at as i64, at as i64 + 2, i32::MAX as i64][((x >> 8) % 5) as usize];
            insns[at] = Insn {
                code: op::JMP | op::CALL,
                dst: 0,
                src: op::PSEUDO_CALL,
                off: 0,
                imm: (t - at as i64 - 1) as i32,
            };
        }
        // Huge offsets on a memory access.
        4 => {
            insns[at].off = [i16::MIN, i16::MAX, -512, 512][((x >> 8) & 3) as usize];
        }
        // Reserved bits of a call or exit.
        5 => {
            insns[at] = Insn {
                code: [0x8d, 0x85, 0x95, 0x9d][((x >> 8) & 3) as usize],
                dst: ((x >> 12) & 0xf) as u8,
                src: ((x >> 16) & 0xf) as u8,
                off: (x >> 20) as i16 % 4,
                imm: [1, 2, 0, -1, i32::MAX][((x >> 24) % 5) as usize],
            }
        }
        // Registers 11-15.
        6 => {
            insns[at].dst = 11 + ((x >> 8) % 5) as u8;
        }
        // A jump into the second half of an lddw.
        7 => {
            if let Some(k) = insns.iter().position(|i| i.is_lddw())
                && k > 0
            {
                let j = k - 1;
                insns[j] = Insn {
                    code: op::JMP | op::JA,
                    dst: 0,
                    src: 0,
                    off: to(j, k as i64 + 1),
                    imm: 0,
                };
            }
        }
        // Truncate to one instruction.
        8 => insns.truncate(1),
        // A map reference to a map that does not exist.
        _ => {
            insns[at] = Insn {
                code: op::LDDW,
                dst: 2,
                src: 1 + ((x >> 8) & 1) as u8,
                off: 0,
                imm: [4, -1, i32::MAX, 100][((x >> 9) & 3) as usize],
            };
        }
    }
}

/// Edge programs that have made verifiers panic; each must give a verdict.
fn edge_programs() -> Vec<Vec<Insn>> {
    // r0 unknown (a context field), so conditional jumps on it go both ways.
    let r0 = ldx(op::DW, 0, 1, 0);
    let exit = exit();
    vec![
        vec![],
        vec![r0],
        // A conditional jump as the last instruction, falling through to len.
        vec![r0, jmp_imm(op::JEQ, 0, 1, -2)],
        vec![r0, jmp32_imm(op::JNE, 0, 0, -2)],
        // An lddw without its second half.
        vec![r0, insn(op::LDDW, 1, 0, 0, 7)],
        vec![r0, insn(op::LDDW, 1, op::PSEUDO_MAP_FD, 0, 0)],
        // Jumps to len and past it.
        vec![r0, ja(1), exit],
        vec![r0, ja(i16::MAX), exit],
        vec![r0, ja(i16::MIN), exit],
        vec![r0, jmp_imm(op::JEQ, 0, 0, 1), exit],
        // Calls out of range, to themselves, to len.
        vec![r0, call_local(1), exit],
        vec![r0, call_local(-1), exit],
        vec![r0, call_local(i32::MAX), exit],
        vec![r0, call_local(i32::MIN), exit],
        vec![r0, call_local(-3), exit],
        // A call into an lddw's second half.
        vec![
            call_local(1),
            exit,
            insn(op::LDDW, 0, 0, 0, 1),
            insn(0, 0, 0, 0, 0),
            exit,
        ],
        // Reserved bits in a call.
        vec![r0, insn(0x8d, 0, 0, 0, 1), exit],
        vec![r0, insn(op::JMP | op::CALL, 0, 2, 0, 1), exit],
        // Main falls into its subprogram.
        vec![call_local(1), r0, exit],
        // Map references out of range.
        vec![insn(op::LDDW, 1, 1, 0, 99), insn(0, 0, 0, 0, 0), r0, exit],
        vec![
            insn(op::LDDW, 1, 2, 0, -1),
            insn(0, 0, 0, 0, i32::MAX),
            r0,
            exit,
        ],
        // Huge stack offsets.
        vec![st(op::DW, 10, i16::MIN, 0), r0, exit],
        vec![ldx(op::DW, 0, 10, i16::MAX), exit],
        // Atomics with unknown operations.
        vec![
            st(op::DW, 10, -8, 0),
            insn(op::STX | op::ATOMIC | op::DW, 10, 0, -8, 0x7f),
            r0,
            exit,
        ],
        // Deep recursion.
        vec![call_local(-1), exit],
    ]
}

#[test]
fn edge_programs_never_panic_the_verifier() {
    let maps = maps();
    let mut panics = vec![];
    for p in edge_programs() {
        for h in 0..HOOKS.len() {
            if let Err(e) = no_panic(&p, h, &maps) {
                panics.push(e);
                break;
            }
        }
    }
    assert!(
        panics.is_empty(),
        "{} edge programs panic the verifier:\n\n{}",
        panics.len(),
        panics.join("\n\n")
    );
}

/// Parses under catch_unwind; returns the object if it parsed.
fn parse_no_panic(bytes: &[u8]) -> Result<Option<Object>, String> {
    quietly(|| Object::parse(bytes).ok()).map_err(|_| {
        let head: String = bytes.iter().take(256).map(|b| format!("{b:02x}")).collect();
        format!("Object::parse panicked on {} bytes: {head}…", bytes.len())
    })
}

/// Cases per property: `PROPTEST_CASES` when set (`with_cases` alone would ignore it).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(1500)))]

    #[test]
    fn mutated_objects_never_panic_the_loader(pick in any::<usize>(), muts in proptest::collection::vec((any::<u32>(), any::<u8>()), 0..12), cut in any::<u32>(), do_cut in any::<bool>()) {
        let c = corpus();
        let mut bytes = c[pick % c.len()].clone();
        for (pos, b) in muts {
            let n = bytes.len();
            bytes[pos as usize % n] = b;
        }
        if do_cut {
            bytes.truncate(cut as usize % (bytes.len() + 1));
        }
        let parsed = parse_no_panic(&bytes);
        prop_assert!(parsed.is_ok(), "{}", parsed.unwrap_err());
        if let Ok(Some(o)) = parsed {
            let maps = map_infos(&o.maps);
            for p in &o.programs {
                let r = quietly(|| verify(p, &maps, limits()).is_ok());
                prop_assert!(r.is_ok(), "verifier panicked on {} of a mutated object:\n{}", p.name, listing(&p.insns));
            }
        }
    }

    #[test]
    fn mutated_elf_fields_never_panic_the_loader(pick in any::<usize>(), muts in proptest::collection::vec((any::<u32>(), any::<u64>(), 0u8..4), 1..6)) {
        // Whole 2/4/8-byte fields overwritten with extremes: offsets, sizes, counts, indices.
        let c = corpus();
        let mut bytes = c[pick % c.len()].clone();
        for (pos, v, width) in muts {
            let w = [1usize, 2, 4, 8][width as usize];
            let n = bytes.len();
            if n < w {
                continue;
            }
            let at = (pos as usize % (n - w + 1)) & !(w - 1);
            let val = match v % 4 {
                0 => u64::MAX,
                1 => 0,
                2 => n as u64 + (v >> 8) % 64,
                _ => v >> 2,
            };
            bytes[at..at + w].copy_from_slice(&val.to_le_bytes()[..w]);
        }
        let parsed = parse_no_panic(&bytes);
        prop_assert!(parsed.is_ok(), "{}", parsed.unwrap_err());
        if let Ok(Some(o)) = parsed {
            let maps = map_infos(&o.maps);
            for p in &o.programs {
                let r = quietly(|| verify(p, &maps, limits()).is_ok());
                prop_assert!(r.is_ok(), "verifier panicked on {}:\n{}", p.name, listing(&p.insns));
            }
        }
    }

    #[test]
    fn random_bytecode_never_panics_the_verifier(words in proptest::collection::vec(any::<u64>(), 1..64), hook in 0usize..7) {
        let insns: Vec<Insn> = words.iter().map(|w| {
            let mut i = Insn::decode(&w.to_le_bytes());
            // Bias towards valid registers and small offsets so the checks get deep.
            i.dst %= 11;
            i.src %= 11;
            if w >> 63 == 1 { i.off %= 8; }
            i
        }).collect();
        let r = no_panic(&insns, hook, &maps());
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn plausible_bytecode_with_edges_never_panics_the_verifier(words in proptest::collection::vec(any::<u64>(), 1..48), edges in proptest::collection::vec((any::<u8>(), any::<u64>()), 0..4), hook in 0usize..7) {
        let mut insns: Vec<Insn> = words.iter().map(|&w| plausible(w)).collect();
        for (k, x) in edges {
            edge(&mut insns, k, x);
        }
        let r = no_panic(&insns, hook, &maps());
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn mutated_policies_never_panic_the_verifier(pick in any::<usize>(), muts in proptest::collection::vec((any::<u16>(), any::<u64>()), 1..5), edges in proptest::collection::vec((any::<u8>(), any::<u64>()), 0..2)) {
        let progs = corpus_programs();
        let (insns, maps, section) = &progs[pick % progs.len()];
        let mut insns = insns.clone();
        for (at, bits) in muts {
            let i = at as usize % insns.len();
            let old = insns[i];
            insns[i] = match bits % 6 {
                0 => Insn { imm: (bits >> 8) as i32, ..old },
                1 => Insn { off: (bits >> 8) as i16, ..old },
                2 => Insn { dst: ((bits >> 8) % 16) as u8, ..old },
                3 => Insn { src: ((bits >> 8) % 16) as u8, ..old },
                4 => Insn { code: (bits >> 8) as u8, ..old },
                _ => plausible(bits >> 3),
            };
        }
        for (k, x) in edges {
            edge(&mut insns, k, x);
        }
        let hook = HOOKS.iter().position(|h| h.section == section).unwrap_or(0);
        let r = no_panic(&insns, hook, maps);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

#[test]
fn map_infos_of_hostile_definitions_do_not_panic() {
    // Map definitions as a hostile object could declare them.
    let defs: Vec<MapDef> = [0u32, 1, 4, u32::MAX]
        .iter()
        .map(|&s| MapDef {
            name: String::new(),
            kind: policy_object::MapKind::Hash,
            key_size: s,
            value_size: s,
            max_entries: s,
            flags: u32::MAX,
            initial: Some(vec![]),
            read_only: s == 1,
            scope: if s == 1 {
                policy_object::Scope::Config
            } else {
                policy_object::Scope::Local
            },
            source: None,
            reduce: policy_object::Reduce::Sum,
        })
        .collect();
    let maps = map_infos(&defs);
    let prog = vec![
        Insn {
            code: op::LDDW,
            dst: 1,
            src: 2,
            off: 0,
            imm: 3,
        },
        Insn {
            code: 0,
            dst: 0,
            src: 0,
            off: 0,
            imm: i32::MAX,
        },
        Insn {
            code: op::LDX | op::MEM | op::DW,
            dst: 0,
            src: 1,
            off: 0,
            imm: 0,
        },
        Insn {
            code: op::JMP | op::EXIT,
            ..Insn::default()
        },
    ];
    for h in 0..HOOKS.len() {
        let r = no_panic(&prog, h, &maps);
        assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}
