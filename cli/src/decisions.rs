//! `ncclbpf decisions`: what a tuner policy decides, without NCCL. The policy is loaded as the
//! plugin loads it (verified, JIT-compiled), with maps of its own that nothing else sees, and
//! run through the plugin's own [`ncclbpf_tuner::decide::run_policy`] for every power-of-two
//! size of the range and each collective; the answers are printed as ranges of sizes with the
//! same decision (the switch points), like aws-ofi-nccl's `show-tuner-decisions`.
//!
//! `decisions --compare PID...` instead compares what running processes decided (module
//! [`crate::compare`]).

use crate::compare;
use crate::exit::{Failure, Outcome, Verdict};
use crate::nccl::{Choice, Coll, NCCLS_CHOICE};
use crate::object;
use crate::out::{Out, outln};
use crate::sizes::{self, Range};
use ncclbpf_tuner::decide::{Collective, run_policy};
use policy_runtime::{LoadError, LoadOptions, LoadedProgram, ProgramSlot};
use serde_json::{Value, json};
use shared_maps::{Registry, RegistryError};
use std::io;
use std::path::{Path, PathBuf};

/// Show a tuner policy's decisions (algorithm, protocol, channels) by message size.
#[derive(clap::Args)]
#[command(after_help = concat!(
    "Examples:
  ncclbpf decisions size_aware.o                             # every collective, 8 B to 4 GiB
  ncclbpf decisions size_aware.o --coll allreduce --ranks 16 --nodes 4
  ncclbpf decisions size_aware.o --sizes 1K..64M --program size_aware
  ncclbpf decisions --json size_aware.o | jq '.collectives[0].ranges'
  ncclbpf decisions --compare $(pgrep -f train.py)           # did the ranks decide alike?
  ncclbpf decisions --compare 4242 4243 --json | jq '.communicators[] | {comm_id, verdict}'

The policy runs as in the plugin (verified, then JIT-compiled, or interpreted with
NCCL_BPF_JIT=0), once per power-of-two size of --sizes and collective, in that order, with
comm_id 0, one pipelined op and no registered buffer. Its maps start as in a fresh job (zeroed,
global data from the object) and are private to this run: nothing is published for
`ncclbpf maps`. Each row is a range of the sizes tried with the same answer: the policy switches
after a row's last size, at or before the next row's first. \"NCCL's choice\" is -1 (algorithm, protocol) or 0 (channels): the plugin leaves
NCCL's own choice there. Algorithms: TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE,
PAT; protocols: LL, LL128, SIMPLE.

--compare reads, from each running process, the decisions its tuner made for each
communicator (map ncclbpf_decisions: per communicator the sequence number of the last decision,
a digest of all of them, and the digest at every 256th, the last 16 kept) and compares the
processes that share a communicator at every sequence number they all have a digest for (their
common checkpoints, and the current one when all stand at the same number). It prints, per
communicator, each process's seq and digest and where they agree, or the first common point
where they differ: the decisions diverged after the last agreeing point and at or before that
one. A communicator in only one of the processes is listed and not compared.

