#!/usr/bin/env bash
# net_autotune on real NCCL (issue 9's GPU done-criterion), on the GPU machine
# (shared/docs/gpu-testbed.md): every rank a separate "host" on one GPU (MPS), all traffic
# through our net plugin, NCCL_NET_PLUGIN and NCCL_TUNER_PLUGIN both the library.
# For each rank count (RANKS, default "2 4"), in one script:
#   The criterion's comparison is in-process (AB_*): after each net_autotune size phase, and
#   before, during and after a loopback flood, blocks of net_autotune alternate with blocks of
#   every candidate pinned on the same communicator (autotune.py ab / abdec phases; pins staged
#   with `ncclbpf config --at-seq`, so every rank switches at the same collective), AB_ROUNDS
#   rounds with the order rotated; bench/gpu/autotune_ab.py compares each round's blocks. The
#   earlier readings below (separate static jobs, the sweep on communicators of their own,
#   contend: with before / after times) stay available: CANDS="0 1 2 3 4 5 6 7" ISWEEP=... etc.
#   1. static sweep (CANDS, default none): one job per candidate of net_autotune (0 NCCL's own choice, 1 Ring/Simple,
#      2 Ring/LL, 3 Ring/LL128, 4 Tree/Simple, 5 Tree/LL, 6 Tree/LL128, 7 Ring/Simple on 2
#      channels), forced with NCCL_ALGO / NCCL_PROTO (/ NCCL_MAX_NCHANNELS=2), no tuner policy;
#      the same all_reduce sizes and decode pattern as below (SWEEP_PLAN);
#   2. net_autotune (NCCL_BPF_POLICY=net_autotune.o, K=$K, D=$D): the same job's own static sweep
#      first (ISWEEP: each of ISWEEP_CANDS on a communicator of its own that NCCL_ALGO/NCCL_PROTO
#      restrict to it, autotune.py isweep), then the sizes one at a time, each long enough to
#      explore, settle and be measured, then a contention phase at CONTEND's size: before /
#      during / after a loopback flood (FLOOD_PAIRS TCP streams through 127.0.0.1, started and
#      stopped by rank 0 at fixed collectives); the sweep runs again before that phase, so both
#      sweeps bracket the size phases and neither follows the flood (AUTO_PLAN). The sweep in
#      the same process is what the criterion compares with: separate processes differ by tens
#      of percent here (step 1 shows it);
#   3. net_autotune on the decode pattern (160 back-to-back all_reduces, one sync per token) with
#      K=$KDEC, so that an epoch is one token (DEC_PLAN);
#   4. the best static choice of step 1 at CONTEND's size through the same flood (CONTEND_STATIC).
# Phase lengths: net_autotune (policies/src/net_autotune.c) learns from LEARN=4 epochs per
# candidate (one discarded, the median of the next three). An epoch's figures reach the epoch
# program D - 1 epochs after it ends (agreement delay) and the next candidate applies from the
# epoch after, so each candidate runs D + LEARN - 1 = 5 epochs (K 32, D 2), one that runs as
# NCCL's own choice (LL128 not usable, or NCCL's pick) only D before it is skipped: a size class
# new at an epoch boundary settles by collective 8 (D + 3) K + 1 = 1281 of its phase, the first
# phase of a communicator 2 D epochs later (no opinion before 2 D K + 1): 45 epochs, 1440
# collectives. Each candidate that explores within 1/4 of the best so far then duels with it:
# alternating epochs, every two adjacent ones a comparison, until one side leads by 6, at most
# DUEL_SPAN=32 epochs (31 comparisons; DUEL_SPAN + D = 34 epochs, the choice alternating): bound
# (45 + 34 d) K for a phase with d duels (the report counts them from the epoch log,
# NCCL_BPF_AGREEMENT_LOG=1; a clear duel takes 12-15 epochs). The
# sizes run 4800 = 150 epochs each (the last MEASURE=256 measured). Drift is three slow epochs in
# a row, so the flood lasts 150 epochs: 3 to notice, D of delay, then the exploration and its
# duels; 150 epochs after it (an exploration still running at the flood's end, then the
# measured window). Decode: K=$KDEC makes an epoch one token, settled by token 45 + 34 d; 150
# tokens, the last MEASURE_TOKENS=12 measured.
# LEARN and DUEL_SPAN go into meta.txt for the report (runs before stop 28 wrote DUEL=16 pairs).
# LL128=1 (default) adds jobs 2 and 3 again with NCCL_PROTO=LL,LL128,Simple (labels autoll128,
# autodecll128): NCCL here leaves LL128 off unless NCCL_PROTO names it, and a tuner's LL128
# choice is then not applied (candidates 3 and 6 run NCCL's choice); the static sweep's
# candidates 3 and 6 name it, so they do run LL128.
# ROUNDS=R (default 1) runs steps 1-3 R times, alternated (labels get _rR), since figures of
# separate processes differ by tens of percent on this machine; NOOP_AGREE=1 adds a sweep job of
# noop.o with NCCL_BPF_AGREEMENT=on (NCCL's choice with the agreement running) per round, to set
# against static0; REFRESH=round rewrites the report once per rank count and round (less time).
# Every rank checks every all_reduce (bench/gpu/autotune.py). Jobs 2 and 3 hold at the end
# (HOLD_FILE) while `ncclbpf decisions --compare PID...`, `ncclbpf status --all` and
# `ncclbpf maps PID` read them. Every rank runs under timeout(1); the script skips what would
# end past DEADLINE seconds. After each job it rewrites $OUT/summary.md, $OUT/convergence.png
# (bench/gpu/autotune_report.py) and $OUT/logs.tar.gz (every log, trace and CLI output), so a run
# stopped at its limit still returns what it did.
# Expects BUILD (default build/) from scripts/stage.sh with net_autotune.o.
# Usage: bench/gpu/autotune.sh [outdir]
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-autotune}}
mkdir -p "$OUT"
W=${WORK:-/tmp/ncclbpf-autotune-work}
rm -rf "$W"
mkdir -p "$W"
B=$(cd "${BUILD:-build}" 2>/dev/null && pwd)
LIB=$B/libnccl-net-bpf.so
CLI=$B/ncclbpf
POLICY=$B/net_autotune.o
for f in "$LIB" "$CLI" "$POLICY"; do
  [ -e "$f" ] || { echo "missing $f: run scripts/stage.sh on a build machine"; exit 1; }
