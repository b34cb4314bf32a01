#!/usr/bin/env bash
# Tuner-only on real NCCL (issue 34, item 1): NCCL's own Socket transport carries the data (no
# NCCL_NET_PLUGIN; every rank its own NCCL host on the one GPU), only NCCL_TUNER_PLUGIN names
# the library. While N ranks run checked all_reduces, from a shell:
#   1. `ncclbpf status --all` answers for every rank (the control socket is up without our net);
#   2. `ncclbpf reload --at-seq +M --all size_aware.o` swaps bad_channels (one channel) for
#      size_aware at one collective on every rank (each rank's log says from which seq);
#   3. every rank's metrics endpoint (NCCL_BPF_METRICS_ADDR=127.0.0.1:0) serves its metrics;
#   4. the job finishes with every result right (allreduce.py checks each one).
# Expects build/ from scripts/stage.sh. Usage: bench/gpu/tuner_only.sh [outdir]
# Knobs: N (2 ranks), REPEAT (3000 rounds of SIZES), SIZES (1024,65536), AHEAD (M, 2000).
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-tuner-only}}
mkdir -p "$OUT"
B=$PWD/build
LIB=$B/libnccl-net-bpf.so
for f in "$LIB" "$B/size_aware.o" "$B/bad_channels.o" "$B/ncclbpf"; do
  [ -e "$f" ] || { echo "missing $f: run scripts/stage.sh on a build machine"; exit 1; }
done
. bench/gpu/lib.sh
start_mps
export NCCL_BPF_SHM_DIR=/tmp/ncclbpf-tuner-only-shm
rm -rf "$NCCL_BPF_SHM_DIR" "$OUT/hold"
n=${N:-2}
python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())' | tee "$OUT/versions.txt"
pids=()
for r in $(seq 0 $((n - 1))); do
  env NCCL_TUNER_PLUGIN=$LIB NCCL_NET=Socket NCCL_BPF_POLICY=$B/bad_channels.o \
    NCCL_BPF_METRICS_ADDR=127.0.0.1:0 REPEAT=${REPEAT:-3000} SIZES=${SIZES:-1024,65536} \
    HOLD_FILE=$OUT/hold HOLD_TIMEOUT=120 \
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29931 \
    NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING,ENV \
    timeout 300 python3 bench/gpu/allreduce.py tuner-only >"$OUT/r$r.log" 2>&1 &
  pids+=($!)
done
# Every rank's control socket (the host starts with the first tuner context).
for _ in $(seq 1 600); do
  [ "$(ls "$NCCL_BPF_SHM_DIR"/*.ctl 2>/dev/null | wc -l)" -ge "$n" ] && break
  sleep 0.2
done
sleep 1
{
  echo "== ncclbpf status --all (t=$(date +%T.%N))"
  "$B/ncclbpf" status --all; echo "exit $?"
  echo "== ncclbpf reload --at-seq +${AHEAD:-2000} --all size_aware.o"
  "$B/ncclbpf" reload --at-seq +"${AHEAD:-2000}" --all "$B/size_aware.o"; echo "exit $?"
  echo "== ncclbpf reload --all size_aware.o (plain: no net hook here)"
  "$B/ncclbpf" reload --all "$B/size_aware.o"; echo "exit $?"
  echo "== metrics"
  for f in "$NCCL_BPF_SHM_DIR"/*.metrics; do
    a=$(cat "$f")
    python3 - "$a" <<'PY'
import sys, urllib.request
a = sys.argv[1]
body = urllib.request.urlopen(f"http://{a}/metrics", timeout=10).read().decode()
fams = sorted({l.split()[2] for l in body.splitlines() if l.startswith("# TYPE")})
print(f"{a}: {len(body)} bytes, {len(fams)} families, e.g. {', '.join(fams[:6])}")
print("\n".join(l for l in body.splitlines() if l.startswith("ncclbpf_process_readable")))
PY
  done
  sleep 5
  echo "== ncclbpf status --all (later)"
  "$B/ncclbpf" status --all; echo "exit $?"
} >"$OUT/shell.txt" 2>&1
touch "$OUT/hold"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
{
  echo "job exit: $rc"
  for r in $(seq 0 $((n - 1))); do
    echo "-- rank $r"
    grep -h -E "via NET/|HOST/BPF|makes decisions from seq|PROFILER/BPF.*event mask|no opinion" "$OUT/r$r.log" | sed 's/^[^ ]* //' | head -12
    grep -h -E "^HOLDING" "$OUT/r$r.log"
    echo "wrong results printed: $(grep -c 'correct=NO' "$OUT/r$r.log")"
  done
} >"$OUT/summary.txt"
cat "$OUT/shell.txt" "$OUT/summary.txt"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" $(cd "$OUT" && ls r*.log) 2>/dev/null && rm -f "$OUT"/r*.log
exit $rc