",
    "Exit status:
  0  the policy loaded and ran; --compare: every communicator compared agrees
  1  the policy is bad: not a valid policy object, or it fails to verify or load (the verifier's
     message is printed); --compare: a communicator's processes decided differently (named,
     with the first point where they differ)
  2  usage or I/O error (no such file, no tuner program, bad arguments); --compare: a process
     that is gone or cannot be read, a process without decision records, nothing compared"
))]
pub struct Args {
    /// A policy object with a `SEC("tuner")` program.
    #[arg(required_unless_present = "compare")]
    pub policy: Option<PathBuf>,
    /// Collectives, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "COLL,...",
        default_value = "broadcast,reduce,allgather,reducescatter,allreduce"
    )]
    pub coll: Vec<Coll>,
    /// Ranks in the communicator (the policy's `nranks`).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub ranks: u32,
    /// Nodes the ranks are on (the policy's `nnodes`).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub nodes: u32,
    /// Message sizes, `LO..HI` inclusive (or one size): suffixes B, K/KiB, M/MiB, G/GiB, T/TiB,
    /// powers of 1024; every power of two in the range is tried.
    #[arg(long, default_value = "8B..4GiB", value_name = "LO..HI")]
    pub sizes: Range,
    /// The tuner program of this name (default: the object's first `tuner` program, as
    /// NCCL_BPF_TUNER_PROGRAM picks in the plugin).
    #[arg(long, value_name = "NAME")]
    pub program: Option<String>,
    /// Compare the decisions running processes made, per communicator, instead of running a
    /// policy (process ids, e.g. every rank of a job on this host).
    #[arg(
        long,
        num_args = 1..,
        value_name = "PID",
        conflicts_with_all = ["policy", "coll", "ranks", "nodes", "sizes", "program"]
    )]
    pub compare: Vec<u32>,
    /// Print one JSON document: {policy, program, ranks, nodes, sizes, collectives: [{name,
    /// coll_type, ranges: [{min_bytes, max_bytes, algo, algorithm, proto, protocol,
    /// nchannels}]}]} (algorithm and protocol are NCCL's names, null for NCCL's choice).
    /// With --compare: {processes: [{pid, records, problem}], communicators: [{comm_id,
    /// verdict (agree, differ, alone, no_policy, no_common_point), message, agreed_at,
    /// first_difference: {seq, last_agreement, digests: [{pid, context, digest}]}, contexts:
    /// [{pid, context, seq, digest, policy, finalized, unsequenced, nranks, nnodes, interval,
    /// checkpoints: [{seq, digest}]}]}], compared, agree} (ids and digests as hex strings).
    #[arg(long)]
    pub json: bool,
}

/// One answer of the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Answer {
    algo: i32,
    proto: i32,
    nchannels: u32,
}

/// Sizes `lo..=hi` (of those tried) that got the same answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    lo: u64,
    hi: u64,
    answer: Answer,
}

/// Loads `prog` for the tuner hook with maps that stay in this process: the registry's
/// directory can never be created (a path under /dev/null), and publishing is best effort, so
/// no `<pid>.maps` file is ever written.
fn load(policy: &Path, program: Option<&str>) -> Result<LoadedProgram, Failure> {
    let obj = object::read(policy)?;
    let prog = match program {
        Some(n) => obj.program(n).ok_or_else(|| {
            Failure::Usage(format!(
                "{}: no program {n:?} (the object has: {})",
                policy.display(),
                object::list(&obj)
            ))
        })?,
        None => obj
            .programs
            .iter()
            .find(|p| p.section == "tuner")
            .ok_or_else(|| {
                Failure::Usage(format!(
                    "{}: no program in a 'tuner' section (the object has: {})",
                    policy.display(),
                    object::list(&obj)
                ))
            })?,
    };
    if prog.section != "tuner" {
        return Err(Failure::Usage(format!(
            "{}: program '{}' is in section '{}', not 'tuner'",
            policy.display(),
            prog.name,
            prog.section
        )));
    }
    let registry = Registry::new(PathBuf::from("/dev/null/ncclbpf-decisions"));
    LoadedProgram::load(&obj, Some(&prog.name), &registry, &LoadOptions::default()).map_err(|e| {
        let msg = format!("{}: {e}", policy.display());
        // The system's failures (executable memory, shared memory) are not the policy's.
        match e {
            LoadError::Exec(_) => Failure::Usage(msg),
            LoadError::Map(RegistryError::Create { source, .. })
                if source.kind() != io::ErrorKind::InvalidInput =>
            {
                Failure::Usage(msg)
            }
            _ => Failure::Bad(msg),
        }
    })
}

