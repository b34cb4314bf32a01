#!/usr/bin/env bash
# Builds release artifacts into build/ for the GPU machine (which has no Rust).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
policies/build.sh
cargo build --release -p ncclbpf-bench -p ncclbpf-harness
mkdir -p build
cp -f target/release/libnccl-net-bpf.so target/release/ncclbpf-bench target/release/harness-rank target/policies/src/net_stats.o target/policies/src/size_aware.o build/
ls -la build