done

RANKS=${RANKS:-2 4}
K=${K:-32}
D=${D:-2}
KDEC=${KDEC:-160}
CANDS=${CANDS-}
FLOOD_PAIRS=${FLOOD_PAIRS:-4}
CONTEND=${CONTEND:-1048576:320:4800:4800}
CONTEND_STATIC=${CONTEND_STATIC:-0}
LL128=${LL128:-0}
ROUNDS=${ROUNDS:-1}
NOOP_AGREE=${NOOP_AGREE:-0}
REFRESH=${REFRESH:-job}
# PIN=1: rank r of n runs on cores [r c, (r + 1) c) with c = cpus / n (taskset), as a user may
# bind ranks. Off by default: on the H200 machine (16 cores) it made separate processes differ
# more, not less (2 ranks, one setting: 476 against 788 µs at 1 MiB in two rounds of one run).
PIN=${PIN:-0}
command -v taskset >/dev/null || PIN=0
SWEEP_PLAN=${SWEEP_PLAN:-size:65536:300;size:1048576:200;size:16777216:40;decode:262144:12}
ISWEEP_CANDS=${ISWEEP_CANDS:-1,2,4,5}
# ISWEEP=isweep:65536:300:$ISWEEP_CANDS;isweep:1048576:200:$ISWEEP_CANDS;isweep:16777216:40:$ISWEEP_CANDS
# runs the earlier reading (a communicator per candidate) before and after the size phases.
ISWEEP=${ISWEEP-}
# The in-process comparison: arms (a: net_autotune; c: candidate c pinned; 3 and 6, LL128, run as
# NCCL's choice here unless NCCL_PROTO names it), rounds, block lengths (all_reduces; tokens).
AB_ARMS=${AB_ARMS:-a,0,1,2,4,5,7}
AB_ROUNDS=${AB_ROUNDS:-10}
AB_BLOCK=${AB_BLOCK:-96}
AB_BLOCK_LARGE=${AB_BLOCK_LARGE:-72}
AB_TOKENS=${AB_TOKENS:-3}
ab() { echo "ab:$1:$2:$AB_ROUNDS:$AB_ARMS"; }
CB=${CONTEND%%:*}
# Into the flood (long enough to notice, explore again and settle), the comparison during it, out
# of it (long enough to probe the old choice again), the comparison after it.
CONTEND_PLAN=${CONTEND_PLAN:-floodon:0;fsize:$CB:4800;$(ab "$CB" "$AB_BLOCK");floodoff:0;fsize:$CB:4800;$(ab "$CB" "$AB_BLOCK")}
AUTO_PLAN=${AUTO_PLAN:-${ISWEEP:+$ISWEEP;}size:65536:4800;$(ab 65536 "$AB_BLOCK");size:1048576:4800;$(ab 1048576 "$AB_BLOCK");size:16777216:4800;$(ab 16777216 "$AB_BLOCK_LARGE");${ISWEEP:+$ISWEEP;}$CONTEND_PLAN}
DEC_PLAN=${DEC_PLAN:-decode:262144:150;abdec:262144:$AB_TOKENS:$AB_ROUNDS:$AB_ARMS}
# The report's windows: the last MEASURE all_reduces of each net_autotune size phase, the last
# MEASURE_TOKENS tokens of its decode phase, the last SWEEP_FRACTION of each static phase.
MEASURE=${MEASURE:-256}
MEASURE_TOKENS=${MEASURE_TOKENS:-12}
# Epochs net_autotune learns from per candidate (4 with the median of three; 3 from commit
# 88a60e5, 2 before), for the report's convergence bound.
LEARN=${LEARN:-4}
DUEL_SPAN=${DUEL_SPAN:-32}
# The library as NCCL's profiler too in the net_autotune jobs (1, the default, as NCCL 2.28+ does
# by itself), or no profiler (0). net_autotune times epochs by the slowest rank's net busy time
# either way (wall time where a rank has none) unless its config map autotune_timing asks for the
# GPU's time (1, where the profiler timed them) or wall time (2); not set here. 0 must say `none`: NCCL 2.28+ with NCCL_PROFILER_PLUGIN unset falls back to the net
# plugin's library, which is ours (docs: nccl-plugin-abi.md, the profiler loader).
PROFILER=${PROFILER:-1}
prof_env=(NCCL_PROFILER_PLUGIN=none)
[ "$PROFILER" = 1 ] && prof_env=(NCCL_PROFILER_PLUGIN="$LIB")
SWEEP_FRACTION=${SWEEP_FRACTION:-0.6}
DEADLINE=${DEADLINE:-540}
T_STATIC=${T_STATIC:-150}
T_AUTO=${T_AUTO:-300}
t_start=$(date +%s)
since() { echo $(($(date +%s) - t_start)); }

