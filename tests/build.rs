fn main() {
    // NCCL's logger is C variadic; stable Rust cannot define one, so the harness's logger is C.
    cc::Build::new()
        .file("csrc/logger.c")
        .compile("harness_logger");
    println!("cargo:rerun-if-changed=csrc/logger.c");
}
