fn main() {
    // NCCL >= 2.28 may dlclose the net library when its last communicator goes away and open it
    // again later. Pinning the image keeps any straggling thread or TLS destructor from
    // running unmapped code; threads are still joined in close/finalize.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-net-bpf.so");
}
