#!/usr/bin/env bash
# Stages what bench/gpu/interposer.sh needs on the GPU machine into build/interposer/ (ignored
# by git; the device call carries it): our library, the cli, conn_counter.o, and fastsocket.
# Fastsocket is built outside the repository (never committed); FASTSOCKET names the built
# library (default /work/fastsocket-build/libnccl-net-fastsocket.so; how to build it:
# bench/results/cpu-2026-12-07-harness-over-fastsocket.md).
# Usage: bench/gpu/interposer-stage.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
FASTSOCKET=${FASTSOCKET:-/work/fastsocket-build/libnccl-net-fastsocket.so}
[ -e "$FASTSOCKET" ] || { echo "missing $FASTSOCKET (FASTSOCKET=...)"; exit 1; }
scripts/build.sh
policies/build.sh
cargo build --release -p ncclbpf-cli
d=build/interposer
mkdir -p "$d"
cp -f target/release/libnccl-net-bpf.so target/release/ncclbpf target/policies/src/conn_counter.o "$d/"
cp -f "$FASTSOCKET" "$d/libnccl-net-fastsocket.so"
# Debug info off the copies (symbols stay): the device carries at most 64 MiB.
strip --strip-debug "$d/libnccl-net-bpf.so" "$d/ncclbpf"
ls -la "$d"
du -sh "$d"
