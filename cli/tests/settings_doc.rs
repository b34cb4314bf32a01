//! The settings reference (`docs/reference/settings.md`) against the code: every `NCCL_BPF_*`
//! variable the library or the CLI reads has exactly one row in its tables (or is listed as no
//! longer read), and every variable a row names is read somewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose sources make up the library NCCL loads, and the `ncclbpf` command.
const CRATES: [&str; 14] = [
    "ncclnet-headers",
    "shared-maps",
    "netplugin",
    "tuner",
    "control",
    "agreement",
    "metrics",
    "profiler",
    "envplugin",
    "plugin",
    "policy-runtime",
    "policy-verifier",
    "cli",
    "host",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs")
            && !p.file_name().unwrap().to_string_lossy().contains("test")
        {
            out.push(p);
        }
    }
}

/// `"NAME"` string literals that look like a setting (`NCCL_` and upper case).
fn literals(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let needle = format!("\"{prefix}");
    let mut rest = text;
    while let Some(i) = rest.find(&needle) {
        let tail = &rest[i + 1..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if tail[end..].starts_with('"') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

fn code_text() -> String {
    let mut files = vec![];
    for c in CRATES {
        rust_files(&root().join(c).join("src"), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Variable -> how many table rows name it in their first cell; and the "No longer read" ones.
fn documented() -> (BTreeMap<String, usize>, BTreeSet<String>) {
    let doc = std::fs::read_to_string(root().join("docs/reference/settings.md")).unwrap();
    let mut rows = BTreeMap::new();
    let mut gone = BTreeSet::new();
    for line in doc.lines() {
        if let Some(cell) = line.strip_prefix("| ").and_then(|l| l.split(" | ").next()) {
            for name in cell.split('`').skip(1).step_by(2) {
                if name.starts_with("NCCL_") {
                    *rows.entry(name.to_string()).or_insert(0) += 1;
                }
            }
        }
        if let Some(rest) = line.strip_prefix("No longer read:") {
            gone.extend(
                rest.split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|n| n.starts_with("NCCL_BPF_"))
                    .map(str::to_string),
            );
        }
    }
    (rows, gone)
}

#[test]
fn every_setting_the_code_reads_has_one_row_and_every_row_is_read() {
    let code = code_text();
    let read = literals(&code, "NCCL_BPF_");
    assert!(read.contains("NCCL_BPF_NSTREAMS"), "{read:?}");
    let (rows, gone) = documented();
    let mut problems = vec![];
    for v in &read {
        match rows.get(v) {
            Some(1) => {}
            Some(n) => problems.push(format!("{v}: {n} rows")),
            None if gone.contains(v) => {}
            None => problems.push(format!("{v}: read by the code, not in the settings tables")),
        }
    }
    for v in rows.keys() {
        if !literals(&code, "NCCL_").contains(v) {
            problems.push(format!("{v}: a row, but no code reads it"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/reference/settings.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scan_finds_literals_and_rows() {
    let l = literals(
        r#"x("NCCL_BPF_A") "NCCL_BPF_B_2" "NCCL_BPF_c" NCCL_BPF_D"#,
        "NCCL_BPF_",
    );
    assert_eq!(
        l,
        BTreeSet::from(["NCCL_BPF_A".to_string(), "NCCL_BPF_B_2".to_string()])
    );
}
