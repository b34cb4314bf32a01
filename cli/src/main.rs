//! `ncclbpf`: verify and inspect policies before deploying them, show what a tuner policy
//! decides, and read the maps of a running (or hung) job from outside.
//!
//! Each subcommand is one module holding its arguments (`Args`, with its `--help` text) and a
//! `run` that returns an [`exit::Outcome`]; this file only lists them and turns outcomes into
//! exit statuses. A new subcommand is a module and a line in [`Cmd`] and in [`main`]; one with
//! subcommands of its own (`ncclbpf rules check FILE`) is a variant holding a
//! `#[derive(Subcommand)]` enum of its module, e.g. `Rules { #[command(subcommand)] cmd:
//! rules::Cmd }`, dispatched by that module's `run`.

#![forbid(unsafe_code)]

mod collectives;
mod compare;
mod decisions;
mod exit;
mod exporter;
mod inspect;
mod maps;
mod nccl;
mod object;
mod out;
mod reload;
mod rules;
mod sizes;
mod status;
mod verify;
mod watch;

use clap::{Parser, Subcommand};
use out::Out;
use std::io::{self, Write};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ncclbpf",
    version,
    about = "Verify and inspect ncclbpf policies, show a tuner policy's decisions, read a job's maps",
    after_help = concat!(
        "Examples:
  ncclbpf verify target/policies/src/size_aware.o
  ncclbpf inspect target/policies/src/size_aware.o
  ncclbpf decisions target/policies/src/size_aware.o --coll allreduce
  ncclbpf decisions --compare 12345 12346
  ncclbpf maps $(pgrep -n python)
  ncclbpf rules check nccl_tuner.conf
  ncclbpf status --all --stall-after 30
  ncclbpf status --all --watch
  ncclbpf exporter --listen 127.0.0.1:9464
  ncclbpf reload 12345 my_net_policy.o
  ncclbpf config --at-seq +5000 --all slo_budget_ns 3=200000

`ncclbpf help <command>` or `ncclbpf <command> --help` for each command's options, examples and
exit statuses; --json on verify, inspect, decisions, maps and status prints one JSON document.

",
        "Exit status:
  0  success
  1  the thing checked is bad: a program rejected by the verifier, a file that is not a valid
     policy object, a tuner policy that fails to load
  2  usage or I/O error: bad arguments, a file or process that cannot be read, no such program
     or map, output that cannot be written"
    )
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the verifier on a policy object's programs: verdict and log (exit 1 if rejected).
    Verify(verify::Args),
    /// Show a policy object's programs (hooks), maps and instructions with C source lines.
    #[command(visible_alias = "disasm")]
    Inspect(inspect::Args),
    /// Show what a tuner policy decides (algorithm, protocol, channels) by size, without NCCL;
    /// or (--compare) whether running ranks decided alike.
    Decisions(decisions::Args),
    /// Show the maps of a running process and their non-zero entries (read-only).
    Maps(maps::Args),
    /// Show what the profiler measured in a running process: GPU time and bus bandwidth per
    /// communicator, collective, size, algorithm and protocol (read-only).
    Collectives(collectives::Args),
    /// Swap an object's net programs into running processes (live reload).
    #[command(after_help = "Examples:
  ncclbpf reload 12345 target/policies/src/net_stats.o
  ncclbpf reload --all my_net_policy.o
  ncclbpf reload --json 12345 67890 my_net_policy.o
  ncclbpf reload --at-seq +5000 --all size_aware.o        # a tuner program, 5000 collectives on

