#!/usr/bin/env bash
# Builds release artifacts into build/ for the GPU machine (which has no Rust).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
policies/build.sh
cargo build --release -p ncclbpf-bench -p ncclbpf-harness -p ncclbpf-cli
mkdir -p build
cp -f target/release/libnccl-net-bpf.so target/release/ncclbpf-bench target/release/harness-rank target/release/ncclbpf target/policies/src/*.o build/
# Debug info off the copies (symbols stay, for backtraces): the device carries at most 64 MiB.
strip --strip-debug build/libnccl-net-bpf.so build/ncclbpf-bench build/harness-rank build/ncclbpf
ls -la build
