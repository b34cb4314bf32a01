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
}
