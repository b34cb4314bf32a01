#!/usr/bin/env bash
# Issue 33 on the GPU machine (shared/docs/gpu-testbed.md): the interposer (NCCL_BPF_NET_INNER)
# against the same transports loaded directly, in one command, every result checked.
#
# Arms (each rank its own NCCL host on the one GPU, MPS on; NCCL_TUNER_PLUGIN and
# NCCL_PROFILER_PLUGIN none, so that only the net plugin differs):
#   socket    NCCL's built-in Socket                                   (a)
#   bpf       our plugin, our sockets                                   (b)
#   bpf_cc    (b) with NCCL_BPF_POLICY=conn_counter.o
#   copy      our plugin over a copy of itself (NCCL_BPF_NET_INNER)     (c)
#   copy_cc   (c) with conn_counter.o
#   fs        fastsocket loaded by NCCL itself                          (d)
#   wfs       our plugin over fastsocket (NCCL_BPF_NET_INNER)           (e)
#   wfs_cc    (e) with conn_counter.o
# 1. Round 1 at 2 ranks: every arm runs interposer_job.py (all_reduce and all_gather, SIZES).
# 2. Checks through (c) and (e), 2 ranks, Ring/Simple: N1 all_reduces of 4 MiB, then, while the
#    ranks wait, `ncclbpf status --all --json` and every rank's metrics endpoint
#    (NCCL_BPF_METRICS_ADDR=127.0.0.1:0) against the bytes the job moved; then one checked run of
#    every collective kind, with `ncclbpf status --all --json` taken while it runs.
# 3. Rounds at 4 ranks and more rounds at 2 ranks, alternated (4 ranks round 1, 2 ranks round 2,
#    4 ranks round 2, ...; arm order reversed every other round), each whole round only while
#    the time budget (BUDGET s, default 500) leaves room for it.
# interposer_report.py writes summary.md: time per size per arm, the ratios wfs/fs and
# copy/bpf (and their _cc twins), and their spread over rounds.
#
# Files it needs, staged on a build machine by bench/gpu/interposer-stage.sh into
# build/interposer/ (ignored by git; carry it): libnccl-net-bpf.so, ncclbpf (the cli),
# conn_counter.o, libnccl-net-fastsocket.so (built outside the repository: the command is in
# bench/results/cpu-2026-12-07-harness-over-fastsocket.md).
# Device call: run(command="bench/gpu/interposer.sh", carry=["build/interposer"]); $OUT gets
# summary.md, results.txt, checks/*, logs.tar.gz.
# Knobs: ROUNDS2 (3), ROUNDS4 (2), SIZES, BUDGET (500), ARMS (all eight), FS_ENV (settings of
# both fastsocket arms, default NCCL_FLOW_PLACEMENT_ENABLE=0; FS_ENV= for fastsocket's defaults).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-/tmp/ncclbpf-interposer}}
mkdir -p "$OUT/checks"
B=$(cd "${BUILD:-build/interposer}" 2>/dev/null && pwd)
LIB=$B/libnccl-net-bpf.so
CLI=$B/ncclbpf
CC=$B/conn_counter.o
FS=$B/libnccl-net-fastsocket.so
for f in "$LIB" "$CLI" "$CC" "$FS"; do
  [ -e "$f" ] || { echo "missing $f: run bench/gpu/interposer-stage.sh on a build machine"; exit 1; }
done
# The plain backend: another copy of our library, at a path of its own.
COPY=/tmp/ncclbpf-inner-copy/libnccl-net-bpfcopy.so
mkdir -p "$(dirname "$COPY")" && cp -f "$LIB" "$COPY"

ROUNDS2=${ROUNDS2:-3}
ROUNDS4=${ROUNDS4:-2}
BUDGET=${BUDGET:-500}
ARMS=${ARMS:-socket bpf bpf_cc copy copy_cc fs wfs wfs_cc}
# fastsocket's flow placement (its default) returns from connect before the connection is up
# and, on a CPU machine, a send right after it failed inside fastsocket ("Socket operation on
# non-socket"); off, connect completes in the call. The same for both fastsocket arms.
FS_ENV=${FS_ENV-NCCL_FLOW_PLACEMENT_ENABLE=0}
export SIZES=${SIZES:-8,65536,1048576,16777216,268435456}
REG=${NCCL_BPF_SHM_DIR:-/dev/shm/ncclbpf-$(id -u)}
t_start=$(date +%s)
elapsed() { echo $(($(date +%s) - t_start)); }

