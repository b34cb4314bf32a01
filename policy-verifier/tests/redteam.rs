//! Red-team probes against the verifier.

mod common;
use common::*;
use policy_object::insn::build::{
    alu32_imm, alu32_reg, alu64_imm, alu64_reg, atomic, bswap, call, call_local, exit, gotol, ja,
    jmp_imm, jmp_reg, jmp32_imm, ld_map, lddw, ldsx, ldx, mov32_reg, mov64_imm, mov64_reg, movsx32,
    movsx64, neg64, st, stx,
};
use policy_object::insn::{self as op, Insn};
use policy_verifier::scalar::{Scalar, Tnum};

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

// ------------------------------------------------------------------ maps, lookups, verdicts

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
            code: |v| {
                vec![
                    mov64_reg(1, 6),
                    alu64_reg(op::ADD, 1, v),
                    ldx(op::B, 0, 1, 0),
                ]
            },
        },
        Sink {
            name: "stack offset",
            safe: 0,
            bad: 100,
            main_only: false,
            code: |v| {
                vec![
                    st(op::DW, 10, -8, 0),
                    mov64_reg(1, 10),
                    alu64_imm(op::ADD, 1, -8),
                    alu64_reg(op::ADD, 1, v),
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
                    mov64_reg(1, v),
                    alu64_reg(op::ADD, 1, 10),
                    ldx(op::B, 0, 1, -8),
                ]
            },
        },
        Sink {
            name: "divisor",
            safe: 1,
            bad: 0,
            main_only: false,
            code: |v| vec![mov64_imm(0, 7), alu64_reg(op::DIV, 0, v)],
        },
        Sink {
            name: "divisor32",
            safe: 1,
            bad: 0,
            main_only: false,
            code: |v| vec![mov64_imm(0, 7), alu32_reg(op::MOD, 0, v)],
        },
        Sink {
            name: "branch",
            safe: 0,
            bad: 100,
            main_only: false,
            code: |v| {
                vec![
                    mov64_imm(0, 0),
                    jmp_imm(op::JNE, v, 100, 1),
                    ldx(op::DW, 0, 10, -8),
                ]
            },
        },
        Sink {
            name: "ctx offset",
            safe: 0,
            bad: 100,
            main_only: true,
            code: |v| {
                vec![
                    mov64_reg(1, 9),
                    alu64_reg(op::ADD, 1, v),
                    ldx(op::W, 0, 1, 0),
                ]
            },
        },
        Sink {
            name: "helper key",
            safe: 0,
            bad: 100,
            main_only: true,
            code: |v| {
                let mut c = vec![
                    mov64_reg(2, 10),
                    alu64_imm(op::ADD, 2, -4),
                    alu64_reg(op::ADD, 2, v),
                ];
                c.extend(ld_map(1, ARR));
                c.extend([call(1), mov64_imm(0, 0)]);
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
                    mov64_reg(1, 10),
                    alu64_reg(op::ADD, 1, v),
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
    let nop_sub = vec![mov64_imm(0, 0), j, exit()];
    vec![
        ("direct", vec![], vec![]),
        ("copy", vec![mov64_reg(8, 7), j, mov64_reg(7, 8)], vec![]),
        (
            "linked copy + branch on copy",
            vec![mov64_reg(8, 7), j, jmp_imm(op::JGT, 8, 1000, 0), j],
            vec![],
        ),
        (
            "linked copy, use copy",
            vec![
                mov64_reg(8, 7),
                j,
                jmp_imm(op::JGT, 7, 1000, 0),
                j,
                mov64_reg(7, 8),
                j,
            ],
            vec![],
        ),
        (
            "spill r10",
            vec![
                stx(op::DW, 10, -32, 7),
                mov64_imm(7, 0),
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
                mov64_imm(8, 0),
                j,
                ldx(op::DW, 7, 10, -40),
                j,
            ],
            vec![],
        ),
        ("w32 move", vec![mov32_reg(7, 7), j], vec![]),
        (
            "alu32",
            vec![alu32_imm(op::ADD, 7, 0), j, alu32_imm(op::OR, 7, 0), j],
            vec![],
        ),
        (
            "shift",
            vec![alu64_imm(op::LSH, 7, 8), j, alu64_imm(op::RSH, 7, 8), j],
            vec![],
        ),
        ("movsx32", vec![movsx64(7, 7, 32), j], vec![]),
        ("movsx8 alu32", vec![movsx32(7, 7, 8), j], vec![]),
        ("neg neg", vec![neg64(7), j, neg64(7), j], vec![]),
        ("bswap64 x2", vec![bswap(7, 64), j, bswap(7, 64), j], vec![]),
        (
            "sum of two",
            vec![
                mov64_imm(8, 0),
                alu64_reg(op::ADD, 8, 7),
                j,
                mov64_reg(7, 8),
            ],
            vec![],
        ),
        (
            "xor self-cancel",
            vec![
                mov64_reg(8, 7),
                alu64_reg(op::XOR, 8, 7),
                j,
                alu64_reg(op::ADD, 7, 8),
                j,
            ],
            vec![],
        ),
        (
            "call preserves r7",
            vec![call_local(SUB_MARK), j],
            vec![nop_sub.clone()],
        ),
        (
            "nested calls preserve r7",
            vec![call_local(SUB_MARK), j],
            vec![
                vec![j, call_local(SUB_MARK + 1), j, mov64_imm(0, 0), exit()],
                nop_sub.clone(),
            ],
        ),
        (
            "callee returns its arg",
            vec![mov64_reg(1, 7), call_local(SUB_MARK), j, mov64_reg(7, 0)],
            vec![vec![j, mov64_reg(0, 1), j, exit()]],
        ),
        (
            "callee returns via its stack",
            vec![mov64_reg(1, 7), call_local(SUB_MARK), j, mov64_reg(7, 0)],
            vec![vec![
                stx(op::DW, 10, -8, 1),
                j,
                mov64_imm(1, 0),
                ldx(op::DW, 0, 10, -8),
                exit(),
            ]],
        ),
        (
            "callee returns via callee r6",
            vec![mov64_reg(1, 7), call_local(SUB_MARK), j, mov64_reg(7, 0)],
            vec![
                vec![
                    mov64_reg(6, 1),
                    j,
                    call_local(SUB_MARK + 1),
                    j,
                    mov64_reg(0, 6),
                    exit(),
                ],
                nop_sub.clone(),
            ],
        ),
        (
            "callee returns callee's return",
            vec![mov64_reg(1, 7), call_local(SUB_MARK), j, mov64_reg(7, 0)],
            vec![
                vec![j, call_local(SUB_MARK + 1), j, exit()],
                vec![j, mov64_reg(0, 1), exit()],
            ],
        ),
        (
            "slot across call",
            vec![
                stx(op::DW, 10, -32, 7),
                mov64_imm(7, 0),
                call_local(SUB_MARK),
                j,
                ldx(op::DW, 7, 10, -32),
            ],
            vec![nop_sub.clone()],
        ),
        (
            "slot across call touching caller stack",
            vec![
                stx(op::DW, 10, -32, 7),
                mov64_imm(7, 0),
                mov64_reg(1, 10),
                alu64_imm(op::ADD, 1, -48),
                call_local(SUB_MARK),
                j,
                ldx(op::DW, 7, 10, -32),
            ],
            vec![vec![
                st(op::DW, 1, 0, 3),
                j,
                ldx(op::DW, 0, 1, 0),
                atomic(op::DW, op::ATOMIC_ADD, 1, 0, 0),
                mov64_imm(0, 0),
                exit(),
            ]],
        ),
        (
            "slot next to atomic",
            vec![
                stx(op::DW, 10, -32, 7),
                st(op::DW, 10, -40, 0),
                mov64_imm(1, 1),
                atomic(op::DW, op::ATOMIC_ADD | op::FETCH, 10, -40, 1),
                j,
                atomic(op::W, op::ATOMIC_XCHG, 10, -36, 1),
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
                mov64_reg(1, 7),
                mov64_reg(7, 10),
                alu64_imm(op::ADD, 7, -32),
                mov64_reg(2, 7),
                call_local(SUB_MARK),
                j,
                mov64_reg(7, 0),
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
            vec![jmp_imm(op::JLE, 7, 1000, 1), mov64_imm(7, 1000), j],
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
    let mut p = vec![mov64_reg(9, 1)];
    p.extend(lookup(6, 0));
    p.extend([
        mov64_imm(7, first),
        ldx(op::W, 2, 9, 20),
        jmp_imm(op::JEQ, 2, 0, 1),
        mov64_imm(7, second),
    ]);
    p.extend(route.iter().copied());
    p.extend(sink.iter().copied());
    p.extend([mov64_imm(0, 0), exit()]);
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
                r.extend([mov64_reg(1, 7), call_local(SUB_MARK + subs.len() as i32)]);
                let mut s = subs.clone();
                let mut body = vec![ja(0), mov64_reg(3, 1), ja(0)];
                body.extend((sink.code)(3));
                body.extend([mov64_imm(0, 0), exit()]);
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
    let cases: Vec<(&str, Vec<Insn>)> = vec![
        // A run of whole fields that includes read-only ones (reg_buff, max_channels).
        (
            "ctx 8-byte write over read-only fields",
            vec![st(op::DW, 1, 32, 0), mov64_imm(0, 0), exit()],
        ),
        (
            "ctx 8-byte write from nchannels past the last field",
            vec![st(op::DW, 1, 48, 0), mov64_imm(0, 0), exit()],
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
                mov64_reg(1, 10),
                alu64_imm(op::ADD, 1, -8),
                call_local(4),
                ldx(op::DW, 1, 10, -8),
                ldx(op::DW, 0, 1, -8),
                mov64_imm(0, 0),
                exit(),
                stx(op::DW, 1, 0, 10),
                mov64_imm(0, 0),
                exit(),
            ],
        ),
        // Pointer difference between two frames' stacks.
        (
            "fp(callee) - fp(caller)",
            vec![
                mov64_reg(1, 10),
                call_local(2),
                mov64_imm(0, 0),
                exit(),
                mov64_reg(0, 10),
                alu64_reg(op::SUB, 0, 1),
                exit(),
            ],
        ),
        ("movsx of a pointer", vec![movsx64(0, 10, 32), exit()]),
        (
            "sign-extending read of a spilled pointer",
            vec![stx(op::DW, 10, -8, 1), ldsx(op::W, 0, 10, -8), exit()],
        ),
        (
            "cmpxchg with a pointer in r0",
            vec![
                st(op::DW, 10, -8, 0),
                mov64_reg(0, 10),
                mov64_imm(2, 0),
                atomic(op::DW, op::ATOMIC_CMPXCHG, 10, -8, 2),
                mov64_imm(0, 0),
                exit(),
            ],
        ),
        (
            "xchg a pointer into the stack",
            vec![
                st(op::DW, 10, -8, 0),
                mov64_reg(2, 1),
                atomic(op::DW, op::ATOMIC_XCHG, 10, -8, 2),
                mov64_imm(0, 0),
                exit(),
            ],
        ),
        // A loop whose only changing register is dead: it can spin forever on a context
        // field that is 0.
        (
            "loop with a dead counter",
            vec![
                mov64_imm(6, 0),
                alu64_imm(op::ADD, 6, 1),
                ldx(op::W, 2, 1, 20),
                jmp_imm(op::JEQ, 2, 0, -3),
                mov64_imm(0, 0),
                exit(),
            ],
        ),
        // Comparing a pointer with a non-zero number.
        (
            "pointer compared with 1",
            vec![mov64_imm(0, 0), jmp_imm(op::JEQ, 1, 1, 0), exit()],
        ),
        (
            "pointer jset",
            vec![mov64_imm(0, 0), jmp_imm(op::JSET, 1, 1, 0), exit()],
        ),
        // Pointer into .rodata written through a lookup-formed value pointer.
        ("rodata via lookup", {
            let mut v = vec![
                st(op::W, 10, -4, 0),
                mov64_reg(2, 10),
                alu64_imm(op::ADD, 2, -4),
            ];
            v.extend(ld_map(1, 1));
            v.extend([
                call(1),
                jmp_imm(op::JEQ, 0, 0, 1),
                st(op::W, 0, 0, 1),
                mov64_imm(0, 0),
                exit(),
            ]);
            v
        }),
        // Variable-offset stack write, then a helper reads the maybe-unwritten bytes.
        ("variable write then helper key", {
            let mut v = vec![
                ldx(op::W, 3, 1, 20),
                alu64_imm(op::AND, 3, 4),
                mov64_reg(2, 10),
                alu64_imm(op::ADD, 2, -8),
                alu64_reg(op::ADD, 2, 3),
                st(op::B, 2, 0, 1),
                mov64_reg(2, 10),
                alu64_imm(op::ADD, 2, -8),
            ];
            v.extend(ld_map(1, ARR));
            v.extend([call(1), mov64_imm(0, 0), exit()]);
            v
        }),
        // A stack pointer near the ±2^29 limit wrapping back into range.
        (
            "offset limit",
            vec![
                mov64_reg(2, 10),
                alu64_imm(op::ADD, 2, (1 << 29) - 8),
                alu64_imm(op::ADD, 2, (1 << 29) - 8),
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
                mov64_reg(2, 10),
                alu64_imm(op::ADD, 2, -4),
            ];
            v.extend(ld_map(1, ARR));
            v.extend([
                call(1),
                ldx(op::DW, 3, 10, -16),
                jmp_reg(op::JEQ, 0, 3, 2),
                mov64_imm(0, 0),
                exit(),
                ldx(op::B, 0, 0, 0),
                exit(),
            ]);
            v
        }),
        // JMP32 refinement of an unknown 64-bit value.
        ("jmp32 then 64-bit map offset", {
            let mut v = vec![mov64_reg(9, 1)];
            v.extend(lookup(6, 0));
            v.extend([
                ldx(op::DW, 2, 9, 0),
                jmp32_imm(op::JGT, 2, 7, 3),
                alu64_reg(op::ADD, 6, 2),
                ldx(op::B, 0, 6, 0),
                exit(),
                mov64_imm(0, 0),
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
