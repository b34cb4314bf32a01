//! `ncclbpf-bench`: the net data path measured against the best alternative, each benchmark one
//! command printing a markdown table with every comparison of it from the same run.
//!
//! ```text
//! scripts/build.sh && policies/build.sh
//! cargo run --release -p ncclbpf-bench -- loopback [--rounds 3] [--quick]
//! cargo run --release -p ncclbpf-bench -- comms --counts 10,100,1000
//! cargo run --release -p ncclbpf-bench -- hooks [--rounds 5] [--quick]
//! cargo run --release -p ncclbpf-bench -- ring [--nranks 4] [--sizes 8,1M,64M] [--rounds 3]
//! cargo run --release -p ncclbpf-bench -- zerocopy [--sizes 64K,1M] [--streams 4] [--quick]
//! cargo run --release -p ncclbpf-bench -- interposer [--rounds 5] [--quick]
//! ```
//! With no subcommand it runs `loopback` (the options of `loopback` apply). The plugin is
//! `$NCCLBPF_PLUGIN`, else the harness's default path; `NCCL_BPF_*` settings of the
//! environment apply to every plugin arm. Measurements run in child processes of this binary
//! (the hidden subcommands `arm`, `ring-rank`, `comms-child`, `hook-direct`, `interposer-child`).

mod common;
mod comms;
mod hookcost;
mod interposer;
mod loopback;
mod ring;
mod transport;
mod zerocopy;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ncclbpf-bench",
    about = "The net plugin's data path against raw TCP on loopback, its hooks' cost, and what \
             open comms cost a process",
    args_conflicts_with_subcommands = true,
    after_help = "Without a subcommand: loopback (its options apply)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    loopback: loopback::Args,
}

#[derive(Subcommand)]
enum Cmd {
    /// Latency (8 B–1 MiB) and throughput (64 KiB–256 MiB): the plugin with conn_counter, with
    /// no policy, raw TCP blocking and busy-polling over the same streams; ratios and spread
    /// over rounds.
    Loopback(loopback::Args),
    /// Threads, file descriptors and idle CPU of one process with N comm pairs open.
    Comms(comms::Args),
    /// Per-operation cost of the net hooks, conn_counter against no policy.
    Hooks(hookcost::Args),
    /// Throughput of plain send against send(MSG_ZEROCOPY) over TCP loopback (64 KiB–16 MiB,
    /// N streams), their ratio, and how often the kernel copied the zero-copy sends anyway.
    Zerocopy(zerocopy::Args),
    /// The demo's job: a ring all-reduce of N processes through the plugin and over raw TCP on
    /// the same streams, warm, checked, median of many iterations per size; their ratio.
    Ring(ring::Args),
    /// The interposer's own cost per request (NCCL_BPF_NET_INNER over a plugin that completes
    /// every request at once) against that plugin loaded directly; no policy and conn_counter.
    Interposer(interposer::Args),
    /// (internal) One arm of `interposer`, in a child process.
    #[command(hide = true)]
    InterposerChild(interposer::ChildArgs),
    /// (internal) One loopback measurement, in a child process.
    #[command(hide = true)]
    Arm(loopback::ArmArgs),
    /// (internal) One rank of `ring`, in a child process.
    #[command(hide = true)]
    RingRank(ring::RankArgs),
    /// (internal) One row of `comms`, in a child process.
    #[command(hide = true)]
    CommsChild(comms::ChildArgs),
    /// (internal) The in-process view of `hooks`, in a child process.
    #[command(hide = true)]
    HookDirect(hookcost::DirectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.cmd {
        None => loopback::run(&cli.loopback),
        Some(Cmd::Loopback(a)) => loopback::run(a),
        Some(Cmd::Comms(a)) => comms::run(a),
        Some(Cmd::Hooks(a)) => hookcost::run(a),
        Some(Cmd::Zerocopy(a)) => zerocopy::run(a),
        Some(Cmd::Ring(a)) => ring::run(a),
        Some(Cmd::RingRank(a)) => ring::rank_main(a),
        Some(Cmd::Interposer(a)) => interposer::run(a),
        Some(Cmd::InterposerChild(a)) => interposer::child_main(a),
        Some(Cmd::Arm(a)) => loopback::arm_main(a),
        Some(Cmd::CommsChild(a)) => comms::child_main(a),
        Some(Cmd::HookDirect(a)) => hookcost::direct_main(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ncclbpf-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
