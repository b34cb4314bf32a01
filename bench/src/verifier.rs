//! Verification cost of every shipped and safe-corpus program: instructions, processed
//! instructions (the verifier's work, over all explored paths), states stored, states pruned,
//! and the time of one verification (best of `NCCLBPF_BENCH_ROUNDS`, default 20).
//!
//! `policies/build.sh && cargo run --release -p ncclbpf-bench --bin verifier-bench` prints a
//! Markdown table; an argument names another directory of objects (default: target/policies
//! `src` and `safe`).

use policy_object::Object;
use policy_verifier::{Limits, map_infos, verify};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn objects(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut v = vec![];
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            eprintln!("{}: not found (run policies/build.sh)", d.display());
            continue;
        };
        let mut files: Vec<_> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "o"))
            .collect();
        files.sort();
        v.extend(files);
    }
    v
}

fn label(p: &Path) -> String {
    let dir = p
        .parent()
        .and_then(|d| d.file_name())
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(
        "{dir}/{}",
        p.file_stem().unwrap_or_default().to_string_lossy()
    )
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies");
    let dirs: Vec<PathBuf> = match std::env::args().nth(1) {
        Some(d) => vec![PathBuf::from(d)],
        None => vec![root.join("src"), root.join("safe")],
    };
    let rounds: u32 = std::env::var("NCCLBPF_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    println!("| program | insns | processed | states | pruned | verify (µs) |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut total = 0usize;
    for path in objects(&dirs) {
        let bytes = std::fs::read(&path).expect("readable object");
        let obj = match Object::parse(&bytes) {
            Ok(o) => o,
            Err(e) => {
                println!("| {} | parse error: {e} | | | | |", label(&path));
                continue;
            }
        };
        let maps = map_infos(&obj.maps);
        for p in &obj.programs {
            let mut best = f64::MAX;
            let mut last = None;
            for _ in 0..rounds.max(1) {
                let t = Instant::now();
                let r = verify(p, &maps, Limits::default());
                best = best.min(t.elapsed().as_secs_f64() * 1e6);
                last = Some(r);
            }
            match last.expect("one round") {
                Ok(s) => {
                    total += s.processed;
                    println!(
                        "| {} `{}` | {} | {} | {} | {} | {best:.1} |",
                        label(&path),
                        p.name,
                        s.insns,
                        s.processed,
                        s.states,
                        s.pruned
                    );
                }
                Err(e) => println!(
                    "| {} `{}` | rejected: {} | | | | {best:.1} |",
                    label(&path),
                    p.name,
                    e.kind()
                ),
            }
        }
    }
    println!("\ntotal processed instructions: {total}");
}
