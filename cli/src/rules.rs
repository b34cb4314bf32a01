//! `ncclbpf rules check FILE`: validates a rules file of NCCL's example tuner format without a
//! job, with the errors the tuner would log (every malformed line, with its field).

use crate::exit::{Failure, Outcome, Verdict};
use crate::out::{Out, outln};
use ncclbpf_tuner::rules::{self, ALGORITHMS, COLLECTIVES, PROTOCOLS};
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Check a rules file (nccl_tuner.conf format) as the `rules` policy would read it.
    #[command(after_help = "Examples:
  ncclbpf rules check nccl_tuner.conf
  ncclbpf rules check --json $NCCL_TUNER_CONFIG_FILE | jq .rules

Lines: collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
(8, 9 or 10 fields; -1 for any or NCCL's; # comments and blank lines skipped). Every malformed
line is reported as FILE:LINE: field N (name): what is wrong; a file with any error is not
used by the tuner at all (NCCL keeps its own choices). Rules hidden by an earlier rule are
warnings.

Exit status:
  0  the file is valid (warnings may be printed)
  1  the file has errors (each printed on standard error)
  2  the file cannot be read, or bad arguments")]
    Check(CheckArgs),
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// The rules file.
    pub file: PathBuf,
    /// Print one JSON document: {file, valid, capacity, rules: [{line, collective, min_bytes,
    /// max_bytes, algorithm, protocol, channels, nnodes, nranks, num_pipe_ops, reg_buff}],
    /// warnings, errors: [{line, field, message, text}]} (null for "any"/NCCL's).
    #[arg(long)]
    pub json: bool,
}

pub fn run(out: &mut Out, cmd: &Cmd) -> Outcome {
    let Cmd::Check(a) = cmd;
    if !a.file.exists() {
        return Err(Failure::Usage(format!(
            "{}: no such file",
            a.file.display()
        )));
    }
    match rules::check_file(&a.file) {
        Ok(summary) => {
            if a.json {
                let rules: Vec<_> = summary
                    .rules
                    .iter()
                    .map(|r| {
                        json!({
                            "line": r.line,
                            "collective": COLLECTIVES[r.coll as usize],
                            "min_bytes": r.min_bytes,
                            "max_bytes": (r.max_bytes != u64::MAX).then_some(r.max_bytes),
                            "algorithm": ALGORITHMS[r.algo as usize],
                            "protocol": PROTOCOLS[r.proto as usize],
                            "channels": r.channels,
                            "nnodes": r.nnodes,
                            "nranks": r.nranks,
                            "num_pipe_ops": r.num_pipe_ops,
                            "reg_buff": r.reg_buff,
                        })
                    })
                    .collect();
                out.json(&json!({
                    "file": summary.file,
                    "valid": true,
                    "capacity": summary.capacity,
                    "rules": rules,
                    "warnings": summary.warnings,
                    "errors": [],
                }))?;
            } else {
                outln!(out, "{summary}");
            }
            Ok(Verdict::Good)
        }
        Err(errors) => {
            if errors.iter().any(|e| e.line.is_none()) {
                let msg: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                return Err(Failure::Usage(msg.join("\n")));
            }
            if a.json {
                let errs: Vec<_> = errors
                    .iter()
                    .map(|e| {
                        json!({
                            "line": e.line,
                            "field": e.field.map(|(n, name)| json!({"index": n, "name": name})),
                            "message": e.message,
                            "text": e.to_string(),
                        })
                    })
                    .collect();
                out.json(&json!({
                    "file": a.file.display().to_string(),
                    "valid": false,
                    "rules": [],
                    "warnings": [],
                    "errors": errs,
                }))?;
                return Ok(Verdict::Bad);
            }
            let msg: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            Err(Failure::Bad(format!(
                "{} error(s); the tuner would not use this file:\n{}",
                errors.len(),
                msg.join("\n")
            )))
        }
    }
}