. bench/gpu/lib.sh
start_mps
# A flood left behind (rank 0 killed): it ends itself once rank 0 is gone; end it by its pid.
stop_floods() {
  local f
  for f in "$W"/*.floodpid; do
    [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null
    rm -f "$f"
  done
}
finish() {
  stop_floods
  echo quit | nvidia-cuda-mps-control 2>/dev/null
}
trap finish EXIT

{
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  "$CLI" --version
  nproc | sed 's/^/cpus /'
  echo "K=$K D=$D KDEC=$KDEC LEARN=$LEARN DUEL_SPAN=$DUEL_SPAN PROFILER=$PROFILER MEASURE=$MEASURE MEASURE_TOKENS=$MEASURE_TOKENS SWEEP_FRACTION=$SWEEP_FRACTION"
  echo "FLOOD_PAIRS=$FLOOD_PAIRS CANDS=$CANDS RANKS=$RANKS DEADLINE=$DEADLINE LL128=$LL128 ROUNDS=$ROUNDS NOOP_AGREE=$NOOP_AGREE PIN=$PIN"
  echo "SWEEP_PLAN=$SWEEP_PLAN"
  echo "AUTO_PLAN=$AUTO_PLAN"
  echo "DEC_PLAN=$DEC_PLAN"
  echo "AB_ARMS=$AB_ARMS AB_ROUNDS=$AB_ROUNDS AB_BLOCK=$AB_BLOCK AB_BLOCK_LARGE=$AB_BLOCK_LARGE AB_TOKENS=$AB_TOKENS"
  echo "POLICY=$POLICY $(sha256sum "$POLICY" | cut -c1-16) LIB $(sha256sum "$LIB" | cut -c1-16)"
} | tee "$W/meta.txt"

cand_env() {
  case $1 in
    0) ;;
    1) echo NCCL_ALGO=Ring NCCL_PROTO=Simple ;;
    2) echo NCCL_ALGO=Ring NCCL_PROTO=LL ;;
    3) echo NCCL_ALGO=Ring NCCL_PROTO=LL128 ;;
    4) echo NCCL_ALGO=Tree NCCL_PROTO=Simple ;;
    5) echo NCCL_ALGO=Tree NCCL_PROTO=LL ;;
    6) echo NCCL_ALGO=Tree NCCL_PROTO=LL128 ;;
    7) echo NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MAX_NCHANNELS=2 ;;
  esac
}

refresh() {
  timeout 90 python3 bench/gpu/autotune_report.py "$W" "$OUT" >"$W/report.txt" 2>&1 || echo "report failed (see report.txt)"
  tar -C "$W" -czf "$OUT/logs.tar.gz.tmp" . 2>/dev/null && mv -f "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

all_hold() { # label n: every rank printed HOLDING, or some rank already exited
  local r
  for r in $(seq 0 $(($2 - 1))); do
    [ -e "$W/$1-n$2-r$r.rc" ] && return 0
    grep -q '^HOLDING ' "$W/$1-n$2-r$r.log" 2>/dev/null || return 1
  done
}

pin_cmd() { # rank n: the taskset prefix for rank `rank` of n (nothing with PIN=0)
  [ "$PIN" = 1 ] || return 0
  local c=$(($(nproc) / $2))
  [ "$c" -ge 1 ] || return 0
  echo taskset -c $(($1 * c))-$((($1 + 1) * c - 1))
}

port=30100
# job LABEL N TIMEOUT EST HOLD PLAN [VAR=VALUE ...]: N ranks of autotune.py; EST is about how long
# it takes (skipped if it would end past DEADLINE); HOLD=1: hold at the end for the CLI.
job() {
  local label=$1 n=$2 tmo=$3 est=$4 hold=$5 plan=$6 r
  shift 6
  if [ $(($(since) + est)) -gt "$DEADLINE" ]; then
    echo "SKIP label=$label n=$n (t=$(since) s, est $est s, deadline $DEADLINE s)" | tee -a "$W/runs.txt"
    return
  fi
  port=$((port + 1))
  local hf=$W/hold-$label-n$n t0
  t0=$(date +%s)
  rm -f "$hf"
  for r in $(seq 0 $((n - 1))); do
    (
      env "$@" PLAN="$plan" TRACE="$W/$label-n$n.trace" FLOOD_PIDFILE="$W/$label-n$n.floodpid" FLOOD_PAIRS=$FLOOD_PAIRS FLOOD_LIMIT=$tmo \
        $([ "$hold" = 1 ] && echo HOLD_FILE="$hf" HOLD_TIMEOUT=60) \
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
        NVSHMEM_DISABLE_NVLS=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING,PROFILE PYTHONUNBUFFERED=1 \
        NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_TUNER_PLUGIN=$LIB NCCLBPF_CLI="$CLI" \
        $(pin_cmd "$r" "$n") timeout -k 5 "$tmo" python3 bench/gpu/autotune.py "$label" >"$W/$label-n$n-r$r.log" 2>&1
      echo $? >"$W/$label-n$n-r$r.rc"
    ) &
  done
  if [ "$hold" = 1 ]; then
    local end=$(($(date +%s) + tmo + 10))
    while ! all_hold "$label" "$n" && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
    {
      local pids
      pids=$(grep -h '^HOLDING ' "$W"/$label-n$n-r*.log | sed 's/.* pid=\([0-9]*\).*/\1/' | tr '\n' ' ')
      echo "## rank pids (HOLDING lines): $pids (t=$(since) s)"
      echo "## \$ ncclbpf status --all"
      timeout 20 "$CLI" status --all
      echo "## exit $?"
      echo "## \$ ncclbpf decisions --compare $pids"
      # shellcheck disable=SC2086
      timeout 20 "$CLI" decisions --compare $pids
      echo "## exit $?"
      # shellcheck disable=SC2086
      timeout 20 "$CLI" decisions --compare $pids --json >"$W/$label-n$n-compare.json" 2>&1
      local p0
      p0=$(grep -h '^HOLDING rank=0 ' "$W/$label-n$n-r0.log" | sed 's/.* pid=\([0-9]*\).*/\1/')
      if [ -n "$p0" ]; then
        echo "## \$ ncclbpf maps $p0 (rank 0)"
        timeout 20 "$CLI" maps "$p0"
        echo "## exit $?"
        timeout 20 "$CLI" maps "$p0" --map autotune_state --json >"$W/$label-n$n-state.json" 2>&1
      fi
    } >"$W/$label-n$n-cli.txt" 2>&1
    touch "$hf"
  fi
  wait
  local rcs=""
  for r in $(seq 0 $((n - 1))); do rcs="$rcs r$r=$(cat "$W/$label-n$n-r$r.rc" 2>/dev/null || echo '?')"; done
  echo "RUN label=$label n=$n$rcs wall=$(($(date +%s) - t0)) t=$(since)" | tee -a "$W/runs.txt"
  grep -h '^FLOOD ' "$W/$label-n$n-r0.log" | sed 's/^/    /'
  stop_floods
  [ "$REFRESH" = job ] && refresh
}