. bench/gpu/lib.sh
start_mps
{
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  "$CLI" --version
  echo "fastsocket $(sha256sum "$FS" | cut -c1-16) exports: $(nm -D --defined-only "$FS" 2>/dev/null | grep -o 'ncclNetPlugin_v[0-9]*' | tr '\n' ' ')"
  echo "ROUNDS2=$ROUNDS2 ROUNDS4=$ROUNDS4 BUDGET=$BUDGET SIZES=$SIZES FS_ENV=$FS_ENV"
  echo "ARMS=$ARMS"
} | tee "$OUT/versions.txt"

# arm_env ARM: the settings of one arm, one VAR=VALUE a line.
arm_env() {
  case $1 in
    socket) echo NCCL_NET=Socket ;;
    bpf) printf '%s\n' NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF ;;
    bpf_cc) printf '%s\n' NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_BPF_POLICY=$CC ;;
    copy) printf '%s\n' NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_BPF_NET_INNER=$COPY ;;
    copy_cc) printf '%s\n' NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_BPF_NET_INNER=$COPY NCCL_BPF_POLICY=$CC ;;
    fs) printf '%s\n' NCCL_NET_PLUGIN=$FS NCCL_NET=FastSocket $FS_ENV ;;
    wfs) printf '%s\n' NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_BPF_NET_INNER=$FS $FS_ENV ;;
    wfs_cc) printf '%s\n' NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_BPF_NET_INNER=$FS NCCL_BPF_POLICY=$CC $FS_ENV ;;
  esac
}

port=29900
# job LABEL ARM N [VAR=VALUE...]: N ranks of interposer_job.py; logs $OUT/LABEL-rR.log.
job() {
  local label=$1 arm=$2 n=$3; shift 3
  port=$((port + 1))
  local pids=() r
  mapfile -t aenv < <(arm_env "$arm")
  for r in $(seq 0 $((n - 1))); do
    env "${aenv[@]}" "$@" RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \
      NCCL_TUNER_PLUGIN=none NCCL_PROFILER_PLUGIN=none \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET PYTHONUNBUFFERED=1 \
      timeout -k 5 ${JOB_TIMEOUT:-90} python3 bench/gpu/interposer_job.py "$arm" >"$OUT/$label-r$r.log" 2>&1 &
    pids+=($!)
  done
  wait_ranks "$label" "${pids[@]}"
}

declare -A round_secs=([2]=200 [4]=320) # a round's seconds, assumed until one was measured
# sweep ROUND N [force]: every arm once, in this round's order; unless forced, the whole round
# is skipped when the last round of N ranks (times 1.2) no longer fits the budget.
sweep() {
  local rnd=$1 n=$2 arm t0 r0 rc secs
  if [ -z "${3:-}" ] && [ $(($(elapsed) + round_secs[$n] * 6 / 5)) -gt "$BUDGET" ]; then
    echo "SKIP ranks=$n round=$rnd (t=$(elapsed) s, a round took ${round_secs[$n]} s, budget $BUDGET s)" | tee -a "$OUT/results.txt"
    return
  fi
  r0=$(date +%s)
  for arm in $(round_order "$rnd" $ARMS); do
    if [ "$(elapsed)" -gt "$BUDGET" ]; then # a forced round whose jobs hung
      echo "SKIP arm=$arm ranks=$n round=$rnd (t=$(elapsed) s, past the budget)" | tee -a "$OUT/results.txt"
      continue
    fi
    t0=$(date +%s)
    job "sweep-$arm-n$n-$rnd" "$arm" "$n" ROUND=$rnd
    rc=$?
    secs=$(($(date +%s) - t0))
    grep -h '^RESULT' "$OUT/sweep-$arm-n$n-$rnd-r0.log" >>"$OUT/results.txt"
    echo "JOB arm=$arm ranks=$n round=$rnd rc=$rc seconds=$secs" | tee -a "$OUT/results.txt"
  done
  round_secs[$n]=$(($(date +%s) - r0))
}

