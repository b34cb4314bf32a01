//! What the metrics cost: `cargo run --release -p ncclbpf-metrics --example cost`.
//!
//! 1. The data path: a connection-table slot's post + completion, without and with the
//!    policy-run counts (`ConnSlotGuard::ran`, done only when a policy program runs).
//! 2. A scrape: rendering 10,000 connection ends of one process (a table of 10,000 slots in
//!    a scratch registry), time and size, and with `--max-connections`-style budgets.

use ncclbpf_metrics::collect::{Options, render};
use shared_maps::{ConnDirection, ConnLabels, ConnTable, Registry};
use std::hint::black_box;
use std::time::Instant;

fn labels(i: u64) -> ConnLabels {
    ConnLabels {
        direction: if i.is_multiple_of(2) {
            ConnDirection::Send
        } else {
            ConnDirection::Recv
        },
        conn_id: 0x1000 + i,
        comm_id: 0xa9ee_0000 + i % 4,
        dev: (i % 8) as u32,
        peer_ip: Some(format!("10.0.{}.{}", i / 250, i % 250).parse().unwrap()),
        peer_port: 40000 + (i % 20000) as u16,
        local_port: 30000 + (i % 20000) as u16,
    }
}

fn main() {
    let t = ConnTable::new(1);
    let g = t.register(&labels(0)).unwrap();
    const N: u32 = 20_000_000;
    for round in 0..3 {
        let a = Instant::now();
        for _ in 0..N {
            g.posted();
            g.completed(black_box(4096));
        }
        let plain = a.elapsed().as_nanos() as f64 / f64::from(N);
        let a = Instant::now();
        for _ in 0..N {
            g.posted();
            g.ran(false);
            g.completed(black_box(4096));
            g.ran(true);
        }
        let counted = a.elapsed().as_nanos() as f64 / f64::from(N);
        println!(
            "round {round}: post+complete {plain:.1} ns; with both policy-run counts {counted:.1} ns"
        );
    }
    drop(g);

    let dir = std::env::temp_dir().join(format!("ncclbpf-metrics-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let r = Registry::new(dir.clone());
    const CONNS: u64 = 10_000;
    let table = ConnTable::shared(&r, CONNS as usize).unwrap();
    let guards: Vec<_> = (0..CONNS)
        .map(|i| {
            let g = table.register(&labels(i)).unwrap();
            g.posted();
            g.completed(1 << 20);
            g
        })
        .collect();
    let host = "node-001".to_string();
    for max in [10_000usize, 4096, 1000, 0] {
        let opts = Options {
            max_connections: max,
            map_entries: 64,
            host: host.clone(),
        };
        // The best of five (the first also maps the segment and reads /proc).
        let mut text = String::new();
        let mut took = std::time::Duration::MAX;
        for _ in 0..5 {
            let a = Instant::now();
            text = render(&dir, None, &opts);
            took = took.min(a.elapsed());
        }
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        println!(
            "{CONNS} connection ends, --max-connections {max}: {samples} samples, {:.1} MiB, rendered in {:.0} ms (best of 5)",
            text.len() as f64 / (1 << 20) as f64,
            took.as_secs_f64() * 1e3
        );
    }
    drop(guards);
    let _ = std::fs::remove_dir_all(&dir);
}