: >"$W/runs.txt"
for round in $(seq 1 "$ROUNDS"); do
  sfx=$([ "$ROUNDS" -gt 1 ] && echo "_r$round")
  for n in $RANKS; do
    for c in $CANDS; do
      # shellcheck disable=SC2046
      job "static$c$sfx" "$n" "$T_STATIC" $((6 + 2 * n)) 0 "$SWEEP_PLAN" $(cand_env "$c")
    done
    if [ "$NOOP_AGREE" = 1 ]; then
      # NCCL's own choice with the agreement running (noop.o has no opinion): what the
      # agreement's records and frames cost, against static0.
      job "noopagree$sfx" "$n" "$T_STATIC" $((6 + 2 * n)) 0 "$SWEEP_PLAN" NCCL_BPF_POLICY="$B/noop.o" NCCL_BPF_AGREEMENT=on \
        NCCL_BPF_AGREEMENT_EPOCH="$K" NCCL_BPF_AGREEMENT_DELAY="$D" NCCL_BPF_AGREEMENT_TIMEOUT=30
    fi
    job "auto$sfx" "$n" "$T_AUTO" $((40 + 30 * n)) 1 "$AUTO_PLAN" NCCL_BPF_POLICY="$POLICY" NCCL_BPF_AGREEMENT_LOG=1 "${prof_env[@]}" \
      NCCL_BPF_AGREEMENT_EPOCH="$K" NCCL_BPF_AGREEMENT_DELAY="$D" NCCL_BPF_AGREEMENT_TIMEOUT=30
    job "autodec$sfx" "$n" "$T_STATIC" $((10 + 5 * n)) 1 "$DEC_PLAN" NCCL_BPF_POLICY="$POLICY" NCCL_BPF_AGREEMENT_LOG=1 "${prof_env[@]}" \
      NCCL_BPF_AGREEMENT_EPOCH="$KDEC" NCCL_BPF_AGREEMENT_DELAY="$D" NCCL_BPF_AGREEMENT_TIMEOUT=30
    if [ "$CONTEND_STATIC" = 1 ] && [ "$round" = 1 ]; then
      best=$(timeout 60 python3 bench/gpu/autotune_report.py --best "$W" "$n" "${CONTEND%%:*}" 2>/dev/null)
      best=${best:-0}
      echo "best static candidate at ${CONTEND%%:*} B, $n ranks: $best" | tee -a "$W/runs.txt"
      # shellcheck disable=SC2046
      job "contend_static$best" "$n" "$T_STATIC" $((6 + 4 * n)) 0 "contend:$CONTEND" $(cand_env "$best")
    fi
    [ "$REFRESH" = job ] || refresh
  done
done
if [ "$LL128" = 1 ]; then
  for n in $RANKS; do
    job autoll128 "$n" "$T_AUTO" $((50 + 12 * n)) 1 "$AUTO_PLAN" NCCL_BPF_POLICY="$POLICY" NCCL_BPF_AGREEMENT_LOG=1 NCCL_PROTO=LL,LL128,Simple \
      NCCL_BPF_AGREEMENT_EPOCH="$K" NCCL_BPF_AGREEMENT_DELAY="$D" NCCL_BPF_AGREEMENT_TIMEOUT=30
    job autodecll128 "$n" "$T_STATIC" $((15 + 5 * n)) 1 "$DEC_PLAN" NCCL_BPF_POLICY="$POLICY" NCCL_BPF_AGREEMENT_LOG=1 NCCL_PROTO=LL,LL128,Simple \
      NCCL_BPF_AGREEMENT_EPOCH="$KDEC" NCCL_BPF_AGREEMENT_DELAY="$D" NCCL_BPF_AGREEMENT_TIMEOUT=30
  done
fi
echo "total $(since) s" | tee -a "$W/runs.txt"
refresh
cat "$W/report.txt"
cat "$OUT/summary.md"