scrape() { # URL FILE
  python3 - "$1" "$2" <<'EOF'
import sys, urllib.request
try:
    body = urllib.request.urlopen(sys.argv[1], timeout=10).read()
except Exception as e:
    body = f"# scrape failed: {e}\n".encode()
open(sys.argv[2], "wb").write(body)
EOF
}

# check ARM: the phase-1 byte check and the every-kind check through one wrapper arm.
check() {
  if [ "$(elapsed)" -gt "$BUDGET" ]; then
    echo "SKIP check arm=$1 (t=$(elapsed) s, past the budget)" | tee -a "$OUT/results.txt"
    return
  fi
  local arm=$1 n=2 d=$OUT/checks/$1 r pid addr
  mkdir -p "$d"
  rm -f "$d/go"
  port=$((port + 1))
  local pids=()
  mapfile -t aenv < <(arm_env "$arm")
  for r in $(seq 0 $((n - 1))); do
    env "${aenv[@]}" MODE=check GO_FILE=$d/go BYTES=4194304 N1=100 \
      NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_BPF_METRICS_ADDR=127.0.0.1:0 \
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \
      NCCL_TUNER_PLUGIN=none NCCL_PROFILER_PLUGIN=none \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET PYTHONUNBUFFERED=1 \
      timeout -k 5 120 python3 bench/gpu/interposer_job.py "check-$arm" >"$d/rank$r.log" 2>&1 &
    pids+=($!)
  done
  local end=$(($(date +%s) + 90)) all
  while [ "$(date +%s)" -lt "$end" ]; do
    all=1
    for r in $(seq 0 $((n - 1))); do grep -q '^PHASE1 ' "$d/rank$r.log" 2>/dev/null || all=0; done
    [ $all = 1 ] && break
    sleep 0.2
  done
  sleep 1 # the last completions reach the tables
  for r in $(seq 0 $((n - 1))); do
    pid=$(sed -n 's/^PHASE1 rank=[0-9]* pid=\([0-9]*\).*/\1/p' "$d/rank$r.log")
    echo "$pid" >"$d/rank$r.pid"
    addr=$(head -1 "$REG/$pid.metrics" 2>/dev/null)
    echo "rank $r pid $pid endpoint ${addr:-none}" >>"$d/endpoints.txt"
    case $addr in
      http*) scrape "$addr" "$d/phase1-rank$r.prom" ;;
      ?*) scrape "http://$addr/metrics" "$d/phase1-rank$r.prom" ;;
    esac
  done
  timeout 20 "$CLI" status --all --json >"$d/status-phase1.json" 2>"$d/status-phase1.err"
  echo "exit $?" >>"$d/status-phase1.err"
  touch "$d/go"
  sleep 0.3 # phase 2 under way: the every-kind check
  timeout 20 "$CLI" status --all --json >"$d/status-phase2.json" 2>"$d/status-phase2.err"
  echo "exit $?" >>"$d/status-phase2.err"
  wait_ranks "check-$arm" "${pids[@]}"
  echo "CHECK arm=$arm rc=$? (t=$(elapsed) s)" | tee -a "$OUT/results.txt"
}

echo "# round 1, 2 ranks (t=$(elapsed) s)"
sweep 1 2 force
echo "# checks (t=$(elapsed) s)"
check copy
check wfs
rounds=$((ROUNDS2 > ROUNDS4 ? ROUNDS2 : ROUNDS4))
for rnd in $(seq 1 "$rounds"); do
  if [ "$rnd" -ge 2 ] && [ "$rnd" -le "$ROUNDS2" ]; then
    echo "# round $rnd, 2 ranks (t=$(elapsed) s)"
    sweep "$rnd" 2
  fi
  if [ "$rnd" -le "$ROUNDS4" ]; then
    echo "# round $rnd, 4 ranks (t=$(elapsed) s)"
    sweep "$rnd" 4
  fi
done
echo "# report (t=$(elapsed) s)"
python3 bench/gpu/interposer_report.py "$OUT" >"$OUT/report.txt" 2>&1 || echo "report failed (report.txt)"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" $(cd "$OUT" && ls sweep-*.log checks/*/rank*.log 2>/dev/null) &&
  rm -f "$OUT"/sweep-*.log "$OUT"/checks/*/rank*.log
cat "$OUT/summary.md" 2>/dev/null
echo "total $(elapsed) s"
