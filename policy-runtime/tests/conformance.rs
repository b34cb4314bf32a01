//! The public BPF conformance vectors (RFC 9669 instruction semantics) on both engines.
//!
//! Each `tests/conformance/*.data` file (see its README for where they come from) has
//! sections: `-- asm` (the program, assembled by `policy_object::asm`), optionally `-- raw`
//! (the same program as little-endian 64-bit words, which then is what runs, and which the
//! assembler must reproduce), `-- mem` (hex bytes: the memory `r1` points to, `r2` its
//! length), `-- result` (the expected `r0`, all 64 bits) or `-- error` (the run must fail),
//! and documentation sections that are not run (`-- c`: the C the program came from,
//! `-- no register offset`). Every vector runs unverified, through `policy_runtime::raw`, on
//! the interpreter (memory-checked) and on the JIT, except the files in [`SKIPPED`], each with
//! its reason. The JIT, which runs natively and unchecked, gets only the programs the
//! interpreter ran without a fault. A vector with a `-- result` must also be made of RFC 9669
//! encodings (`policy_object::insn::encoding_error`). A file that cannot be parsed or
//! assembled is a failure, never a skip.
//!
//! `cargo test --release -p policy-runtime --test conformance -- --nocapture` prints the counts.

use policy_object::insn::{self as op, encoding_error};
use policy_object::{Insn, asm};
use policy_runtime::raw;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Vectors not run on this platform, by file name, with the reason.
const SKIPPED: &[(&str, &str, Skip)] = &[
    (
        "callx.data",
        "callx (call through a register, opcode 0x8d) is not an RFC 9669 instruction; \
         policies call helpers by static id only",
        Skip::Opcode(0x8d),
    ),
    (
        "call_unwind_fail.data",
        "calls helper 5, whose meaning is the harness's (ubpf's `unwind`); helpers are \
         platform-defined (RFC 9669 §4.3.1) and the raw engines are given none",
        Skip::Helper(5),
    ),
];

/// What a skipped file must contain, so that a skip never outlives its reason.
#[derive(Clone, Copy, Debug)]
enum Skip {
    Opcode(u8),
    Helper(i32),
}

