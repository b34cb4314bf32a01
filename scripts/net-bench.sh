#!/usr/bin/env bash
# The net data path benchmarks of issue 11, each one command printing a markdown table:
#   scripts/net-bench.sh loopback [--rounds N] [--quick]   plugin vs raw TCP, latency and throughput
#   scripts/net-bench.sh comms [--counts 10,100,1000]      threads, fds, idle CPU of N comm pairs
#   scripts/net-bench.sh hooks [--rounds N] [--quick]      per-operation cost of the net hooks
#   scripts/net-bench.sh all                               the three, full runs
# Builds the plugin library, the policies and the bench first, and runs the bench against a copy
# of the library (in a temporary directory), so that another build into the same target
# directory cannot swap it in the middle of a run. NCCLBPF_PLUGIN=path runs against that library
# instead (nothing is built but the bench). NCCL_BPF_* settings apply to every plugin arm.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$PWD/$target ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "${NCCLBPF_PLUGIN:-}" ]; then
  scripts/build.sh >/dev/null
  cp "$target/release/libnccl-net-bpf.so" "$tmp/"
  export NCCLBPF_PLUGIN=$tmp/libnccl-net-bpf.so
fi
policies/build.sh >/dev/null
cargo build --release -q -p ncclbpf-bench
cp "$target/release/ncclbpf-bench" "$tmp/"
bench=$tmp/ncclbpf-bench
echo "library: $NCCLBPF_PLUGIN (commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo ', uncommitted changes'))" >&2
if [ "${1:-}" = all ]; then
  shift
  "$bench" loopback "$@"
  echo
  "$bench" comms
  echo
  "$bench" hooks
else
  "$bench" "$@"
fi
