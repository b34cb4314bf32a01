use std::path::PathBuf;

fn main() {
    // NCCL's logger is C variadic; stable Rust cannot define one, so the harness's logger is C.
    cc::Build::new()
        .file("csrc/logger.c")
        .compile("harness_logger");
    println!("cargo:rerun-if-changed=csrc/logger.c");
    // NCCL's env plugin loader, in C with NCCL's own struct definitions (tests/env_plugin.rs).
    cc::Build::new()
        .file("csrc/env_caller.c")
        .compile("env_caller");
    println!("cargo:rerun-if-changed=csrc/env_caller.c");
    inner_ref_plugins();
}

/// The reference inner net plugin (csrc/inner_ref*.c, docs/reference/reference-inner-plugin.md): one shared
/// library per ABI version, `libinner-ref-vN.so` exporting only `ncclNetPlugin_vN` and the
/// `inner_ref_*` check functions. The cc crate makes static archives, so the compiler it finds
/// is run directly; tests find the libraries through `env!("INNER_REF_DIR")`.
fn inner_ref_plugins() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let compiler = cc::Build::new().opt_level(1).get_compiler();
    for v in 6..=12 {
        let lib = out.join(format!("libinner-ref-v{v}.so"));
        let status = compiler
            .to_command()
            .args(["-std=gnu11", "-Wall", "-Wextra", "-fPIC", "-shared"])
            .arg("-fvisibility=hidden")
            .arg(format!("-DREF_NET_VERSION={v}"))
            .arg("-o")
            .arg(&lib)
            .args(["csrc/inner_ref.c", "csrc/inner_ref_state.c"])
            .arg("-lpthread")
            .status()
            .expect("run the C compiler");
        assert!(status.success(), "building {} failed", lib.display());
    }
    println!("cargo:rustc-env=INNER_REF_DIR={}", out.display());
    for f in [
        "inner_ref.c",
        "inner_ref_state.c",
        "inner_ref_int.h",
        "net_abi.h",
    ] {
        println!("cargo:rerun-if-changed=csrc/{f}");
    }
}
