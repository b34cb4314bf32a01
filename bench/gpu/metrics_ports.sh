#!/usr/bin/env bash
# The metrics on the GPU machine (shared/docs/gpu-testbed.md): 4 ranks of bench/gpu/allreduce.py
# through the plugin (Ring and Simple forced, so every rank sends exactly 2 (n-1)/n of each
# all_reduce's bytes, besides torch's barriers), each its own NCCL host on the one GPU, with
# `ncclbpf exporter` running and every rank's in-process endpoint (NCCL_BPF_METRICS_ADDR=:P,
# LOCAL_RANK=r: port P+r; ports drawn fresh each run). Once all ranks hold (after the sweep, process group alive):
# scrapes the exporter and each endpoint, `ncclbpf status --all`, then freezes rank 1 (SIGSTOP)
# and scrapes the exporter again (timed), and compares each rank's sent bytes with what its
# all_reduces had to send (bench/gpu/metrics_compare.py). Outputs in $OUT.
#
# Needs build/libnccl-net-bpf.so and build/ncclbpf (built on a CPU machine).
# Usage: bench/gpu/metrics_ports.sh   (OUT=/path to keep the outputs elsewhere)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/metrics-gpu}
mkdir -p "$OUT"
B=$PWD/build
source bench/gpu/lib.sh
start_mps
# Fresh ports and registry each run (a previous run's ranks may still be holding).
base=$((20000 + RANDOM % 20000))
exp_port=$base mport=$((base + 1)) mbase=$((base + 10))
export NCCL_BPF_SHM_DIR=$OUT/shm
rm -rf "$NCCL_BPF_SHM_DIR"
"$B/ncclbpf" exporter --listen 127.0.0.1:$exp_port >"$OUT/exporter.log" 2>&1 &
exporter=$!
hold=$OUT/hold
rm -f "$hold"
n=4
pids=()
for r in $(seq 0 $((n - 1))); do
  env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$mport \
    NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \
    NCCL_NET_PLUGIN="$B/libnccl-net-bpf.so" NCCL_NET=BPF NCCL_ALGO=Ring NCCL_PROTO=Simple \
    NCCL_BPF_METRICS_ADDR=:$mbase NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    SIZES=1024,1048576,16777216,67108864 MAPS_CMD=true HOLD_FILE="$hold" HOLD_TIMEOUT=120 \
    timeout 240 python3 bench/gpu/allreduce.py metrics >"$OUT/rank$r.log" 2>&1 &
  pids+=($!)
done
# Until every rank holds (or one ended).
for _ in $(seq 1 1800); do
  held=$( (grep -l '^HOLDING' "$OUT"/rank*.log 2>/dev/null || true) | wc -l)
  [ "$held" = "$n" ] && break
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  [ "$alive" = "$n" ] || break
  sleep 0.1
done
get() { python3 -c 'import sys,urllib.request,time; t=time.time(); b=urllib.request.urlopen(sys.argv[1], timeout=10).read(); sys.stdout.buffer.write(b); print("took %.3f s" % (time.time()-t), file=sys.stderr)' "$1"; }
get http://127.0.0.1:$exp_port/metrics >"$OUT/exporter.txt" 2>"$OUT/exporter.took" || true
for r in $(seq 0 $((n - 1))); do
  get http://127.0.0.1:$((mbase + r))/metrics >"$OUT/endpoint$r.txt" 2>/dev/null || echo "endpoint $r: no answer" >>"$OUT/errors.txt"
done
"$B/ncclbpf" status --all >"$OUT/status.txt" 2>&1 || true
# Rank 1 frozen: the exporter still answers.
p1=$(sed -n 's/^HOLDING rank=1 pid=\([0-9]*\).*/\1/p' "$OUT/rank1.log")
if [ -n "$p1" ]; then
  kill -STOP "$p1"
  sleep 2
  get http://127.0.0.1:$exp_port/metrics >"$OUT/exporter-frozen.txt" 2>"$OUT/exporter-frozen.took" || true
  "$B/ncclbpf" status --all --stall-after 1 >"$OUT/status-frozen.txt" 2>&1 || true
  kill -CONT "$p1"
fi
touch "$hold"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
get http://127.0.0.1:$exp_port/metrics >"$OUT/exporter-after.txt" 2>/dev/null || true
kill "$exporter"
grep -h '^RESULT\|^MOVED\|^HOLD' "$OUT"/rank*.log >"$OUT/results.txt" || true
python3 bench/gpu/metrics_compare.py "$OUT" | tee "$OUT/compare.txt"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" rank0.log rank1.log rank2.log rank3.log && rm -f "$OUT"/rank*.log
exit $rc
