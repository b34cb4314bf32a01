//! `ncclbpf`: verify and disassemble policies before deploying them, and read the maps of a
//! running (or hung) job from outside.

use clap::{Parser, Subcommand};
use policy_object::insn;
use policy_object::{Object, Program};
use policy_verifier::{Limits, map_infos, verify};
use shared_maps::MapView;
use std::path::PathBuf;
use std::process::ExitCode;

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

fn cmd_verify(object: &PathBuf, program: &Option<String>) -> Result<bool, String> {
    let obj = load(object)?;
    let maps = map_infos(&obj.maps);
    let mut all_ok = true;
    for p in selected(&obj, program)? {
        match verify(p, &maps, Limits::default()) {
            Ok(s) => println!(
                "{} ({}): accepted: {} insns, {} processed, {} states, {} pruned",
                p.name, p.section, s.insns, s.processed, s.states, s.pruned
            ),
            Err(e) => {
                all_ok = false;
                println!("{} ({}): rejected [{}]\n{e}", p.name, p.section, e.kind());
            }
        }
    }
    Ok(all_ok)
}

fn cmd_disasm(object: &PathBuf, program: &Option<String>) -> Result<bool, String> {
    let obj = load(object)?;
    for (i, m) in obj.maps.iter().enumerate() {
        println!(
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
        println!("\n{} ({}):", p.name, p.section);
        let mut last_line = None;
        let mut pc = 0;
        while pc < p.insns.len() {
            if let Some(l) = p.lines.iter().find(|l| l.insn == pc)
                && l.line != 0
                && last_line != Some(l.line)
            {
                println!(
                    "; {}:{}: {}",
                    l.file.rsplit('/').next().unwrap_or(&l.file),
                    l.line,
                    l.text.trim()
                );
                last_line = Some(l.line);
            }
            println!("{pc:5}: {}", insn::disasm(&p.insns, pc));
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

fn cmd_maps(pid: u32, map: &Option<String>, limit: usize) -> Result<bool, String> {
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
        println!(
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
            println!("  {} => {}", words(k), words(&sum));
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
    let r = match &cli.cmd {
        Cmd::Verify { object, program } => cmd_verify(object, program),
        Cmd::Disasm { object, program } => cmd_disasm(object, program),
        Cmd::Maps { pid, map, limit } => cmd_maps(*pid, map, *limit),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ncclbpf: {e}");
            ExitCode::from(2)
        }
    }
}
