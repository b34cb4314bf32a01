//! `ncclbpf`: verify and disassemble policies before deploying them, and read the maps of a
//! running (or hung) job from outside.

use clap::{Parser, Subcommand};
use policy_object::insn;
use policy_object::{Object, Program};
use policy_verifier::{Limits, map_infos, verify};
use shared_maps::MapView;
use std::fmt;
use std::io::{self, BufWriter, StdoutLock, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Standard output, locked and buffered. A reader that goes away (`ncclbpf disasm x.o | head`)
/// is not an error: the rest of the output is dropped and the command finishes with its usual
/// exit status. Other write errors are reported.
struct Out {
    w: BufWriter<StdoutLock<'static>>,
    closed: bool,
}

impl Out {
    fn new() -> Out {
        Out {
            w: BufWriter::new(io::stdout().lock()),
            closed: false,
        }
    }

    fn settle(&mut self, r: io::Result<()>) -> Result<(), String> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(format!("writing to standard output: {e}")),
        }
    }

    fn line(&mut self, args: fmt::Arguments) -> Result<(), String> {
        if self.closed {
            return Ok(());
        }
        let r = self
            .w
            .write_fmt(args)
            .and_then(|()| self.w.write_all(b"\n"));
        self.settle(r)
    }

    fn finish(&mut self) -> Result<(), String> {
        if self.closed {
            return Ok(());
        }
        let r = self.w.flush();
        self.settle(r)
    }
}

/// `println!` through an [`Out`], returning its error from the enclosing function.
macro_rules! outln {
    ($o:expr) => { $o.line(format_args!(""))? };
    ($o:expr, $($t:tt)*) => { $o.line(format_args!($($t)*))? };
}

#[derive(Parser)]
#[command(
    name = "ncclbpf",
    version,
    about = "Verify, inspect and read ncclbpf policies and maps"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the verifier on every program of a policy object (exit status 1 if any is rejected).
    Verify {
        /// A policy object built with `clang -O2 -g -target bpf -mcpu=v3`.
        object: PathBuf,
        /// Only this program.
        #[arg(long)]
        program: Option<String>,
    },
    /// Print the programs of a policy object, with their C source lines.
    Disasm {
        object: PathBuf,
        #[arg(long)]
        program: Option<String>,
    },
    /// List the maps of a running process and their entries (read-only, from shared memory).
    Maps {
        /// Process id of a process that loaded the plugin.
        pid: u32,
        /// Only this map.
        #[arg(long)]
        map: Option<String>,
        /// At most this many entries per map.
        #[arg(long, default_value_t = 32)]
        limit: usize,
    },
}

fn load(path: &PathBuf) -> Result<Object, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Object::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn selected<'a>(obj: &'a Object, program: &Option<String>) -> Result<Vec<&'a Program>, String> {
    let progs: Vec<&Program> = obj
        .programs
        .iter()
        .filter(|p| program.as_ref().is_none_or(|n| &p.name == n))
        .collect();
    if progs.is_empty() {
        let names: Vec<_> = obj.programs.iter().map(|p| p.name.as_str()).collect();
        return Err(format!(
            "no program {:?} (the object has: {})",
            program.as_deref().unwrap_or(""),
            names.join(", ")
        ));
    }
    Ok(progs)
}

fn cmd_verify(out: &mut Out, object: &PathBuf, program: &Option<String>) -> Result<bool, String> {
    let obj = load(object)?;
    let maps = map_infos(&obj.maps);
    let mut all_ok = true;
    for p in selected(&obj, program)? {
        match verify(p, &maps, Limits::default()) {
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
            Err(e) => {
                all_ok = false;
                outln!(
                    out,
                    "{} ({}): rejected [{}]\n{e}",
                    p.name,
                    p.section,
                    e.kind()
                );
            }
        }
    }
    Ok(all_ok)
}

fn cmd_disasm(out: &mut Out, object: &PathBuf, program: &Option<String>) -> Result<bool, String> {
    let obj = load(object)?;
    for (i, m) in obj.maps.iter().enumerate() {
        outln!(
            out,
            "map[{i}] {}: {} key {} B, value {} B, {} entries{}",
            m.name,
            m.kind.name(),
            m.key_size,
            m.value_size,
            m.max_entries,
            if m.read_only { " (read-only)" } else { "" }
        );
    }
    for p in selected(&obj, program)? {
        outln!(out, "\n{} ({}):", p.name, p.section);
        let mut last_line = None;
        let mut pc = 0;
        while pc < p.insns.len() {
            if let Some(l) = p.lines.iter().find(|l| l.insn == pc)
                && l.line != 0
                && last_line != Some(l.line)
            {
                outln!(
                    out,
                    "; {}:{}: {}",
                    l.file.rsplit('/').next().unwrap_or(&l.file),
                    l.line,
                    l.text.trim()
                );
                last_line = Some(l.line);
            }
            outln!(out, "{pc:5}: {}", insn::disasm(&p.insns, pc));
            pc += if p.insns[pc].is_lddw() { 2 } else { 1 };
        }
    }
    Ok(true)
}

fn words(bytes: &[u8]) -> String {
    if bytes.len().is_multiple_of(8) && bytes.len() <= 64 {
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")).to_string())
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    }
}

fn cmd_maps(out: &mut Out, pid: u32, map: &Option<String>, limit: usize) -> Result<bool, String> {
    let views = MapView::open_all(pid).map_err(|e| format!("process {pid}: {e}"))?;
    let mut shown = 0;
    for v in views
        .iter()
        .filter(|v| map.as_ref().is_none_or(|m| &v.name == m))
    {
        shown += 1;
        let s = &v.spec;
        let entries = v.entries();
        let live: Vec<_> = entries
            .iter()
            .filter(|(_, vals)| vals.iter().any(|x| x.iter().any(|&b| b != 0)))
            .collect();
        outln!(
            out,
            "{}: {} key {} B, value {} B, {} entries ({} non-zero{})",
            v.name,
            s.kind.name(),
            s.key_size,
            s.value_size,
            s.max_entries,
            live.len(),
            if v.ncpus > 1 {
                format!(", {} CPUs summed", v.ncpus)
            } else {
                String::new()
            }
        );
        for (k, vals) in live.iter().take(limit) {
            let mut sum = vals[0].clone();
            if vals.len() > 1 && sum.len() % 8 == 0 {
                for w in 0..sum.len() / 8 {
                    let total: u64 = vals
                        .iter()
                        .map(|v| u64::from_le_bytes(v[w * 8..w * 8 + 8].try_into().expect("8")))
                        .fold(0, u64::wrapping_add);
                    sum[w * 8..w * 8 + 8].copy_from_slice(&total.to_le_bytes());
                }
            }
            outln!(out, "  {} => {}", words(k), words(&sum));
        }
    }
    if shown == 0 {
        return Err(format!(
            "process {pid} has no map {:?}",
            map.as_deref().unwrap_or("")
        ));
    }
    Ok(true)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = Out::new();
    let r = match &cli.cmd {
        Cmd::Verify { object, program } => cmd_verify(&mut out, object, program),
        Cmd::Disasm { object, program } => cmd_disasm(&mut out, object, program),
        Cmd::Maps { pid, map, limit } => cmd_maps(&mut out, *pid, map, *limit),
    };
    let r = out.finish().and(r);
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            // Nothing more to do if stderr is gone too.
            let _ = writeln!(io::stderr(), "ncclbpf: {e}");
            ExitCode::from(2)
        }
    }
}
