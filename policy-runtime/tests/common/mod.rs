#![allow(dead_code)]
pub mod localgen;
pub mod progen;
pub mod soundgen;
use policy_object::Object;
use shared_maps::{Map, Registry};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn object(rel: &str) -> (Vec<u8>, Object) {
    let p = root().join("target/policies").join(rel);
    let bytes = std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", p.display()));
    let o = Object::parse(&bytes).unwrap();
    (bytes, o)
}

/// Every compiled object of a policies/ directory: (name, bytes, object).
pub fn objects(dir: &str) -> Vec<(String, Vec<u8>, Object)> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("policies").join(dir))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let (b, o) = object(&format!("{dir}/{n}.o"));
            (n, b, o)
        })
        .collect()
}

/// Every object compiled into target/policies/<dir> (e.g. the `cpu-v1` builds).
pub fn built_objects(dir: &str) -> Vec<(String, Vec<u8>, Object)> {
    let mut paths: Vec<_> = std::fs::read_dir(root().join("target/policies").join(dir))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "o"))
                .collect()
        })
        .unwrap_or_default();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            let o = Object::parse(&b).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (
                format!("{dir}/{}", p.file_stem().unwrap().to_string_lossy()),
                b,
                o,
            )
        })
        .collect()
}

/// A registry of its own (maps not shared with other tests).
pub fn registry() -> Registry {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "ncclbpf-rt-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    Registry::new(d)
}

/// A map's contents with per-CPU copies summed (as u64 words), sorted by key.
pub fn dump(m: &Map) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = m
        .entries()
        .into_iter()
        .map(|(k, vals)| {
            let mut sum = vals[0].clone();
            for v in &vals[1..] {
                for (i, c) in v.chunks(8).enumerate() {
                    if c.len() == 8 {
                        let a = u64::from_le_bytes(sum[i * 8..i * 8 + 8].try_into().unwrap());
                        let b = u64::from_le_bytes(c.try_into().unwrap());
                        sum[i * 8..i * 8 + 8].copy_from_slice(&a.wrapping_add(b).to_le_bytes());
                    }
                }
            }
            (k, sum)
        })
        .collect();
    out.sort();
    out
}
