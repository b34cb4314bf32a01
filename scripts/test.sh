#!/usr/bin/env bash
# Runs every check CI runs: format, lints, the exported-symbol check, unit tests and the
# harness that plays NCCL against the built library. Installs nothing beyond what cargo fetches.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
echo "== build the plugin library"
scripts/build.sh
lib=$(realpath -m "${CARGO_TARGET_DIR:-target}/release/libnccl-net-bpf.so")
echo "== exported symbols ($lib)"
syms=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -E '^nccl' | sort)
echo "$syms"
for v in 7 8 9 10 11 12; do
  echo "$syms" | grep -qx "ncclNetPlugin_v$v" || { echo "missing ncclNetPlugin_v$v"; exit 1; }
done
for v in 2 3 4 5 6; do
  echo "$syms" | grep -qx "ncclTunerPlugin_v$v" || { echo "missing ncclTunerPlugin_v$v"; exit 1; }
done
for v in 4 5 6; do
  echo "$syms" | grep -qx "ncclProfiler_v$v" || { echo "missing ncclProfiler_v$v"; exit 1; }
done
for v in 1 2; do
  echo "$syms" | grep -qx "ncclEnvPlugin_v$v" || { echo "missing ncclEnvPlugin_v$v"; exit 1; }
done
echo "== policies (clang -target bpf)"
policies/build.sh
echo "== tests (unit, harness against $lib)"
# The dead-link test needs root, iproute2 and tc; what it could not run, it says here.
skipped=${CARGO_TARGET_DIR:-target}/dead_link.skipped
rm -f "$skipped"
NCCLBPF_PLUGIN=$lib cargo test --workspace --release
if [ -f "$skipped" ]; then cat "$skipped"; fi
# The default path is `auto` (io_uring where the kernel allows it, else epoll); every path must
# pass the whole harness.
for io in epoll threads; do
  echo "== harness with NCCL_BPF_IO=$io"
  NCCL_BPF_IO=$io NCCLBPF_PLUGIN=$lib cargo test --release -p ncclbpf-harness
done
# The interposer (docs/guide/interposer.md): the whole harness again with another copy of the library
# as the inner plugin that carries the traffic (a file of its own, so nothing is shared).
echo "== harness over an inner plugin (NCCL_BPF_NET_INNER: a copy of the library)"
inner_dir=$(mktemp -d)
# Readable by all: the helper-thread tests (helpers.rs) run harness-nproc as another user, whose
# wrapper must open the copy too (mktemp's 0700 made their init fail).
chmod 755 "$inner_dir"
cp "$lib" "$inner_dir/libnccl-net-copy.so"
chmod 755 "$inner_dir/libnccl-net-copy.so"
NCCL_BPF_NET_INNER=$inner_dir/libnccl-net-copy.so NCCLBPF_PLUGIN=$lib cargo test --release -p ncclbpf-harness
rm -rf "$inner_dir"
echo "== all checks passed"
