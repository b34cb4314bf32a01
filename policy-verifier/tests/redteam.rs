//! Red-team probes against the verifier.
use policy_object::insn::{self as op, Insn};
use policy_verifier::platform::{HOOKS, MapInfo};
use policy_verifier::scalar::{Scalar, Tnum};
use policy_verifier::{Limits, verify_insns};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^ (x >> 33)
    }
}

/// A random value "near" interesting boundaries.
fn near(r: &mut Rng, x: u64) -> u64 {
    let k = r.next() % 8;
    let d = r.next() >> (r.next() % 64);
    match k {
        0 => x.wrapping_sub(d),
        1 => x.wrapping_add(d),
        2 => x,
        3 => (x & !0xffff_ffff) | (r.next() & 0xffff_ffff),
        4 => x ^ (1 << (r.next() % 64)),
        5 => (r.next() as u32 as u64) | (x & 0xffff_ffff_0000_0000),
        6 => 0x8000_0000u64.wrapping_add(d),
        _ => r.next(),
    }
}

#[test]
fn synced_never_drops_a_member() {
    let mut r = Rng(12345);
    for _ in 0..3_000_000 {
        let x = match r.next() % 4 {
            0 => r.next(),
            1 => r.next() as u32 as u64,
            2 => (r.next() as i32 as i64) as u64,
            _ => 0x7fff_ffff + (r.next() % 3) - 1 + ((r.next() % 3) << 32),
        };
        let mut s = Scalar::UNKNOWN;
        let pick = r.next();
        if pick & 1 != 0 {
            let (a, b) = (near(&mut r, x), near(&mut r, x));
            s.umin = a.min(b).min(x);
            s.umax = a.max(b).max(x);
        }
        if pick & 2 != 0 {
            let (a, b) = (near(&mut r, x) as i64, near(&mut r, x) as i64);
            s.smin = a.min(b).min(x as i64);
            s.smax = a.max(b).max(x as i64);
        }
        if pick & 4 != 0 {
            let (a, b) = (near(&mut r, x) as u32, near(&mut r, x) as u32);
            s.u32min = a.min(b).min(x as u32);
            s.u32max = a.max(b).max(x as u32);
        }
        if pick & 8 != 0 {
            let (a, b) = (near(&mut r, x) as i32, near(&mut r, x) as i32);
            s.s32min = a.min(b).min(x as i32);
            s.s32max = a.max(b).max(x as i32);
        }
        if pick & 16 != 0 {
            let m = r.next() & r.next();
            s.tn = Tnum {
                value: x & !m,
                mask: m,
            };
        }
        let t = s.synced();
        assert!(t.contains_value(x), "x={x:#x}\n in {s:?}\n synced {t:?}");
    }
}

// ------------------------------------------------------------------ bytecode builders

