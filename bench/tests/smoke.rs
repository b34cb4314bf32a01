//! CI smoke of the benchmarks: each subcommand runs (the quick form, a few seconds in all) and
//! prints its table. No figure is checked: performance goals are read from the full runs
//! (BENCHMARKS.md), not asserted by tests that would flake on a shared machine.

use std::process::Command;

fn bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ncclbpf-bench"))
        .args(args)
        .output()
        .expect("run ncclbpf-bench");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ncclbpf-bench {args:?}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn help_of_every_subcommand() {
    for sub in ["loopback", "comms", "hooks", "zerocopy", "ring"] {
        assert!(bench(&[sub, "--help"]).contains("Usage:"), "{sub} --help");
    }
    // The old invocation (no subcommand) is loopback.
    assert!(bench(&["--help"]).contains("--streams"));
}

#[test]
fn loopback_quick_prints_both_tables() {
    let t = bench(&["loopback", "--quick"]);
    for want in [
        "#### Latency",
        "#### Throughput",
        "| 8 B |",
        "| 64 KiB | 8 |",
    ] {
        assert!(t.contains(want), "no {want:?} in\n{t}");
    }
}

#[test]
fn hooks_quick_prints_its_table() {
    let t = bench(&["hooks", "--quick"]);
    assert!(t.contains("| hook calls of one request"), "{t}");
    assert!(t.contains("tuner-bench.sh"), "{t}");
}

#[test]
fn zerocopy_quick_prints_its_table() {
    let t = bench(&["zerocopy", "--quick"]);
    assert!(t.contains("command: "), "{t}");
    // A kernel that refuses SO_ZEROCOPY gets a line that says so, and no table.
    assert!(
        t.contains("| 64 KiB |") || t.contains("SO_ZEROCOPY refused"),
        "no table in\n{t}"
    );
}

#[test]
fn comms_opens_and_closes_ten() {
    let t = bench(&["comms", "--counts", "10"]);
    let row = t
        .lines()
        .find(|l| l.starts_with("| 10 |"))
        .unwrap_or_else(|| panic!("no row in\n{t}"));
    assert!(row.contains("| ok"), "{row}");
}

#[test]
fn raw_tcp_over_one_way_connections_measures_a_latency() {
    for arm in ["tcp-poll", "tcp-poll-one-way"] {
        let t = bench(&[
            "arm",
            "--arm",
            arm,
            "--test",
            "lat",
            "--size",
            "1024",
            "--budget-ms",
            "20",
        ]);
        let us: f64 = t
            .lines()
            .find_map(|l| l.strip_prefix("@result value "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{arm}: no latency in\n{t}"));
        assert!(us > 0.0, "{arm}: {us}");
    }
}

#[test]
fn ring_runs_both_backends_and_checks_the_result() {
    // 3 ranks (uneven segments), a size inline and one cut into chunks, one round.
    let t = bench(&[
        "ring",
        "--nranks",
        "3",
        "--sizes",
        "8,12,256K",
        "--rounds",
        "1",
    ]);
    for want in [
        "| 8 B | 100 |",
        "| 12 B | 100 |",
        "| 256 KiB | 100 |",
        "plugin speed vs raw TCP",
    ] {
        assert!(t.contains(want), "no {want:?} in\n{t}");
    }
    // Both backends gave a figure for every size (a failed rank leaves "–").
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains(" | 100 |"))
        .collect();
    assert_eq!(rows.len(), 3, "{t}");
    assert!(
        rows.iter().all(|r| r.split('|').all(|c| c.trim() != "–")),
        "{t}"
    );
    // net_stats is attached by default and counted the ring's messages.
    assert!(t.contains("sent ") && t.contains(" messages"), "{t}");
}
