//! `ncclbpf verify`: the verifier's verdict on each program, with its log for a rejection.

use crate::exit::{Outcome, Verdict};
use crate::object;
use crate::out::{Out, outln};
use policy_object::Program;
use policy_verifier::{Limits, VerifyError, map_infos, verify};
use serde_json::{Value, json};
use std::path::PathBuf;

/// Run the verifier on every program of a policy object.
#[derive(clap::Args)]
#[command(after_help = concat!(
    "Examples:
  ncclbpf verify policy.o                     # every program: accepted, or why not
  ncclbpf verify policy.o --program size_aware
  ncclbpf verify --json policy.o | jq '.programs[] | select(.accepted | not)'

A rejection names the instruction, the reason, the C source line and the register state
before the instruction. A program the verifier cannot finish within its budget is rejected
[too_complex: LIMIT limit], LIMIT one of processed, states, memory, work, time (the budget:
64 MiB of verifier states, about 2 s at most; docs/design/verifier.md).

",
    "Exit status:
  0  every program checked is accepted
  1  a program is rejected, or the file is not a valid policy object
  2  usage or I/O error (no such file, no such program, bad arguments)"
))]
pub struct Args {
    /// A policy object (`clang -O2 -g -target bpf -mcpu=v3`, see policies/build.sh).
    pub object: PathBuf,
    /// Only the program of this name.
    #[arg(long, value_name = "NAME")]
    pub program: Option<String>,
    /// Print one JSON document: {object, accepted, programs: [{name, section, accepted, …}]}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(out: &mut Out, a: &Args) -> Outcome {
    let obj = object::read(&a.object)?;
    let maps = map_infos(&obj.maps);
    let progs = object::select(&obj, a.program.as_deref())?;
    let results: Vec<_> = progs
        .iter()
        .map(|p| (*p, verify(p, &maps, Limits::default())))
        .collect();
    let all_ok = results.iter().all(|(_, r)| r.is_ok());
    if a.json {
        let programs: Vec<Value> = results
            .iter()
            .map(|(p, r)| {
                let mut v = json!({ "name": p.name, "section": p.section });
                let fields = match r {
                    Ok(s) => json!({
                        "accepted": true,
                        "insns": s.insns,
                        "processed": s.processed,
                        "states": s.states,
                        "pruned": s.pruned,
                        "max_depth": s.max_depth,
                        "peak_states": s.peak_states,
                        "peak_state_bytes": s.peak_bytes,
                        "work": s.work,
                    }),
                    Err(e) => rejection(p, e),
                };
                if let (Value::Object(m), Value::Object(f)) = (&mut v, fields) {
                    m.extend(f);
                }
                v
            })
            .collect();
        out.json(&json!({
            "object": a.object.display().to_string(),
            "accepted": all_ok,
            "programs": programs,
        }))?;
    } else {
        for (p, r) in &results {
            match r {
                Ok(s) => outln!(
                    out,
                    "{} ({}): accepted: {} insns, {} processed, {} states, {} pruned",
                    p.name,
                    p.section,
                    s.insns,
                    s.processed,
                    s.states,
                    s.pruned
                ),
                Err(e) => outln!(
                    out,
                    "{} ({}): rejected [{}]\n{e}",
                    p.name,
                    p.section,
                    match e.reject.limit() {
                        Some(limit) => format!("{}: {limit} limit", e.kind()),
                        None => e.kind().to_string(),
                    }
                ),
            }
        }
    }
    Ok(if all_ok { Verdict::Good } else { Verdict::Bad })
}

/// A rejection's fields, and the log as text.
fn rejection(p: &Program, e: &VerifyError) -> Value {
    let line = p
        .line_for(e.insn)
        .filter(|l| l.line != 0)
        .map(|l| json!({ "file": object::file_name(l), "line": l.line, "text": l.text.trim() }));
    json!({
        "accepted": false,
        "kind": e.kind(),
        "limit": e.reject.limit(),
        "insn": e.insn,
        "disasm": e.disasm,
        "reason": e.reject.to_string(),
        "register": e.reject.reg(),
        "source": e.source,
        "line": line,
        "state": e.state,
        "path": e.path,
        "processed": e.processed,
        "log": e.to_string(),
    })
}
