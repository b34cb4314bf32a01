#!/usr/bin/env bash
# Builds the plugin library as NCCL expects to find it: <target>/<profile>/libnccl-net-bpf.so,
# where <target> is $CARGO_TARGET_DIR or ./target.
# Usage: scripts/build.sh [--debug]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
flag=--release
if [ "${1:-}" = "--debug" ]; then profile=debug; flag=; fi
target=${CARGO_TARGET_DIR:-target}
cargo build $flag -p ncclbpf-plugin
cp -f "$target/$profile/libnccl_net_bpf.so" "$target/$profile/libnccl-net-bpf.so"
echo "built $target/$profile/libnccl-net-bpf.so"