pub fn run(out: &mut Out, a: &Args) -> Outcome {
    if !a.compare.is_empty() {
        return compare::run(out, &a.compare, a.json);
    }
    let Some(policy) = a.policy.as_deref() else {
        return Err(Failure::Usage(
            "a policy object (or --compare PID...) is needed".into(),
        ));
    };
    if a.ranks == 0 || a.nodes == 0 || a.nodes > a.ranks {
        return Err(Failure::Usage(format!(
            "--ranks {} --nodes {}: need 1 <= nodes <= ranks",
            a.ranks, a.nodes
        )));
    }
    let mut colls: Vec<Coll> = Vec::new();
    for c in &a.coll {
        if !colls.contains(c) {
            colls.push(*c);
        }
    }
    let loaded = load(policy, a.program.as_deref())?;
    let name = loaded.name.clone();
    let slot = ProgramSlot::new(loaded);
    let mut handle = slot.handle();
    let sizes = a.sizes.powers_of_two();
    let tables: Vec<(Coll, Vec<Row>)> = colls
        .iter()
        .map(|&coll| {
            let mut rows: Vec<Row> = Vec::new();
            for &n in &sizes {
                let ctx = run_policy(
                    &mut handle,
                    &Collective {
                        coll_type: coll.func().0,
                        n_bytes: n as usize,
                        num_pipe_ops: 1,
                        reg_buff: 0,
                        comm_id: 0,
                        nranks: a.ranks,
                        nnodes: a.nodes,
                        max_channels: 0,
                    },
                );
                let answer = Answer {
                    algo: ctx.algo,
                    proto: ctx.proto,
                    nchannels: ctx.nchannels,
                };
                match rows.last_mut() {
                    Some(r) if r.answer == answer => r.hi = n,
                    _ => rows.push(Row {
                        lo: n,
                        hi: n,
                        answer,
                    }),
                }
            }
            (coll, rows)
        })
        .collect();

    if a.json {
        out.json(&json!({
            "policy": policy.display().to_string(),
            "program": name,
            "ranks": a.ranks,
            "nodes": a.nodes,
            "sizes": { "min_bytes": a.sizes.lo, "max_bytes": a.sizes.hi },
            "collectives": tables.iter().map(|(c, rows)| json!({
                "name": c.name(),
                "coll_type": c.func().0,
                "ranges": rows.iter().map(row_json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }))?;
        return Ok(Verdict::Good);
    }

    outln!(
        out,
        "{name} ({}): {} ranks on {} node{}, {} ({})",
        policy.display(),
        a.ranks,
        a.nodes,
        if a.nodes == 1 { "" } else { "s" },
        a.sizes,
        match sizes.len() {
            1 => "1 size".to_string(),
            n => format!("{n} sizes, powers of two"),
        }
    );
    // Collectives with the same table share one.
    let mut groups: Vec<(Vec<Coll>, &Vec<Row>)> = Vec::new();
    for (c, rows) in &tables {
        match groups.iter_mut().find(|(_, r)| *r == rows) {
            Some((cs, _)) => cs.push(*c),
            None => groups.push((vec![*c], rows)),
        }
    }
    let mut invalid = false;
    for (colls, rows) in groups {
        let names: Vec<&str> = colls.iter().map(|c| c.name()).collect();
        outln!(out, "\n{}:", names.join(", "));
        let cells: Vec<[String; 4]> = rows
            .iter()
            .map(|r| {
                let (algo, proto) = (Choice::algo(r.answer.algo), Choice::proto(r.answer.proto));
                invalid |=
                    matches!(algo, Choice::Invalid(_)) || matches!(proto, Choice::Invalid(_));
                [
                    if r.lo == r.hi {
                        sizes::show(r.lo)
                    } else {
                        format!("{} .. {}", sizes::show(r.lo), sizes::show(r.hi))
                    },
                    algo.text(),
                    proto.text(),
                    match r.answer.nchannels {
                        0 => NCCLS_CHOICE.to_string(),
                        n => n.to_string(),
                    },
                ]
            })
            .collect();
        let head = ["size", "algorithm", "protocol", "channels"].map(String::from);
        let mut width = [0usize; 4];
        for row in std::iter::once(&head).chain(&cells) {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        for row in std::iter::once(&head).chain(&cells) {
            let line = format!(
                "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
                row[0],
                row[1],
                row[2],
                row[3],
                w0 = width[0],
                w1 = width[1],
                w2 = width[2]
            );
            outln!(out, "{}", line.trim_end());
        }
    }
    if invalid {
        outln!(
            out,
            "\ninvalid: a number outside NCCL's algorithms or protocols; there the plugin ignores \
             the policy's algorithm and protocol, and NCCL keeps its own"
        );
    }
    Ok(Verdict::Good)
}

fn row_json(r: &Row) -> Value {
    json!({
        "min_bytes": r.lo,
        "max_bytes": r.hi,
        "algo": r.answer.algo,
        "algorithm": Choice::algo(r.answer.algo).json(),
        "proto": r.answer.proto,
        "protocol": Choice::proto(r.answer.proto).json(),
        "nchannels": r.answer.nchannels,
    })
}
