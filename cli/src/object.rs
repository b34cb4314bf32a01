//! Reading a policy object and picking its programs: shared by the commands that take a file.

use crate::exit::Failure;
use policy_object::{LineInfo, Object, Program};
use std::path::Path;

/// Reads and parses a policy object. A file that cannot be read is a usage error (exit 2); one
/// that is not a valid policy object is bad (exit 1).
pub fn read(path: &Path) -> Result<Object, Failure> {
    let bytes =
        std::fs::read(path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    Object::parse(&bytes).map_err(|e| {
        Failure::Bad(format!(
            "{}: not a valid policy object: {e}",
            path.display()
        ))
    })
}

/// The programs named `program` (all of them without a name); no match is a usage error that
/// lists what the object has.
pub fn select<'a>(obj: &'a Object, program: Option<&str>) -> Result<Vec<&'a Program>, Failure> {
    let progs: Vec<&Program> = obj
        .programs
        .iter()
        .filter(|p| program.is_none_or(|n| p.name == n))
        .collect();
    if progs.is_empty() {
        return Err(Failure::Usage(match program {
            Some(n) => format!("no program {n:?} (the object has: {})", list(obj)),
            None => "the object has no programs".into(),
        }));
    }
    Ok(progs)
}

/// `name (section), …` for messages.
pub fn list(obj: &Object) -> String {
    let names: Vec<String> = obj
        .programs
        .iter()
        .map(|p| format!("{} ({})", p.name, p.section))
        .collect();
    if names.is_empty() {
        "no programs".into()
    } else {
        names.join(", ")
    }
}

/// What the hook a section names is, or `None` when it names none (the verifier rejects such
/// a program).
pub fn hook(section: &str) -> Option<&'static str> {
    policy_verifier::platform::hook(section)?;
    Some(match section {
        "tuner" => "the tuner: NCCL's getCollInfo, once per collective",
        "net/connect" => "the net plugin's connect",
        "net/accept" => "the net plugin's accept",
        "net/isend" => "the net plugin's isend: a send posted",
        "net/irecv" => "the net plugin's irecv: a receive posted",
        "net/complete" => "the net plugin's test: a send or receive completed",
        "net/close" => "the net plugin closing a connection",
        _ => "a hook of this build",
    })
}

/// The C source line that starts at instruction `pc`, when the object has line info.
pub fn line_at(p: &Program, pc: usize) -> Option<&LineInfo> {
    p.lines.iter().find(|l| l.insn == pc && l.line != 0)
}

/// A source file name without its directories.
pub fn file_name(l: &LineInfo) -> &str {
    l.file.rsplit('/').next().unwrap_or(&l.file)
}