impl Skip {
    fn holds(self, insns: &[Insn]) -> bool {
        insns.iter().any(|i| match self {
            Skip::Opcode(code) => i.code == code,
            Skip::Helper(id) => i.code == op::JMP | op::CALL && i.src == 0 && i.imm == id,
        })
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Value(u64),
    Error(String),
}

#[derive(Debug)]
struct Vector {
    /// The `-- asm` text, and the file line its first line is on.
    asm: Option<(String, usize)>,
    raw: Option<Vec<u64>>,
    mem: Vec<u8>,
    expect: Expect,
}

fn strip_comment(line: &str) -> &str {
    line.split('#').next().unwrap_or("")
}

fn number(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse::<u64>(),
    };
    r.map_err(|e| format!("`{s}`: {e}"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Header,
    Asm,
    Raw,
    Mem,
    Result,
    Error,
    /// Text that documents the vector and is not run (`-- c`, `-- no register offset`).
    Doc,
}

/// Parses one vector file. Errors name the line.
fn parse(text: &str) -> Result<Vector, String> {
    let mut section = Section::Header;
    let mut asm: Option<(String, usize)> = None;
    let mut raw: Option<Vec<u64>> = None;
    let mut mem: Option<Vec<u8>> = None;
    let mut result: Option<u64> = None;
    let mut error: Option<String> = None;
    let mut seen: Vec<&str> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let at = |m: String| format!("line {line_no}: {m}");
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(name) = line.strip_prefix("--") {
            let name = name.trim();
            section = match name {
                "asm" => Section::Asm,
                "raw" => Section::Raw,
                "mem" => Section::Mem,
                "result" => Section::Result,
                "error" => Section::Error,
                "c" | "no register offset" => Section::Doc,
                _ => return Err(at(format!("unknown section `-- {name}`"))),
            };
            if section != Section::Doc && seen.contains(&name) {
                return Err(at(format!("second `-- {name}` section")));
            }
            seen.push(name);
            match section {
                Section::Asm => asm = Some((String::new(), line_no + 1)),
                Section::Raw => raw = Some(Vec::new()),
                Section::Mem => mem = Some(Vec::new()),
                _ => {}
            }
            continue;
        }
        let data = strip_comment(line).trim();
        match section {
            Section::Doc => {}
            Section::Header if data.is_empty() => {}
            Section::Header => return Err(at(format!("`{data}` outside any section"))),
            Section::Asm => {
                // Kept whole (comments and blank lines too) so assembler lines map to file lines.
                let (t, _) = asm.as_mut().expect("set on `-- asm`");
                t.push_str(line);
                t.push('\n');
            }
            Section::Raw => {
                let words = raw.as_mut().expect("set on `-- raw`");
                for w in data.split_whitespace() {
                    words.push(number(w).map_err(at)?);
                }
            }
            Section::Mem => {
                let bytes = mem.as_mut().expect("set on `-- mem`");
                for b in data.split_whitespace() {
                    let v = u8::from_str_radix(b, 16).map_err(|e| at(format!("`{b}`: {e}")))?;
                    bytes.push(v);
                }
            }
            Section::Result if data.is_empty() => {}
            Section::Result => {
                if result.is_some() {
                    return Err(at("a second result".into()));
                }
                result = Some(number(data).map_err(at)?);
            }
            Section::Error if data.is_empty() => {}
            Section::Error => error = Some(data.to_string()),
        }
    }
    let expect = match (result, error) {
        (Some(v), None) => Expect::Value(v),
        (None, Some(e)) => Expect::Error(e),
        (None, None) => return Err("no `-- result` or `-- error`".into()),
        (Some(_), Some(_)) => return Err("both `-- result` and `-- error`".into()),
    };
    if asm.is_none() && raw.is_none() {
        return Err("no `-- asm` or `-- raw` program".into());
    }
    Ok(Vector {
        asm,
        raw,
        mem: mem.unwrap_or_default(),
        expect,
    })
}

/// The program a vector runs: its raw words if it has them (which the assembler must then
/// reproduce from its text), else its assembled text.
fn program(v: &Vector) -> Result<Vec<Insn>, String> {
    let assembled = match &v.asm {
        Some((text, first)) => Some(
            asm::assemble(text).map_err(|e| format!("line {}: {}", first + e.line - 1, e.kind))?,
        ),
        None => None,
    };
    let Some(raw) = &v.raw else {
        return Ok(assembled.unwrap_or_default());
    };
    let decoded: Vec<Insn> = raw.iter().map(|w| Insn::decode(&w.to_le_bytes())).collect();
    if let Some(a) = assembled
        && a != decoded
    {
        return Err(format!(
            "the assembler disagrees with `-- raw`: assembled {:x?}, raw {raw:#018x?}",
            a.iter()
                .map(|i| u64::from_le_bytes(i.encode()))
                .collect::<Vec<_>>()
        ));
    }
    Ok(decoded)
}

/// The first instruction (the first half, for `lddw`) that is not an RFC 9669 encoding.
fn first_encoding_error(insns: &[Insn]) -> Option<(usize, &'static str)> {
    let mut pc = 0;
    while let Some(i) = insns.get(pc) {
        if let Some(why) = encoding_error(i, insns.get(pc + 1)) {
            return Some((pc, why));
        }
        pc += if i.is_lddw() { 2 } else { 1 };
    }
    None
}

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

fn vector_files() -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(vectors_dir())
        .expect("tests/conformance")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "data"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, text)
        })
        .collect();
    files.sort();
    files
}

/// What one engine did with one vector, if it was wrong.
fn judge(expect: &Expect, got: Result<u64, String>) -> Option<String> {
    match (expect, got) {
        (Expect::Value(want), Ok(v)) if *want == v => None,
        (Expect::Value(want), Ok(v)) => Some(format!("expected {want:#x}, got {v:#x}")),
        (Expect::Value(want), Err(e)) => Some(format!("expected {want:#x}, got error: {e}")),
        (Expect::Error(_), Err(_)) => None,
        (Expect::Error(want), Ok(v)) => Some(format!("expected error `{want}`, got {v:#x}")),
    }
}

fn run_interpreter(insns: &[Insn], mem: &[u8]) -> Result<u64, String> {
    let mut m = mem.to_vec();
    raw::run_interpreter(insns, &mut m).map_err(|e| e.to_string())
}

fn run_jit(insns: &[Insn], mem: &[u8]) -> Result<u64, String> {
    let mut m = mem.to_vec();
    // SAFETY: the vectors are well-behaved programs, and run_jit is only called on those the
    // memory-checked interpreter ran to completion without a fault (see the caller).
    unsafe { raw::run_jit(insns, &mut m) }.map_err(|e| e.to_string())
}

