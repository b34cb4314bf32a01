//! Where the compiled policy objects are, for tests and benchmarks: `target/policies/<dir>/<name>.o`
//! (`src`, `safe`, `unsafe`, and the extra builds such as `cpu-v1`). Depending on this crate
//! (as a dev-dependency) is what makes `cargo test` compile them (see `build.rs`).

#![forbid(unsafe_code)]

use std::path::PathBuf;

/// The directory of compiled objects.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies")
}

/// The object `rel` (e.g. `"src/size_aware.o"`), or why it is not there.
pub fn object(rel: &str) -> Result<PathBuf, String> {
    let p = dir().join(rel);
    if p.exists() {
        return Ok(p);
    }
    let why = std::fs::read_to_string(dir().join("MISSING"))
        .map(|m| format!("policy objects were not built: {m}"))
        .unwrap_or_else(|_| {
            "it was not built (a policy that needs clang-19, or a stale build: run policies/build.sh)"
                .into()
        });
    Err(format!("{}: {why}", p.display()))
}