Each process loads, verifies and compiles the object on its control thread and swaps every
net/* program of it in at once; maps with the same name and shape keep their contents. Any
failure leaves every hook as it was. A plain reload leaves tuner programs out: a tuner swap must
take effect at the same collective on every rank. --at-seq N stages the object's tuner program
in every process: each communicator's N-th collective (counted alike on every rank) and all
later ones are decided by it. A process where a communicator is past N, or fewer than 64
collectives before it, refuses; then the stage is withdrawn from the processes that accepted,
so that all switch or none does. `ncclbpf status` shows each communicator's count. New values
for a tuner policy's config map are staged the same way: `ncclbpf config --at-seq`.

Exit status:
  0  every process accepted
  1  a process rejected the object (its programs kept running)
  2  usage error, or a process that could not be asked")]
    Reload {
        /// Process ids (or --all), then the object.
        #[arg(required = true, num_args = 1.., value_name = "PID... OBJECT")]
        args: Vec<String>,
        /// Every live process of this user with a control socket.
        #[arg(long)]
        all: bool,
        /// Stage the object's tuner program: it makes every communicator's decisions from
        /// collective N on (the same collective on every rank); +M: M after the highest count
        /// any communicator of the processes has now. All processes or none.
        #[arg(long, value_name = "N|+M")]
        at_seq: Option<reload::AtSeq>,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Stage new values for a tuner policy's config map in running processes, taking effect at
    /// one collective of every communicator.
    #[command(
        override_usage = "ncclbpf config --at-seq <N|+M> [--json] (--all | <PID>...) <MAP> <ENTRY=VALUE>...",
        after_help = "Examples:
  ncclbpf config --at-seq +5000 --all slo_budget_ns 3=200000 5=2000000
  ncclbpf config --at-seq 1000000 12345 12346 limit 0=100
  ncclbpf config --at-seq +5000 --json --all slo_budget_ns 3=0x30d40

A config map is an array of u64 values that a tuner policy declares NCCLBPF_CONFIG and only
reads: its settings. slo_enforcer's slo_budget_ns, for example, holds one latency budget in
nanoseconds per size class (0: none); the first example gives class 3 (64-256 KiB) 200 µs and
class 5 (1-4 MiB) 2 ms. ENTRY is the entry's index, VALUE decimal or 0x hex; entries not named
keep their values.

The new values take effect at collective N of every communicator in every process (each
communicator counts its collectives alike on every rank), so all ranks decide with them from the
same collective on; +M means M after the highest count any communicator of the processes has
now (`ncclbpf status` lists the counts). A process refuses when one of its communicators is past
N or fewer than 64 collectives before it, when its tuner program has no such config map or
entry, or when one of its communicators reads the process-wide config maps: only tuner contexts
that run the agreement keep their own view of them, which a policy with agreed data does by
itself and any other with NCCL_BPF_AGREEMENT=on set when the job starts. All or nothing: if any
process refuses, the update is withdrawn from the processes that accepted (INCONSISTENT says
which process would change alone if that fails). Each process logs `config MAP ENTRY=VALUE,...
from seq N on` for each communicator as it takes the values.

Exit status:
  0  every process accepted
  1  a process refused the update (withdrawn from the others)
  2  usage error, or a process that could not be asked"
    )]
    Config {
        /// Process ids (or --all), then the config map, then its new values as ENTRY=VALUE.
        #[arg(required = true, num_args = 1.., value_name = "PID... MAP ENTRY=VALUE")]
        args: Vec<String>,
        /// Every live process of this user with a control socket.
        #[arg(long)]
        all: bool,
        /// The collective from which every communicator sees the new values (the same on every
        /// rank); +M: M after the highest count any communicator of the processes has now.
        #[arg(long, value_name = "N|+M", required = true)]
        at_seq: reload::AtSeq,
        /// Print one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// What runs at each net hook of running processes, their connections (from shared
    /// memory), and which connections stalled.
    Status(status::Args),
    /// Serve Prometheus metrics of this user's ncclbpf processes on this node, read from
    /// shared memory (keeps serving while ranks hang).
    Exporter(exporter::Args),
    /// Tuner rules files (NCCL's nccl_tuner.conf format): `rules check FILE`.
    Rules {
        #[command(subcommand)]
        cmd: rules::Cmd,
    },
}

/// `reload`/`config`/`status`: the control-socket commands print their own verdicts.
fn control(cmd: &Cmd) -> Option<ExitCode> {
    let fail = |e: String| {
        let _ = writeln!(io::stderr(), "ncclbpf: {e}");
        ExitCode::from(reload::FAILED)
    };
    match cmd {
        Cmd::Reload {
            args,
            all,
            at_seq,
            json,
        } => {
            let (object, pids) = args.split_last().expect("clap requires one");
            let pids: Result<Vec<u32>, String> = pids
                .iter()
                .map(|p| p.parse().map_err(|_| format!("{p:?} is not a process id")))
                .collect();
            Some(match pids.and_then(|p| reload::Targets::new(p, *all)) {
                Ok(t) => reload::run(&t, std::path::Path::new(object), *at_seq, *json),
                Err(e) => fail(e),
            })
        }
        Cmd::Config {
            args,
            all,
            at_seq,
            json,
        } => Some(match reload::config_args(args, *all) {
            Ok(c) => reload::config(&c, *at_seq, *json),
            Err(e) => fail(e),
        }),
        Cmd::Status(a) => Some(status::run(a)),
        Cmd::Exporter(a) => Some(exporter::run(a)),
        _ => None,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(code) = control(&cli.cmd) {
        return code;
    }
    let mut out = Out::new();
    let r = match &cli.cmd {
        Cmd::Verify(a) => verify::run(&mut out, a),
        Cmd::Inspect(a) => inspect::run(&mut out, a),
        Cmd::Decisions(a) => decisions::run(&mut out, a),
        Cmd::Maps(a) => maps::run(&mut out, a),
        Cmd::Collectives(a) => collectives::run(&mut out, a),
        Cmd::Rules { cmd } => rules::run(&mut out, cmd),
        Cmd::Reload { .. } | Cmd::Config { .. } | Cmd::Status(_) | Cmd::Exporter(_) => {
            unreachable!("handled by control()")
        }
    };
    // What was printed goes out before an error message; a write error is itself one.
    let r = match (out.finish(), r) {
        (_, Err(e)) | (Err(e), Ok(_)) => Err(e),
        (Ok(()), Ok(v)) => Ok(v),
    };
    match r {
        Ok(v) => v.code(),
        Err(e) => {
            // Nothing more to do if stderr is gone too.
            let _ = writeln!(io::stderr(), "ncclbpf: {}", e.message());
            e.code()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
