//! Every shipped policy (policies/src) and every safe program (policies/safe) is accepted.

use policy_object::Object;
use policy_verifier::{Limits, map_infos, verify};
use std::path::PathBuf;

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
    let mut failures = vec![];
    for (name, o) in &objs {
        let maps = map_infos(&o.maps);
        for p in &o.programs {
            match verify(p, &maps, Limits::default()) {
                Ok(s) => println!(
                    "{name}/{}: {} insns, {} processed, {} states",
                    p.name, s.insns, s.processed, s.states
                ),
                Err(e) => failures.push(format!("{name}/{}: {e}", p.name)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn shipped_policies_are_accepted() {
    accept_all("src", 2);
}

#[test]
fn safe_programs_are_accepted() {
    accept_all("safe", 10);
}
