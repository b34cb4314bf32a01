#!/usr/bin/env bash
# Connection setup cost before and after: builds the plugin library of another commit (default
# a2ac71d, before the admission handshake) and this tree's, then runs the setup benchmark
# (bench/src/setup.rs, from this tree, so both are measured the same way) against each in turn,
# ROUNDS times alternating, and prints one row per run.
#   scripts/setup-compare.sh [commit]        ROUNDS=5 CONNS=500 NCCL_BPF_NSTREAMS=4 by default
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-a2ac71d}
rounds=${ROUNDS:-5}
conns=${CONNS:-500}
tmp=$(mktemp -d)
wt=$tmp/base
git worktree add -q --detach "$wt" "$base"
trap 'git worktree remove --force "$wt"; rm -rf "$tmp"' EXIT
# Before the `plugin` crate, the net crate built the library.
pkg=$( [ -d "$wt/plugin" ] && echo ncclbpf-plugin || echo ncclbpf-netplugin )
(cd "$wt" && CARGO_TARGET_DIR="$tmp/target" cargo build --release -q -p "$pkg")
cp "$tmp/target/release/libnccl_net_bpf.so" "$tmp/before.so"
scripts/build.sh >/dev/null
cp "${CARGO_TARGET_DIR:-target}/release/libnccl-net-bpf.so" "$tmp/after.so"
cargo build --release -q -p ncclbpf-bench --bin setup-bench
bench=${CARGO_TARGET_DIR:-target}/release/setup-bench
echo "| library | connections | data streams | median | P90 | P99 |"
echo "|---|---:|---:|---:|---:|---:|"
for _ in $(seq "$rounds"); do
  for side in before after; do
    label=$([ $side = before ] && echo "$base" || echo "this tree")
    row=$(NCCLBPF_PLUGIN="$tmp/$side.so" "$bench" --conns "$conns" | tail -1)
    echo "| $label $row"
  done
done
