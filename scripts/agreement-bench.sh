#!/usr/bin/env bash
# The agreement's latency and its cost on the wire (issue 9), on this machine over loopback:
# N harness-rank processes in a ring through the plugin (net v11, one connection each way per
# neighbour), each deciding through the tuner (net_autotune, so the agreement runs) before each
# ring step of BYTES, no skew. Prints one row per (ranks, bytes): epochs combined, the latency
# from a rank's own record to the epoch's last one (mean and max over the epochs and ranks), the
# agreement's bytes on the wire per rank and epoch, and those against the ring traffic of the
# same epoch.
# Records travel over the ring connections only (LOCAL=1 adds the node-local relay).
# Usage: scripts/agreement-bench.sh   (knobs: RANKS="2 4", SIZES="4096 65536", CALLS=3000,
#        K=64, D=2; expects scripts/build.sh and policies/build.sh to have run)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
BIN=$T/release/harness-rank
POLICY=${POLICY:-$PWD/target/policies/src/net_autotune.o}
[ -x "$BIN" ] || cargo build --release -q -p ncclbpf-harness
[ -e "$POLICY" ] || { echo "missing $POLICY: run policies/build.sh"; exit 1; }
RANKS=${RANKS:-2 4}
SIZES=${SIZES:-4096 65536}
CALLS=${CALLS:-3000}
K=${K:-64}
D=${D:-2}
printf '%-6s %-8s %-7s %-7s %-13s %-12s %-14s %-10s\n' ranks bytes epochs wall_s "lat_mean_us" "lat_max_us" "wire_B/epoch" "overhead"
for n in $RANKS; do
  for b in $SIZES; do
    dir=$(mktemp -d /tmp/ncclbpf-agree-bench.XXXXXX)
    start=$(date +%s.%N)
    for r in $(seq 0 $((n - 1))); do
      NCCL_BPF_POLICY=$POLICY NCCL_BPF_SHM_DIR=$dir NCCL_BPF_CONTROL=0 \
        NCCL_BPF_AGREEMENT_EPOCH=$K NCCL_BPF_AGREEMENT_DELAY=$D NCCL_BPF_LOG_STDERR=1 \
        NCCL_BPF_AGREEMENT_LOCAL=${LOCAL:-0} \
        timeout 300 "$BIN" agree "$r" "$n" "$dir" "$CALLS" "$b" >"$dir/out.$r" 2>&1 &
    done
    wait
    end=$(date +%s.%N)
    # "process: E epochs combined, latency M us mean / X us max, F frames (S B) sent, ..."
    cat "$dir"/out.* | grep -h "agreement of comm" | sed -E 's/.*process: ([0-9]+) epochs combined, latency ([0-9]+) us mean \/ ([0-9]+) us max, [0-9]+ frames \(([0-9]+) B\) sent.*/\1 \2 \3 \4/' >"$dir/rows"
    [ "$(wc -l <"$dir/rows")" = "$n" ] || { echo "a rank failed: see $dir"; exit 1; }
    awk -v n="$n" -v b="$b" -v calls="$CALLS" -v k="$K" -v wall="$(awk -v a="$start" -v c="$end" 'BEGIN{print c-a}')" '
      { e += $1; m += $2; if ($3 > x) x = $3; s += $4 }
      END {
        e /= n; m /= n; s /= n
        epochs = calls / k
        wire = s / epochs
        # The ring traffic per rank and epoch: K steps of b bytes sent (16 b from half way).
        data = (k * b + k * 16 * b) / 2
        printf "%-6d %-8d %-7d %-7.1f %-13d %-12d %-14d %.4f%%\n", n, b, e, wall, m, x, wire, 100 * wire / data
      }' "$dir/rows"
    rm -rf "$dir"
  done
done
