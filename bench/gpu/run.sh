#!/usr/bin/env bash
# End-to-end on the GPU machine (see shared/docs/gpu-testbed.md): PyTorch all_reduce over NCCL,
# every rank a separate "host" on one GPU, so all traffic goes through the NET transport.
# Compares NCCL's built-in Socket with our plugin in the same run, checks results, and keeps
# NCCL's logs. Expects build/libnccl-net-bpf.so and build/ncclbpf-bench (scripts/stage.sh).
# Usage: bench/gpu/run.sh [outdir]     (writes summary.md and logs there)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-gpu}}
mkdir -p "$OUT"
LIB=$PWD/build/libnccl-net-bpf.so
[ -f "$LIB" ] || { echo "missing $LIB: run scripts/stage.sh on a build machine"; exit 1; }

export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d 2>/dev/null || true
trap 'echo quit | nvidia-cuda-mps-control 2>/dev/null' EXIT

port=29500
run() { # label nranks extra-env...
  local label=$1 n=$2; shift 2
  port=$((port + 1))
  local pids=()
  for r in $(seq 0 $((n - 1))); do
    env "$@" RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING \
      timeout 240 python3 bench/gpu/allreduce.py "$label" >"$OUT/$label-n$n-r$r.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait $p || rc=1; done
  grep -h RESULT "$OUT/$label-n$n-r0.log" >>"$OUT/results.txt"
  echo "$label n=$n exit=$rc via-NET-lines=$(cat "$OUT"/$label-n$n-r*.log | grep -c 'via NET/')" | tee -a "$OUT/runs.txt"
  grep -h -m2 'via NET/' "$OUT/$label-n$n-r0.log" | sed 's/^/    /' | tee -a "$OUT/runs.txt"
  grep -h -m1 -E 'Using network|Initialized NET plugin' "$OUT/$label-n$n-r0.log" | sed 's/^/    /' | tee -a "$OUT/runs.txt"
  grep -h -E 'TUNER/BPF|tuner' "$OUT/$label-n$n-r0.log" | head -4 | sed 's/^/    /' | tee -a "$OUT/runs.txt"
}

: >"$OUT/results.txt"; : >"$OUT/runs.txt"
python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())' | tee "$OUT/versions.txt"
POLICY=$PWD/build/net_stats.o
# Knobs: RANKS ("2 4"), ROUNDS (2), CONFIGS ("socket bpf bpfpolicy"), LOOPBACK (1).
config_env() {
  case $1 in
    socket) echo NCCL_NET=Socket ;;
    bpf) echo NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF ;;
    bpfpolicy) echo NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_BPF_NET_POLICY=$POLICY ;;
    bpftuner) echo NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_TUNER_PLUGIN=$LIB NCCL_BPF_TUNER_POLICY=$PWD/build/size_aware.o ;;
  esac
}
if [ "${LOOPBACK_ONLY:-0}" != 1 ]; then
  # Configurations alternated within each round, so drift on the shared machine hits all alike.
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for n in ${RANKS:-2 4}; do
      for c in ${CONFIGS:-socket bpf bpfpolicy}; do
        run "$c-r$round" "$n" $(config_env "$c")
      done
    done
  done
fi

if [ -x build/ncclbpf-bench ] && [ "${LOOPBACK:-1}" = 1 ]; then
  for s in 0 2 4 8; do
    echo "## loopback, NCCL_BPF_NSTREAMS=$s" >>"$OUT/loopback.md"
    NCCLBPF_PLUGIN=$LIB NCCL_BPF_NSTREAMS=$s timeout 120 build/ncclbpf-bench >>"$OUT/loopback.md" 2>&1
    echo >>"$OUT/loopback.md"
  done
fi
python3 bench/gpu/summarize.py "$OUT/results.txt" | tee "$OUT/summary.md"
# Few files come back from the GPU machine: pack the per-rank logs.
tar -C "$OUT" -czf "$OUT/logs.tar.gz" $(cd "$OUT" && ls *-r*.log) && rm -f "$OUT"/*-r*.log