fn i(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        dst,
        src,
        off,
        imm,
    }
}
fn mov(d: u8, imm: i32) -> Insn {
    i(op::ALU64 | op::MOV | op::K, d, 0, 0, imm)
}
fn movr(d: u8, s: u8) -> Insn {
    i(op::ALU64 | op::MOV | op::X, d, s, 0, 0)
}
fn mov32r(d: u8, s: u8) -> Insn {
    i(op::ALU | op::MOV | op::X, d, s, 0, 0)
}
fn alu(o: u8, d: u8, imm: i32) -> Insn {
    i(op::ALU64 | o | op::K, d, 0, 0, imm)
}
fn alu32(o: u8, d: u8, imm: i32) -> Insn {
    i(op::ALU | o | op::K, d, 0, 0, imm)
}
fn alur(o: u8, d: u8, s: u8) -> Insn {
    i(op::ALU64 | o | op::X, d, s, 0, 0)
}
fn ldx(size: u8, d: u8, s: u8, off: i16) -> Insn {
    i(op::LDX | op::MEM | size, d, s, off, 0)
}
fn stx(size: u8, d: u8, off: i16, s: u8) -> Insn {
    i(op::STX | op::MEM | size, d, s, off, 0)
}
fn st(size: u8, d: u8, off: i16, imm: i32) -> Insn {
    i(op::ST | op::MEM | size, d, 0, off, imm)
}
fn atomic(size: u8, d: u8, off: i16, s: u8, kind: i32) -> Insn {
    i(op::STX | op::ATOMIC | size, d, s, off, kind)
}
fn jmp(o: u8, d: u8, imm: i32, off: i16) -> Insn {
    i(op::JMP | o | op::K, d, 0, off, imm)
}
fn jmpr(o: u8, d: u8, s: u8, off: i16) -> Insn {
    i(op::JMP | o | op::X, d, s, off, 0)
}
fn jmp32(o: u8, d: u8, imm: i32, off: i16) -> Insn {
    i(op::JMP32 | o | op::K, d, 0, off, imm)
}
fn ja(off: i16) -> Insn {
    i(op::JMP | op::JA, 0, 0, off, 0)
}
fn call(id: i32) -> Insn {
    i(op::JMP | op::CALL, 0, 0, 0, id)
}
/// BPF-to-BPF call to `pc + 1 + rel`.
fn pcall(rel: i32) -> Insn {
    i(op::JMP | op::CALL, 0, op::PSEUDO_CALL, 0, rel)
}
fn exit() -> Insn {
    i(op::JMP | op::EXIT, 0, 0, 0, 0)
}
fn ld_map(d: u8, m: i32) -> [Insn; 2] {
    [i(op::LDDW, d, op::PSEUDO_MAP_FD, 0, m), Insn::default()]
}

const ARR: i32 = 0; // array, 4-byte key, 32-byte value

fn maps() -> Vec<MapInfo> {
    vec![
        MapInfo {
            name: "arr".into(),
            key_size: 4,
            value_size: 32,
            max_entries: 4,
            read_only: false,
            global_data: false,
        },
        MapInfo {
            name: ".rodata".into(),
            key_size: 4,
            value_size: 16,
            max_entries: 1,
            read_only: true,
            global_data: true,
        },
        MapInfo {
            name: ".data".into(),
            key_size: 4,
            value_size: 64,
            max_entries: 1,
            read_only: false,
            global_data: true,
        },
    ]
}

/// `r{d} = lookup(arr, key)`, null-checked (NULL: exit 0). Clobbers r0-r5.
fn lookup(d: u8, key: i32) -> Vec<Insn> {
    let mut v = vec![st(op::W, 10, -4, key), movr(2, 10), alu(op::ADD, 2, -4)];
    v.extend(ld_map(1, ARR));
    v.extend([
        call(1),
        movr(d, 0),
        jmp(op::JNE, d, 0, 2),
        mov(0, 0),
        exit(),
    ]);
    v
}

fn verdict(section: &str, prog: &[Insn]) -> Result<(), String> {
    let hook = HOOKS.iter().find(|h| h.section == section).unwrap();
    verify_insns(prog, hook, &maps(), Limits::default())
        .map(|_| ())
        .map_err(|e| format!("{} | {e}", e.kind()))
}

