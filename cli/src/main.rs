//! `ncclbpf`: verify and inspect policies before deploying them, show what a tuner policy
//! decides, and read the maps of a running (or hung) job from outside.
//!
//! Each subcommand is one module holding its arguments (`Args`, with its `--help` text) and a
//! `run` that returns an [`exit::Outcome`]; this file only lists them and turns outcomes into
//! exit statuses. A new subcommand is a module and a line in [`Cmd`] and in [`main`]; one with
//! subcommands of its own (`ncclbpf rules check FILE`) is a variant holding a
//! `#[derive(Subcommand)]` enum of its module, e.g. `Rules { #[command(subcommand)] cmd:
//! rules::Cmd }`, dispatched by that module's `run`.

mod decisions;
mod exit;
mod inspect;
mod maps;
mod nccl;
mod object;
mod out;
mod rules;
mod sizes;
mod verify;

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
  ncclbpf maps $(pgrep -n python)
  ncclbpf rules check nccl_tuner.conf

`ncclbpf help <command>` or `ncclbpf <command> --help` for each command's options, examples and
exit statuses; --json on verify, inspect, decisions and maps prints one JSON document.

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
    /// Show what a tuner policy decides (algorithm, protocol, channels) by size, without NCCL.
    Decisions(decisions::Args),
    /// Show the maps of a running process and their non-zero entries (read-only).
    Maps(maps::Args),
    /// Tuner rules files (NCCL's nccl_tuner.conf format): `rules check FILE`.
    Rules {
        #[command(subcommand)]
        cmd: rules::Cmd,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = Out::new();
    let r = match &cli.cmd {
        Cmd::Verify(a) => verify::run(&mut out, a),
        Cmd::Inspect(a) => inspect::run(&mut out, a),
        Cmd::Decisions(a) => decisions::run(&mut out, a),
        Cmd::Maps(a) => maps::run(&mut out, a),
        Cmd::Rules { cmd } => rules::run(&mut out, cmd),
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
