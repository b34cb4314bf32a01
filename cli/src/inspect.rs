//! `ncclbpf inspect` (alias `disasm`): what a policy object holds: programs and their hooks,
//! maps, and each program's instructions with the C source lines they came from.

use crate::exit::{Outcome, Verdict};
use crate::object;
use crate::out::{Out, outln};
use policy_object::{MapDef, Program, insn};
use serde_json::{Value, json};
use std::path::PathBuf;

/// Show a policy object's programs, maps and instructions with their C source lines.
#[derive(clap::Args)]
#[command(after_help = concat!(
    "Examples:
  ncclbpf inspect policy.o                        # programs, maps, then the code
  ncclbpf inspect policy.o --program size_aware
  ncclbpf disasm policy.o | less                  # the same (disasm is an alias)
  ncclbpf inspect --json policy.o | jq '.maps[].name'

Instructions are in the kernel's notation, each C line (from the object's BTF line info,
`clang -g`) printed before the first instruction compiled from it. Nothing is verified here:
see `ncclbpf verify`.

",
    "Exit status:
  0  the object was read
  1  the file is not a valid policy object
  2  usage or I/O error (no such file, no such program, bad arguments)"
))]
pub struct Args {
    /// A policy object.
    pub object: PathBuf,
    /// Only the program of this name.
    #[arg(long, value_name = "NAME")]
    pub program: Option<String>,
    /// Print one JSON document: {object, programs: [{name, section, hook, insns,
    /// instructions: [{pc, text, line}]}], maps: [{name, type, key_size, …}]}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(out: &mut Out, a: &Args) -> Outcome {
    let obj = object::read(&a.object)?;
    let progs = object::select(&obj, a.program.as_deref())?;
    if a.json {
        out.json(&json!({
            "object": a.object.display().to_string(),
            "programs": progs.iter().map(|p| program_json(p)).collect::<Vec<_>>(),
            "maps": obj.maps.iter().enumerate().map(|(i, m)| map_json(i, m)).collect::<Vec<_>>(),
        }))?;
        return Ok(Verdict::Good);
    }
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    outln!(
        out,
        "{}: {}, {}",
        a.object.display(),
        plural(obj.programs.len(), "program"),
        plural(obj.maps.len(), "map")
    );
    for p in &progs {
        outln!(
            out,
            "  {}: section {} (hook: {}), {} insns",
            p.name,
            p.section,
            object::hook(&p.section).unwrap_or("none, the verifier rejects the program"),
            p.insns.len()
        );
    }
    for (i, m) in obj.maps.iter().enumerate() {
        outln!(
            out,
            "map[{i}] {}: {} key {} B, value {} B, {} entries{}",
            m.name,
            m.kind.name(),
            m.key_size,
            m.value_size,
            m.max_entries,
            match (m.read_only, m.initial.is_some()) {
                (true, _) => " (read-only global data)",
                (false, true) => " (global data)",
                (false, false) => "",
            }
        );
    }
    for p in progs {
        outln!(out, "\n{} ({}):", p.name, p.section);
        let mut last_line = None;
        for pc in starts(p) {
            if let Some(l) = object::line_at(p, pc)
                && last_line != Some(l.line)
            {
                outln!(
                    out,
                    "; {}:{}: {}",
                    object::file_name(l),
                    l.line,
                    l.text.trim()
                );
                last_line = Some(l.line);
            }
            outln!(out, "{pc:5}: {}", insn::disasm(&p.insns, pc));
        }
    }
    Ok(Verdict::Good)
}

/// The indices where instructions start (an `lddw` takes two slots).
fn starts(p: &Program) -> impl Iterator<Item = usize> + '_ {
    let mut pc = 0;
    std::iter::from_fn(move || {
        let here = pc;
        let i = p.insns.get(here)?;
        pc += if i.is_lddw() { 2 } else { 1 };
        Some(here)
    })
}

fn program_json(p: &Program) -> Value {
    let instructions: Vec<Value> = starts(p)
        .map(|pc| {
            let line = p.line_for(pc).filter(|l| l.line != 0).map(
                |l| json!({ "file": object::file_name(l), "line": l.line, "text": l.text.trim() }),
            );
            json!({ "pc": pc, "text": insn::disasm(&p.insns, pc), "line": line })
        })
        .collect();
    json!({
        "name": p.name,
        "section": p.section,
        "hook": object::hook(&p.section),
        "insns": p.insns.len(),
        "instructions": instructions,
    })
}

fn map_json(index: usize, m: &MapDef) -> Value {
    json!({
        "index": index,
        "name": m.name,
        "type": m.kind.name(),
        "key_size": m.key_size,
        "value_size": m.value_size,
        "max_entries": m.max_entries,
        "read_only": m.read_only,
        "global_data": m.initial.is_some(),
    })
}
