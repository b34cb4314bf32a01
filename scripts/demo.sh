#!/usr/bin/env bash
# Sets everything up and runs the main job on an embedded default: a 4-rank ring all-reduce over
# loopback through the plugin library (each rank a process driving it as NCCL's proxy would),
# results checked, with timings and per-connection totals from the plugin's log.
# Usage: scripts/demo.sh [nranks] [sizes in bytes...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
policies/build.sh >/dev/null
cargo build -q --release -p ncclbpf-harness --bin harness-rank
nranks=${1:-4}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(8 1024 65536 1048576 16777216 67108864)
NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCLBPF_PLUGIN=$PWD/target/release/libnccl-net-bpf.so \
  target/release/harness-rank job "$nranks" 12 "${sizes[@]}"
