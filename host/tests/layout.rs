//! The layout issue 34 asks for: no plugin crate depends on another, in either direction,
//! directly or through another crate of the workspace, dev-dependencies included. What the net
//! plugin and the tuner share lives in the crates below them (the host, the agreement).
//!
//! Read from the manifests (no `cargo metadata`: it would resolve the whole workspace): the
//! dependencies of every `[*dependencies]` table of the crate itself, then the normal and build
//! dependencies of each workspace crate it reaches (cargo builds only the root's dev ones).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A manifest's package name and its workspace dependencies (by directory), by table kind.
struct Manifest {
    name: String,
    /// (dev, dependency's directory).
    deps: Vec<(bool, PathBuf)>,
}

/// `[workspace.dependencies]` of the root: name -> directory, for the path ones.
fn workspace_paths() -> BTreeMap<String, PathBuf> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut out = BTreeMap::new();
    let mut table = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.to_string();
        } else if table == "[workspace.dependencies]"
            && let Some((name, path)) = dep_line(line)
            && let Some(p) = path
        {
            out.insert(name, root().join(p));
        }
    }
    out
}

/// `name = { path = "..." ... }`, `name.workspace = true`, `name = "1"`: the name and the path.
fn dep_line(line: &str) -> Option<(String, Option<String>)> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (key, value) = line.split_once('=')?;
    let name = key.trim().trim_end_matches(".workspace").trim().to_string();
    let path = value.split_once("path").and_then(|(_, rest)| {
        let rest = rest
            .trim_start()
            .strip_prefix('=')?
            .trim_start()
            .strip_prefix('"')?;
        Some(rest[..rest.find('"')?].to_string())
    });
    Some((name, path))
}

fn manifest(dir: &Path) -> Manifest {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let ws = workspace_paths();
    let (mut name, mut deps, mut table) = (String::new(), vec![], String::new());
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.to_string();
            continue;
        }
        if table == "[package]" && line.starts_with("name") {
            name = line.split('"').nth(1).unwrap().to_string();
        }
        if !table.ends_with("dependencies]") {
            continue;
        }
        let Some((dep, path)) = dep_line(line) else {
            continue;
        };
        let dir_of = match path {
            Some(p) => Some(dir.join(p)),
            None if line.contains(".workspace") || line.contains("workspace = true") => {
                ws.get(&dep).cloned()
            }
            None => None,
        };
        if let Some(d) = dir_of {
            deps.push((table.ends_with("dev-dependencies]"), d));
        }
    }
    Manifest { name, deps }
}

/// Every workspace crate `dir` depends on: its own dependencies of every kind, then theirs
/// without dev ones.
fn reaches(dir: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<PathBuf> = manifest(&root().join(dir))
        .deps
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    while let Some(d) = todo.pop() {
        let m = manifest(&d);
        if seen.insert(m.name) {
            todo.extend(m.deps.into_iter().filter(|(dev, _)| !dev).map(|(_, d)| d));
        }
    }
    seen
}

#[test]
fn no_plugin_crate_depends_on_another() {
    let plugins = [
        ("netplugin", "ncclbpf-netplugin"),
        ("tuner", "ncclbpf-tuner"),
        ("profiler", "ncclbpf-profiler"),
        ("envplugin", "ncclbpf-env"),
    ];
    for (dir, me) in plugins {
        let r = reaches(dir);
        assert!(!r.is_empty(), "{dir}: no dependencies read");
        for (_, other) in plugins.iter().filter(|(_, o)| *o != me) {
            assert!(
                !r.contains(*other),
                "{me} depends on {other} (directly or through {r:?})"
            );
        }
    }
    // The host, which all of them may use, uses none of them.
    let r = reaches("host");
    assert!(r.contains("ncclbpf-control"), "{r:?}");
    for (_, p) in plugins {
        assert!(!r.contains(p), "ncclbpf-host depends on {p}");
    }
}

#[test]
fn the_reader_sees_what_cargo_sees() {
    // The plugin library links all four; the net plugin reaches the host and the agreement.
    let r = reaches("plugin");
    for p in [
        "ncclbpf-netplugin",
        "ncclbpf-tuner",
        "ncclbpf-profiler",
        "ncclbpf-env",
    ] {
        assert!(r.contains(p), "{r:?}");
    }
    let r = reaches("netplugin");
    for p in [
        "ncclbpf-host",
        "ncclbpf-agreement",
        "shared-maps",
        "ncclbpf-policies",
    ] {
        assert!(r.contains(p), "{r:?}");
    }
}