fn listing(p: &[Insn]) -> String {
    (0..p.len())
        .map(|k| format!("{k:3}: {}", op::disasm(p, k)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn cat(parts: &[&[Insn]]) -> Vec<Insn> {
    parts.iter().flat_map(|p| p.iter().copied()).collect()
}

// ------------------------------------------------------------------ pruning: value routes × sinks
//
// Two paths meet with r7 = SAFE (explored first) or r7 = BAD (explored second); r7 then
// travels a route (copies, spills, 32-bit moves, calls, ...) with extra prune points
// (`ja +0`) after every step, and reaches a sink where BAD is unsafe. If liveness wrongly
// deems the value imprecise anywhere, the BAD path is pruned against the SAFE one and the
// program is accepted.

const SUB_MARK: i32 = 0x7000_0000;

struct Sink {
    name: &'static str,
    safe: i32,
    bad: i32,
    /// The sink code using register `v` (main frame: r6 = map value, r9 = ctx).
    code: fn(u8) -> Vec<Insn>,
    main_only: bool,
}

fn sinks() -> Vec<Sink> {
    vec![
        Sink {
            name: "map offset",
            safe: 0,
            bad: 100,
            main_only: true,
            code: |v| vec![movr(1, 6), alur(op::ADD, 1, v), ldx(op::B, 0, 1, 0)],
        },
        Sink {
            name: "stack offset",
            safe: 0,
            bad: 100,
            main_only: false,
            code: |v| {
                vec![
                    st(op::DW, 10, -8, 0),
                    movr(1, 10),
                    alu(op::ADD, 1, -8),
                    alur(op::ADD, 1, v),
                    ldx(op::B, 0, 1, 0),
                ]
            },
        },
        Sink {
            name: "scalar + stack pointer",
            safe: 0,
            bad: 100,
            main_only: false,
            code: |v| {
                vec![
                    st(op::DW, 10, -8, 0),
                    movr(1, v),
                    alur(op::ADD, 1, 10),
                    ldx(op::B, 0, 1, -8),
                ]
            },
        },
        Sink {
            name: "divisor",
            safe: 1,
            bad: 0,
            main_only: false,
            code: |v| vec![mov(0, 7), alur(op::DIV, 0, v)],
        },
        Sink {
            name: "divisor32",
            safe: 1,
            bad: 0,
            main_only: false,
            code: |v| vec![mov(0, 7), i(op::ALU | op::MOD | op::X, 0, v, 0, 0)],
        },
        Sink {
            name: "branch",
            safe: 0,
            bad: 100,
            main_only: false,
            code: |v| vec![mov(0, 0), jmp(op::JNE, v, 100, 1), ldx(op::DW, 0, 10, -8)],
        },
        Sink {
            name: "ctx offset",
            safe: 0,
            bad: 100,
            main_only: true,
            code: |v| vec![movr(1, 9), alur(op::ADD, 1, v), ldx(op::W, 0, 1, 0)],
        },
        Sink {
            name: "helper key",
            safe: 0,
            bad: 100,
            main_only: true,
            code: |v| {
                let mut c = vec![movr(2, 10), alu(op::ADD, 2, -4), alur(op::ADD, 2, v)];
                c.extend(ld_map(1, ARR));
                c.extend([call(1), mov(0, 0)]);
                c
            },
        },
        Sink {
            name: "which slot (pointer or scalar)",
            safe: 8,
            bad: 0,
            main_only: true,
            code: |v| {
                vec![
                    stx(op::DW, 10, -16, 9),
                    st(op::DW, 10, -24, 0),
                    movr(1, 10),
                    alur(op::ADD, 1, v),
                    ldx(op::DW, 1, 1, -24),
                    ldx(op::W, 0, 1, 0),
                ]
            },
        },
    ]
}

/// Routes: main-frame code moving r7 to r7, and the subprograms it calls (pcall imm =
/// SUB_MARK + k calls subprogram k).
/// A route: its name, the instructions carrying r7 onward, and the subprograms it calls.
type Route = (&'static str, Vec<Insn>, Vec<Vec<Insn>>);

fn routes() -> Vec<Route> {
    let j = ja(0);
    let nop_sub = vec![mov(0, 0), j, exit()];
    vec![
        ("direct", vec![], vec![]),
        ("copy", vec![movr(8, 7), j, movr(7, 8)], vec![]),
        (
            "linked copy + branch on copy",
            vec![movr(8, 7), j, jmp(op::JGT, 8, 1000, 0), j],
            vec![],
        ),
        (
            "linked copy, use copy",
            vec![movr(8, 7), j, jmp(op::JGT, 7, 1000, 0), j, movr(7, 8), j],
            vec![],
        ),
        (
            "spill r10",
            vec![
                stx(op::DW, 10, -32, 7),
                mov(7, 0),
                j,
                ldx(op::DW, 7, 10, -32),
                j,
            ],
            vec![],
        ),
        (
            "spill r10 twice",
            vec![
                stx(op::DW, 10, -32, 7),
                j,
                ldx(op::DW, 8, 10, -32),
                j,
                stx(op::DW, 10, -40, 8),
                mov(8, 0),
                j,
                ldx(op::DW, 7, 10, -40),
                j,
            ],
            vec![],
        ),
        ("w32 move", vec![mov32r(7, 7), j], vec![]),
        (
            "alu32",
            vec![alu32(op::ADD, 7, 0), j, alu32(op::OR, 7, 0), j],
            vec![],
        ),
        (
            "shift",
            vec![alu(op::LSH, 7, 8), j, alu(op::RSH, 7, 8), j],
            vec![],
        ),
        (
            "movsx32",
            vec![i(op::ALU64 | op::MOV | op::X, 7, 7, 32, 0), j],
            vec![],
        ),
        (
            "movsx8 alu32",
            vec![i(op::ALU | op::MOV | op::X, 7, 7, 8, 0), j],
            vec![],
        ),
        (
            "neg neg",
            vec![
                i(op::ALU64 | op::NEG, 7, 0, 0, 0),
                j,
                i(op::ALU64 | op::NEG, 7, 0, 0, 0),
                j,
            ],
            vec![],
        ),
        (
            "bswap64 x2",
            vec![
                i(op::ALU64 | op::END, 7, 0, 0, 64),
                j,
                i(op::ALU64 | op::END, 7, 0, 0, 64),
                j,
            ],
            vec![],
        ),
        (
            "sum of two",
            vec![mov(8, 0), alur(op::ADD, 8, 7), j, movr(7, 8)],
            vec![],
        ),
        (
            "xor self-cancel",
            vec![movr(8, 7), alur(op::XOR, 8, 7), j, alur(op::ADD, 7, 8), j],
            vec![],
        ),
        (
            "call preserves r7",
            vec![pcall(SUB_MARK), j],
            vec![nop_sub.clone()],
        ),
        (
            "nested calls preserve r7",
            vec![pcall(SUB_MARK), j],
            vec![
                vec![j, pcall(SUB_MARK + 1), j, mov(0, 0), exit()],
                nop_sub.clone(),
            ],
        ),
        (
            "callee returns its arg",
            vec![movr(1, 7), pcall(SUB_MARK), j, movr(7, 0)],
            vec![vec![j, movr(0, 1), j, exit()]],
        ),
        (
            "callee returns via its stack",
            vec![movr(1, 7), pcall(SUB_MARK), j, movr(7, 0)],
            vec![vec![
                stx(op::DW, 10, -8, 1),
                j,
                mov(1, 0),
                ldx(op::DW, 0, 10, -8),
                exit(),
            ]],
        ),
        (
            "callee returns via callee r6",
            vec![movr(1, 7), pcall(SUB_MARK), j, movr(7, 0)],
            vec![
                vec![movr(6, 1), j, pcall(SUB_MARK + 1), j, movr(0, 6), exit()],
                nop_sub.clone(),
            ],
        ),
        (
            "callee returns callee's return",
            vec![movr(1, 7), pcall(SUB_MARK), j, movr(7, 0)],
            vec![
                vec![j, pcall(SUB_MARK + 1), j, exit()],
                vec![j, movr(0, 1), exit()],
            ],
        ),
        (
            "slot across call",
            vec![
                stx(op::DW, 10, -32, 7),
                mov(7, 0),
                pcall(SUB_MARK),
                j,
                ldx(op::DW, 7, 10, -32),
            ],
            vec![nop_sub.clone()],
        ),
        (
            "slot across call touching caller stack",
            vec![
                stx(op::DW, 10, -32, 7),
                mov(7, 0),
                movr(1, 10),
                alu(op::ADD, 1, -48),
                pcall(SUB_MARK),
                j,
                ldx(op::DW, 7, 10, -32),
            ],
            vec![vec![
                st(op::DW, 1, 0, 3),
                j,
                ldx(op::DW, 0, 1, 0),
                atomic(op::DW, 1, 0, 0, op::ATOMIC_ADD),
                mov(0, 0),
                exit(),
            ]],
        ),
        (
            "slot next to atomic",
            vec![
                stx(op::DW, 10, -32, 7),
                st(op::DW, 10, -40, 0),
                mov(1, 1),
                atomic(op::DW, 10, -40, 1, op::ATOMIC_ADD | op::FETCH),
                j,
                atomic(op::W, 10, -36, 1, op::ATOMIC_XCHG),
                j,
                ldx(op::DW, 7, 10, -32),
            ],
            vec![],
        ),
        (
            "slot next to partial writes",
            vec![
                stx(op::DW, 10, -32, 7),
                st(op::W, 10, -36, 0),
                j,
                st(op::B, 10, -41, 0),
                j,
                ldx(op::DW, 7, 10, -32),
            ],
            vec![],
        ),
        (
            "callee spills its arg into caller slot? (no: callee stack)",
            vec![
                movr(1, 7),
                movr(7, 10),
                alu(op::ADD, 7, -32),
                movr(2, 7),
                pcall(SUB_MARK),
                j,
                movr(7, 0),
            ],
            vec![vec![
                stx(op::DW, 10, -16, 1),
                j,
                st(op::DW, 2, 0, 0),
                j,
                ldx(op::DW, 0, 10, -16),
                exit(),
            ]],
        ),
        (
            "merge clamp",
            vec![jmp(op::JLE, 7, 1000, 1), mov(7, 1000), j],
            vec![],
        ),
    ]
}

fn pruning_program(
    route: &[Insn],
    subs: &[Vec<Insn>],
    sink: &[Insn],
    first: i32,
    second: i32,
) -> Vec<Insn> {
    let mut p = vec![movr(9, 1)];
    p.extend(lookup(6, 0));
    p.extend([
        mov(7, first),
        ldx(op::W, 2, 9, 20),
        jmp(op::JEQ, 2, 0, 1),
        mov(7, second),
    ]);
    p.extend(route.iter().copied());
    p.extend(sink.iter().copied());
    p.extend([mov(0, 0), exit()]);
    let mut starts = vec![];
    for s in subs {
        starts.push(p.len());
        p.extend(s.iter().copied());
    }
    for (pc, x) in p.iter_mut().enumerate() {
        if x.src == op::PSEUDO_CALL && x.code == op::JMP | op::CALL && x.imm >= SUB_MARK {
            let k = (x.imm - SUB_MARK) as usize;
            x.imm = starts[k] as i32 - pc as i32 - 1;
        }
    }
    p
}

#[test]
fn held_pruning_keeps_values_on_every_route_to_every_sink() {
    let mut bad = vec![];
    for sink in sinks() {
        for (rname, route, subs) in routes() {
            // Main-frame sink.
            let code = (sink.code)(7);
            for (first, second) in [(sink.bad, sink.safe), (sink.safe, sink.bad)] {
                let p = pruning_program(&route, &subs, &code, first, second);
                if verdict("tuner", &p).is_ok() {
                    bad.push(format!(
                        "{} via {rname} (first={first})\n{}",
                        sink.name,
                        listing(&p)
                    ));
                }
            }
            // The value handed to a subprogram whose sink uses it.
            if !sink.main_only {
                let mut r = route.clone();
                r.extend([movr(1, 7), pcall(SUB_MARK + subs.len() as i32)]);
                let mut s = subs.clone();
                let mut body = vec![ja(0), movr(3, 1), ja(0)];
                body.extend((sink.code)(3));
                body.extend([mov(0, 0), exit()]);
                s.push(body);
                for (first, second) in [(sink.bad, sink.safe), (sink.safe, sink.bad)] {
                    let p = pruning_program(&r, &s, &[], first, second);
                    if verdict("tuner", &p).is_ok() {
                        bad.push(format!(
                            "{} in callee via {rname} (first={first})\n{}",
                            sink.name,
                            listing(&p)
                        ));
                    }
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} accepted unsafe:\n{}",
        bad.len(),
        bad.join("\n\n")
    );
}

/// Sanity: the harness's programs with SAFE on both paths are accepted (else the test
/// above proves nothing).
#[test]
fn harness_programs_with_two_safe_values_are_accepted() {
    let mut rej = vec![];
    for sink in sinks() {
        for (rname, route, subs) in routes() {
            let p = pruning_program(&route, &subs, &(sink.code)(7), sink.safe, sink.safe);
            if let Err(e) = verdict("tuner", &p) {
                rej.push(format!("{} via {rname}: {e}", sink.name));
            }
        }
    }
    assert!(rej.is_empty(), "{}", rej.join("\n"));
}

// ------------------------------------------------------------------ other rules (held)

#[test]
fn held_assorted_attacks_are_rejected() {
    let gotol = |imm: i32| i(op::JMP32 | op::JA, 0, 0, 0, imm);
    let lddw = |d: u8, v: u64| {
        [
            i(op::LDDW, d, 0, 0, v as u32 as i32),
            i(0, 0, 0, 0, (v >> 32) as i32),
        ]
    };
    let cases: Vec<(&str, Vec<Insn>)> = vec![
        // A run of whole fields that includes read-only ones (reg_buff, max_channels).
        (
            "ctx 8-byte write over read-only fields",
            vec![st(op::DW, 1, 32, 0), mov(0, 0), exit()],
        ),
        (
            "ctx 8-byte write from nchannels past the last field",
            vec![st(op::DW, 1, 48, 0), mov(0, 0), exit()],
        ),
        (
            "ctx unaligned 8-byte read over two fields",
            vec![ldx(op::DW, 0, 1, 36), exit()],
        ),
        // gotol into the second half of an lddw.
        (
            "gotol into lddw",
            cat(&[&[gotol(1)], &lddw(0, 5), &[exit()]]),
        ),
        // A callee stores its frame pointer into the caller's stack through a pointer.
        (
            "callee frame pointer into caller slot",
            vec![
                movr(1, 10),
                alu(op::ADD, 1, -8),
                pcall(4),
                ldx(op::DW, 1, 10, -8),
                ldx(op::DW, 0, 1, -8),
                mov(0, 0),
                exit(),
                stx(op::DW, 1, 0, 10),
                mov(0, 0),
                exit(),
            ],
        ),
        // Pointer difference between two frames' stacks.
        (
            "fp(callee) - fp(caller)",
            vec![
                movr(1, 10),
                pcall(2),
                mov(0, 0),
                exit(),
                movr(0, 10),
                alur(op::SUB, 0, 1),
                exit(),
            ],
        ),
        (
            "movsx of a pointer",
            vec![i(op::ALU64 | op::MOV | op::X, 0, 10, 32, 0), exit()],
        ),
        (
            "sign-extending read of a spilled pointer",
            vec![
                stx(op::DW, 10, -8, 1),
                i(op::LDX | op::MEMSX | op::W, 0, 10, -8, 0),
                exit(),
            ],
        ),
        (
            "cmpxchg with a pointer in r0",
            vec![
                st(op::DW, 10, -8, 0),
                movr(0, 10),
                mov(2, 0),
                atomic(op::DW, 10, -8, 2, op::ATOMIC_CMPXCHG),
                mov(0, 0),
                exit(),
            ],
        ),
        (
            "xchg a pointer into the stack",
            vec![
                st(op::DW, 10, -8, 0),
                movr(2, 1),
                atomic(op::DW, 10, -8, 2, op::ATOMIC_XCHG),
                mov(0, 0),
                exit(),
            ],
        ),
        // A loop whose only changing register is dead: it can spin forever on a context
        // field that is 0.
        (
            "loop with a dead counter",
            vec![
                mov(6, 0),
                alu(op::ADD, 6, 1),
                ldx(op::W, 2, 1, 20),
                jmp(op::JEQ, 2, 0, -3),
                mov(0, 0),
                exit(),
            ],
        ),
        // Comparing a pointer with a non-zero number.
        (
            "pointer compared with 1",
            vec![mov(0, 0), jmp(op::JEQ, 1, 1, 0), exit()],
        ),
        (
            "pointer jset",
            vec![mov(0, 0), i(op::JMP | op::JSET | op::K, 1, 0, 0, 1), exit()],
        ),
        // Pointer into .rodata written through a lookup-formed value pointer.
        ("rodata via lookup", {
            let mut v = vec![st(op::W, 10, -4, 0), movr(2, 10), alu(op::ADD, 2, -4)];
            v.extend(ld_map(1, 1));
            v.extend([
                call(1),
                jmp(op::JEQ, 0, 0, 1),
                st(op::W, 0, 0, 1),
                mov(0, 0),
                exit(),
            ]);
            v
        }),
        // Variable-offset stack write, then a helper reads the maybe-unwritten bytes.
        ("variable write then helper key", {
            let mut v = vec![
                ldx(op::W, 3, 1, 20),
                alu(op::AND, 3, 4),
                movr(2, 10),
                alu(op::ADD, 2, -8),
                alur(op::ADD, 2, 3),
                st(op::B, 2, 0, 1),
                movr(2, 10),
                alu(op::ADD, 2, -8),
            ];
            v.extend(ld_map(1, ARR));
            v.extend([call(1), mov(0, 0), exit()]);
            v
        }),
        // A stack pointer near the ±2^29 limit wrapping back into range.
        (
            "offset limit",
            vec![
                movr(2, 10),
                alu(op::ADD, 2, (1 << 29) - 8),
                alu(op::ADD, 2, (1 << 29) - 8),
                ldx(op::B, 0, 2, 0),
                exit(),
            ],
        ),
        // Equality with a valid pointer of another map makes the lookup non-NULL, fine; but
        // equality with a *scalar* that happens to be the pointer must not.
        ("lookup compared with a scalar copy", {
            let mut v = vec![
                st(op::DW, 10, -16, 0),
                st(op::W, 10, -4, 0),
                movr(2, 10),
                alu(op::ADD, 2, -4),
            ];
            v.extend(ld_map(1, ARR));
            v.extend([
                call(1),
                ldx(op::DW, 3, 10, -16),
                jmpr(op::JEQ, 0, 3, 2),
                mov(0, 0),
                exit(),
                ldx(op::B, 0, 0, 0),
                exit(),
            ]);
            v
        }),
        // JMP32 refinement of an unknown 64-bit value.
        ("jmp32 then 64-bit map offset", {
            let mut v = vec![movr(9, 1)];
            v.extend(lookup(6, 0));
            v.extend([
                ldx(op::DW, 2, 9, 0),
                jmp32(op::JGT, 2, 7, 3),
                alur(op::ADD, 6, 2),
                ldx(op::B, 0, 6, 0),
                exit(),
                mov(0, 0),
                exit(),
            ]);
            v
        }),
    ];
    let mut bad = vec![];
    for (name, p) in &cases {
        if let Err(e) = verdict("tuner", p) {
            eprintln!("{name}: {e}");
        } else {
            bad.push(format!("{name}\n{}", listing(p)));
        }
    }
    assert!(bad.is_empty(), "accepted unsafe:\n{}", bad.join("\n\n"));
}