#[test]
fn conformance_vectors_pass_on_both_engines() {
    let files = vector_files();
    assert!(
        files.len() >= 300,
        "only {} vectors in {}",
        files.len(),
        vectors_dir().display()
    );
    for (name, _, _) in SKIPPED {
        assert!(
            files.iter().any(|(n, _)| n == name),
            "skip list names {name}, which is not a vector"
        );
    }
    let (mut interp_pass, mut jit_pass) = (0usize, 0usize);
    let mut skipped: Vec<String> = Vec::new();
    let mut jit_skipped: Vec<String> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for (name, text) in &files {
        let (v, insns) = match parse(text).and_then(|v| program(&v).map(|p| (v, p))) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        if let Some((_, reason, skip)) = SKIPPED.iter().find(|s| s.0 == name) {
            if !skip.holds(&insns) {
                failures.push(format!(
                    "{name}: skipped for {skip:?}, which it does not contain"
                ));
            }
            skipped.push(format!("{name}: {reason}"));
            continue;
        }
        // Every program expected to run is one RFC 9669 defines (a check of the vectors and
        // the assembler, independent of the engines).
        if let (Expect::Value(_), Some((pc, why))) = (&v.expect, first_encoding_error(&insns)) {
            failures.push(format!(
                "{name}: insn {pc} is not an RFC 9669 encoding: {why}"
            ));
            continue;
        }
        if insns.is_empty() {
            failures.push(format!("{name}: no instructions"));
            continue;
        }
        let interp = run_interpreter(&insns, &v.mem);
        let interp_faulted = interp.is_err();
        match judge(&v.expect, interp) {
            None => interp_pass += 1,
            Some(e) => failures.push(format!("{name}: interpreter: {e}")),
        }
        // The JIT runs natively, unchecked: a program that faults in the checked interpreter
        // could touch memory that is not its own, so it is never run there.
        if interp_faulted {
            match v.expect {
                Expect::Error(_) => jit_skipped.push(format!(
                    "{name}: expects an error, and a faulting program is not run natively"
                )),
                Expect::Value(_) => failures.push(format!(
                    "{name}: jit: not run, since the interpreter faulted"
                )),
            }
            continue;
        }
        match judge(&v.expect, run_jit(&insns, &v.mem)) {
            None => jit_pass += 1,
            Some(e) => failures.push(format!("{name}: jit: {e}")),
        }
    }
    let mut report = String::new();
    let _ = writeln!(
        report,
        "conformance: {} vectors; interpreter passed {interp_pass}, jit passed {jit_pass}; \
         skipped {} on both, {} on the jit only; failures {}",
        files.len(),
        skipped.len(),
        jit_skipped.len(),
        failures.len()
    );
    for s in &skipped {
        let _ = writeln!(report, "  skipped {s}");
    }
    for s in &jit_skipped {
        let _ = writeln!(report, "  skipped on the jit {s}");
    }
    for f in &failures {
        let _ = writeln!(report, "  FAILED {f}");
    }
    println!("{report}");
    assert!(failures.is_empty(), "{report}");
    let ran = files.len() - skipped.len();
    assert_eq!(interp_pass, ran, "{report}");
    assert_eq!(jit_pass + jit_skipped.len(), ran, "{report}");
}

#[test]
fn parser_reads_every_section_and_rejects_what_it_does_not_know() {
    let v = parse(
        "# header comment\n-- asm\nmov %r0, 1 # one\nexit\n-- mem\n00 ff\n0a\n-- result\n0x10\n-- c\nint x;\n",
    )
    .unwrap();
    assert_eq!(v.asm.as_ref().unwrap().1, 3);
    assert_eq!(v.mem, [0x00, 0xff, 0x0a]);
    assert_eq!(v.expect, Expect::Value(0x10));
    let p = program(&v).unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].code, 0xb7);

    let v = parse("-- raw\n0x0000000100000007\n149\n-- error\nboom\n").unwrap();
    assert_eq!(v.expect, Expect::Error("boom".into()));
    let p = program(&v).unwrap();
    assert_eq!((p[0].code, p[0].imm, p[1].code), (0x07, 1, 0x95));

    // The assembler must agree with `-- raw` when a file has both.
    let e = program(&parse("-- asm\nexit\n-- raw\n0x95\n0x95\n-- result\n0\n").unwrap());
    assert!(e.unwrap_err().contains("disagrees"));
    // Assembler errors carry the file's line.
    let e = program(&parse("# c\n-- asm\nexit\nfrob\n-- result\n0\n").unwrap());
    assert_eq!(e.unwrap_err(), "line 4: unknown mnemonic `frob`");

    for (bad, why) in [
        ("-- asm\nexit\n", "no `-- result`"),
        ("-- asm\nexit\n-- result\n1\n-- error\nx\n", "both"),
        ("-- result\n1\n", "no `-- asm`"),
        ("-- asm\nexit\n-- bogus\n-- result\n1\n", "unknown section"),
        (
            "mov %r0, 1\n-- asm\nexit\n-- result\n1\n",
            "outside any section",
        ),
        ("-- asm\nexit\n-- mem\nzz\n-- result\n1\n", "line 4"),
        ("-- asm\nexit\n-- result\n1\n2\n", "second result"),
        (
            "-- asm\nexit\n-- asm\nexit\n-- result\n1\n",
            "second `-- asm`",
        ),
    ] {
        let e = parse(bad).unwrap_err();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
    assert_eq!(judge(&Expect::Value(1), Ok(1)), None);
    assert!(judge(&Expect::Value(1), Ok(2)).is_some());
    assert!(judge(&Expect::Value(1), Err("f".into())).is_some());
    assert!(judge(&Expect::Error("e".into()), Ok(0)).is_some());
}
