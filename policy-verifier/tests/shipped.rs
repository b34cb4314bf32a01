//! Every shipped policy (policies/src) and every safe program (policies/safe) is accepted, in
//! every build policies/build.sh makes: the default (clang 14 -mcpu=v3; clang-19 -mcpu=v4 for
//! `// requires: v4` programs), cpu-v1 and cpu-v2 (clang 14), cpu-v3-clang19 and cpu-v4
//! (clang-19). Each accepted program prints its instruction and processed-instruction counts, the
//! states it stored, the most held at once and their bytes, and its units of work (the
//! budget's figures: crate::budget).

use policy_object::Object;
use policy_verifier::{Limits, map_infos, verify};
use std::path::{Path, PathBuf};

fn objects(dir: &str) -> Vec<(String, Object)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = vec![];
    let mut files: Vec<_> = std::fs::read_dir(root.join("policies").join(dir))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for c in files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
    {
        let name = c.file_stem().unwrap().to_string_lossy().into_owned();
        let o = root.join(format!("target/policies/{dir}/{name}.o"));
        let bytes = std::fs::read(&o)
            .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", o.display()));
        out.push((
            name.clone(),
            Object::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}")),
        ));
    }
    out
}

fn accept_all(dir: &str, min: usize) {
    let objs = objects(dir);
    assert!(objs.len() >= min);
    let failures = accept(&objs);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Verifies every program of `objs`; returns the rejections.
fn accept(objs: &[(String, Object)]) -> Vec<String> {
    let mut failures = vec![];
    for (name, o) in objs {
        let maps = map_infos(&o.maps);
        for p in &o.programs {
            match verify(p, &maps, Limits::default()) {
                Ok(s) => println!(
                    "{name}/{}: {} insns, {} processed, {} states, at most {} held ({} KiB), {} work",
                    p.name,
                    s.insns,
                    s.processed,
                    s.states,
                    s.peak_states,
                    s.peak_bytes / 1024,
                    s.work
                ),
                Err(e) => failures.push(format!("{name}/{}: {e}", p.name)),
            }
        }
    }
    failures
}

fn requires_v4(c: &Path) -> bool {
    std::fs::read_to_string(c)
        .unwrap()
        .lines()
        .any(|l| l.trim() == "// requires: v4")
}

/// The objects of one of the extra builds (`target/policies/<build>/<dir>-<name>.o`), for every
/// program of src/ and safe/. `required` says whether a program must have been built there
/// (cpu-v1/v2 skip what needs v3; every build but cpu-v4 skips `// requires: v4`).
fn build_objects(build: &str, required: impl Fn(&Path) -> bool) -> Vec<(String, Object)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = vec![];
    for dir in ["src", "safe"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join("policies").join(dir))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "c"))
            .collect();
        files.sort();
        for c in files {
            let name = format!("{dir}-{}", c.file_stem().unwrap().to_string_lossy());
            let o = root.join(format!("target/policies/{build}/{name}.o"));
            match std::fs::read(&o) {
                Ok(bytes) => out.push((
                    format!("{build}/{name}"),
                    Object::parse(&bytes).unwrap_or_else(|e| panic!("{build}/{name}: {e}")),
                )),
                Err(e) if required(&c) => {
                    panic!("{}: {e} (run policies/build.sh)", o.display())
                }
                Err(_) => println!("{build}/{name}: not built at this cpu version"),
            }
        }
    }
    out
}

#[test]
fn shipped_policies_are_accepted() {
    accept_all("src", 2);
}

#[test]
fn safe_programs_are_accepted() {
    accept_all("safe", 10);
}

#[test]
fn every_build_of_every_safe_program_is_accepted() {
    let mut failures = vec![];
    let mut n = 0;
    for (build, required) in [
        ("cpu-v1", (|_: &Path| false) as fn(&Path) -> bool),
        ("cpu-v2", |_| false),
        ("cpu-v3-clang19", |c| !requires_v4(c)),
        ("cpu-v4", |_| true),
    ] {
        let objs = build_objects(build, required);
        n += objs.len();
        failures.extend(accept(&objs));
    }
    assert!(n >= 60, "only {n} objects in the extra builds");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The verifier reports which context bytes a program may read, so the tuner fills the fields
/// it computes from NCCL's cost table (bytes 52..64 of the tuner context) only for programs
/// that read them: `size_aware` reads the size alone; `net_autotune` reads the table fields.
#[test]
fn the_context_fields_a_program_reads_are_reported() {
    let objs = objects("src");
    let stats = |obj: &str, section: &str| {
        let (_, o) = objs
            .iter()
            .find(|(n, _)| n == obj)
            .unwrap_or_else(|| panic!("no {obj}"));
        let p = o.programs.iter().find(|p| p.section == section).unwrap();
        verify(p, &map_infos(&o.maps), Limits::default()).unwrap()
    };
    let size_aware = stats("size_aware", "tuner");
    assert!(size_aware.reads_ctx(0, 8), "msg_size");
    assert!(!size_aware.reads_ctx(52, 12), "{:#x}", size_aware.ctx_read);
    assert!(!size_aware.reads_ctx(8, 8), "comm_id is not read");
    let autotune = stats("net_autotune", "tuner");
    assert!(autotune.reads_ctx(52, 4) && autotune.reads_ctx(56, 8));
    assert!(!autotune.reads_ctx(8, 8) && !autotune.reads_ctx(0, 0));
    // Net programs read their own fields: net_autotune's completion hook reads status,
    // bytes and latency_ns, never conn_id.
    let complete = stats("net_autotune", "net/complete");
    assert!(complete.reads_ctx(48, 4) && complete.reads_ctx(8, 8) && complete.reads_ctx(40, 8));
    assert!(!complete.reads_ctx(0, 8) && !complete.reads_ctx(52, 4));
}
