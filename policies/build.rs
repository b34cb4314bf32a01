//! Compiles every policy with `policies/build.sh` (into `<repo>/target/policies`) whenever a
//! crate whose tests load policy objects is built, so `cargo test` in a fresh clone needs
//! nothing beyond clang. Without clang the build goes on, says so in a warning, and the
//! policy tests fail naming what is missing ([`ncclbpf_policies::object`]).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    for watched in ["src", "safe", "unsafe", "maps", "include", "build.sh"] {
        println!("cargo:rerun-if-changed={}", dir.join(watched).display());
    }
    let out = dir.join("../target/policies");
    let missing = out.join("MISSING");
    let _ = std::fs::create_dir_all(&out);
    let run = Command::new("bash")
        .arg(dir.join("build.sh"))
        .env("NCCLBPF_NO_INSTALL", "1")
        .output();
    let why = match run {
        Ok(o) if o.status.success() => {
            let _ = std::fs::remove_file(&missing);
            // What was skipped (no clang-19) is still worth a line.
            for line in String::from_utf8_lossy(&o.stderr).lines() {
                println!("cargo:warning=policies: {line}");
            }
            return;
        }
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => format!("cannot run bash policies/build.sh: {e}"),
    };
    let why = if why.is_empty() {
        "policies/build.sh failed".to_string()
    } else {
        why
    };
    println!("cargo:warning=policy objects not built: {why}");
    let _ = std::fs::write(&missing, &why);
}
