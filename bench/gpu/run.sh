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

. bench/gpu/lib.sh
start_mps

port=29500
run() { # label nranks extra-env...
  local label=$1 n=$2 rc=0
  run_ranks "$@" || rc=1
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
    # The bench finds conn_counter.o (its policy arm) through NCCLBPF_BENCH_POLICY here: the
    # path compiled into it is the build machine's.
    NCCLBPF_PLUGIN=$LIB NCCLBPF_BENCH_POLICY=$PWD/build/conn_counter.o NCCL_BPF_NSTREAMS=$s \
      timeout 600 build/ncclbpf-bench loopback --rounds 3 >>"$OUT/loopback.md" 2>&1
    echo >>"$OUT/loopback.md"
  done
fi
python3 bench/gpu/summarize.py "$OUT/results.txt" | tee "$OUT/summary.md"
pack_logs
