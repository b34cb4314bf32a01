#!/usr/bin/env bash
# Sets everything up and runs the main job on an embedded default (no GPU, no NCCL): builds the
# plugin library and the policies, prints the tuner's decisions for an all-reduce sweep (the
# shipped size_aware policy), then a 4-rank ring all-reduce over loopback through the plugin
# (each rank a process driving it as NCCL's proxy would, the shipped net_stats policy attached)
# and, in the same run, over raw TCP on the same streams: warm, checked, the median of many
# all-reduces per size, and the plugin/raw-TCP ratio. About 40 s after the build on 2 cores.
# Usage: scripts/demo.sh [options of `ncclbpf-bench ring`, e.g. --rounds 3 --sizes 8,1M,64M]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
policies/build.sh >/dev/null
cargo build -q --release -p ncclbpf-harness --bin harness-rank
cargo build -q --release -p ncclbpf-bench --bin ncclbpf-bench
lib=$PWD/target/release/libnccl-net-bpf.so
tuner=${NCCL_BPF_TUNER_POLICY:-$PWD/target/policies/src/size_aware.o}
echo "== the tuner: $tuner, as NCCL would call it for a 4-rank all-reduce"
echo "   (algo 0 tree, 1 ring; proto 0 LL, 1 LL128, 2 Simple)"
NCCLBPF_PLUGIN=$lib NCCL_BPF_TUNER_POLICY=$tuner target/release/harness-rank tune 0 4 4 \
  | sed -n 's/^decision /  /p'
echo
echo "== the net plugin: ring all-reduce through it and over raw TCP"
NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCLBPF_PLUGIN=$lib \
  target/release/ncclbpf-bench ring "$@"
