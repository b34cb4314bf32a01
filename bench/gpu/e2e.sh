#!/usr/bin/env bash
# The GPU end-to-end benchmark of issue 11, in one script for one device call, on the GPU machine
# (shared/docs/gpu-testbed.md): every rank a separate process and its own NCCL host
# (NCCL_HOSTID) on the one GPU, under MPS, so every byte between ranks crosses the NET transport
# (P2P and SHM also disabled; each job's log is checked for channels "via NET/" and none via
# P2P/SHM).
#
# Arms (ARMS, alternated within each round, the order reversed every other round):
#   sock            NCCL's Socket, its defaults (NCCL_NET=Socket)
#   sock4x1         Socket, NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=1 (the plugin's stream count)
#   sock8ch2x2      Socket, NCCL_MIN_NCHANNELS=8 NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=2
#                   (any sock[<C>ch][<T>x<S>] works: the Socket sweep; "best Socket" at each
#                   collective, rank count and size is the best of every sock* arm there)
#   bpf             the plugin (NCCL_NET_PLUGIN=lib, NCCL_NET=BPF) with its hooks off: no policy
#                   (NCCL_BPF_POLICY unset; the native per-connection counters cannot be turned
#                   off), NCCL_TUNER_PLUGIN=none (NCCL versions that do not know "none" fall
#                   back to the net plugin's library and load its tuner, which without a
#                   policy has no opinion; the report shows the TUNER/Plugin lines)
#   bpfpol          the plugin with NCCL_BPF_POLICY=conn_counter.o,size_aware.o and
#                   NCCL_TUNER_PLUGIN=lib
#   bpfhooks        the plugin with NCCL_BPF_POLICY=conn_counter.o and no tuner (the hooks' cost)
#   bpf-<io>, bpfpol-<io>  the same with NCCL_BPF_IO=<io> (auto, uring, epoll, threads)
#   bpf@<tag>...    any bpf arm with the library build/libnccl-net-bpf-<tag>.so instead (an
#                   earlier build, for a before/after comparison in one run: bpf@old)
#   ...[-w<N>][-d<B>][-s<N>][-c<N>][-p<N>][-g<G>][-m<B>][-i<U>][-l<B>]  and NCCL_BPF_IO_WORKERS=N,
#                   NCCL_BPF_DIRECT_BYTES=B (libraries before chunk headers only), NCCL_BPF_NSTREAMS=N, NCCL_MIN_NCHANNELS=N,
#                   NCCL_BPF_IO_SPIN_US=N, NCCL_BPF_SPEED_MBPS=G*1000 (the speed reported to
#                   NCCL, which sets its channel count), NCCL_BPF_MIN_CHUNK=B (the smallest
#                   piece a message is cut into over the streams), NCCL_BPF_DIRECT_IDLE_US=U (as -d),
#                   NCCL_BPF_INLINE_BYTES=B (the plugin's settings sweep), in that
#                   order: bpf-uring-w8-d0, bpf-threads-s8-c8, bpf-g400
#   ...-r<name>     (last, on any sock or bpf arm) the tuner's rules policy with the rules file
#                   $BUILD/<name>.conf: NCCL_TUNER_PLUGIN=lib NCCL_BPF_POLICY=rules.o (bpfpol:
#                   conn_counter.o,rules.o) NCCL_TUNER_CONFIG_FILE=$BUILD/<name>.conf, so Socket
#                   and the plugin can be tuned alike (bench/gpu/tuner_sweep.py writes such files)
# SWEEP_ARMS: more Socket settings (sock* names), run alternated with the others in every round
# but only at SWEEP_SIZES / SWEEP_COLLS / SWEEP_DECODE; they count for "best Socket" where measured.
#
# Per job (one arm, one rank count, one round): bench/gpu/e2e.py runs COLLS (all_reduce,
# all_gather, reduce_scatter, broadcast) at SIZES, each time-boxed (TIME_PER_SIZE seconds of
# timed calls after a checked warm-up and an estimate), then the decode pattern (DECODE_PER =
# 160 back-to-back bf16 all_reduces per token, time per token, median) at DECODE sizes; every
# result of every call checked on every rank.
# Budget: jobs start only while their expected end (the longest job of that rank count so far,
# JOB_GUESS before the first) is before DEADLINE seconds from the start; a job is killed at
# DEADLINE + 20 s, or JOB_TIMEOUT; when a rank fails, the others are stopped 5 s later.
#
# Output: $OUT/summary.md (bench/gpu/e2e_report.py: a table per collective and rank count, the
# decode table, verdicts on the goals) and $OUT/e2e.tar.gz (every log, results.txt, jobs.txt,
# meta.txt, summary.md); nothing else is left in $OUT.
# Expects BUILD (default build/) from scripts/stage.sh: libnccl-net-bpf.so, and conn_counter.o and
# size_aware.o for the bpfpol arms.
# Usage: bench/gpu/e2e.sh [outdir]
# Knobs: RANKS ("2 4"), ROUNDS (2), ARMS, SWEEP_ARMS (""), SIZES, COLLS, DECODE (sizes; "" none),
#   TIME_PER_SIZE (0.15), DECODE_TIME (0.4), DEADLINE (540), JOB_TIMEOUT (150), JOB_GUESS (30),
#   NCCL_SUBSYS (INIT,NET: NCCL's TUNING lines come once per collective, so not by default).
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-e2e}}
W=${WORK:-/tmp/ncclbpf-e2e-work}
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
die() { echo "e2e.sh: $*" >&2; exit 2; }

B=$(cd "${BUILD:-build}" 2>/dev/null && pwd) || die "no build folder ${BUILD:-build}: run scripts/stage.sh on a build machine (and carry build/)"
LIB=$B/libnccl-net-bpf.so
RANKS=${RANKS:-2 4}
ROUNDS=${ROUNDS:-2}
ARMS=${ARMS:-sock sock4x1 sock8ch2x2 bpf bpfpol}
SWEEP_ARMS=${SWEEP_ARMS:-}
SIZES=${SIZES:-8 128 1024 16384 65536 262144 1048576 4194304 16777216 67108864 268435456}
COLLS=${COLLS:-all_reduce all_gather reduce_scatter broadcast}
DECODE=${DECODE-16384 262144 1048576}
SWEEP_SIZES=${SWEEP_SIZES:-65536 1048576 4194304 67108864}
SWEEP_COLLS=${SWEEP_COLLS:-all_reduce}
SWEEP_DECODE=${SWEEP_DECODE-262144}
TIME_PER_SIZE=${TIME_PER_SIZE:-0.15}
DECODE_TIME=${DECODE_TIME:-0.4}
DEADLINE=${DEADLINE:-540}
JOB_TIMEOUT=${JOB_TIMEOUT:-150}
JOB_GUESS=${JOB_GUESS:-30}
NCCL_SUBSYS=${NCCL_SUBSYS:-INIT,NET}

# arm_env ARM: the arm's environment (VAR=VALUE words), or exit 1 for an unknown name.
arm_env() {
  local a=$1 io=
  if [[ $a =~ ^sock(([0-9]+)ch)?(([0-9]+)x([0-9]+))?(-r([a-z0-9_]+))?$ ]]; then
    echo -n "NCCL_NET=Socket"
    [ -n "${BASH_REMATCH[2]}" ] && echo -n " NCCL_MIN_NCHANNELS=${BASH_REMATCH[2]}"
    [ -n "${BASH_REMATCH[4]}" ] && echo -n " NCCL_SOCKET_NTHREADS=${BASH_REMATCH[4]} NCCL_NSOCKS_PERTHREAD=${BASH_REMATCH[5]}"
    [ -n "${BASH_REMATCH[7]}" ] && echo -n " NCCL_TUNER_PLUGIN=$LIB NCCL_BPF_POLICY=$B/rules.o NCCL_TUNER_CONFIG_FILE=$B/${BASH_REMATCH[7]}.conf"
    echo
    return 0
  fi
  local base=$a lib=$LIB
  if [[ $a =~ ^([a-z]+)@([a-z0-9]+)(.*)$ ]]; then
    base=${BASH_REMATCH[1]}${BASH_REMATCH[3]}
    lib=$B/libnccl-net-bpf-${BASH_REMATCH[2]}.so
  fi
  if [[ $base =~ ^(bpf|bpfpol|bpfhooks)(-(auto|uring|epoll|threads))?(-w([0-9]+))?(-d([0-9]+[KM]?))?(-s([0-9]+))?(-c([0-9]+))?(-p([0-9]+))?(-g([0-9]+))?(-m([0-9]+[KM]?))?(-i([0-9]+))?(-l([0-9]+[KM]?))?(-r([a-z0-9_]+))?$ ]]; then
    io=${BASH_REMATCH[3]}
    local rules=${BASH_REMATCH[23]}
    local w=${BASH_REMATCH[5]} d=${BASH_REMATCH[7]} st=${BASH_REMATCH[9]} ch=${BASH_REMATCH[11]} sp=${BASH_REMATCH[13]} g=${BASH_REMATCH[15]} mc=${BASH_REMATCH[17]} di=${BASH_REMATCH[19]} il=${BASH_REMATCH[21]}
    echo -n "NCCL_NET_PLUGIN=$lib NCCL_NET=BPF"
    if [ -n "$rules" ]; then
      local pol=$B/rules.o
      [ "${BASH_REMATCH[1]}" = bpfpol ] && pol=$B/conn_counter.o,$pol
      echo -n " NCCL_TUNER_PLUGIN=$lib NCCL_BPF_POLICY=$pol NCCL_TUNER_CONFIG_FILE=$B/$rules.conf"
    elif [ "${BASH_REMATCH[1]}" = bpfpol ]; then
      echo -n " NCCL_TUNER_PLUGIN=$lib NCCL_BPF_POLICY=$B/conn_counter.o,$B/size_aware.o"
    elif [ "${BASH_REMATCH[1]}" = bpfhooks ]; then
      echo -n " NCCL_TUNER_PLUGIN=none NCCL_BPF_POLICY=$B/conn_counter.o"
    else
      echo -n " NCCL_TUNER_PLUGIN=none"
    fi
    [ -n "$io" ] && echo -n " NCCL_BPF_IO=$io"
    [ -n "$w" ] && echo -n " NCCL_BPF_IO_WORKERS=$w"
    [ -n "$d" ] && echo -n " NCCL_BPF_DIRECT_BYTES=$d"
    [ -n "$st" ] && echo -n " NCCL_BPF_NSTREAMS=$st"
    [ -n "$ch" ] && echo -n " NCCL_MIN_NCHANNELS=$ch"
    [ -n "$sp" ] && echo -n " NCCL_BPF_IO_SPIN_US=$sp"
    [ -n "$g" ] && echo -n " NCCL_BPF_SPEED_MBPS=$((g * 1000))"
    [ -n "$mc" ] && echo -n " NCCL_BPF_MIN_CHUNK=$mc"
    [ -n "$di" ] && echo -n " NCCL_BPF_DIRECT_IDLE_US=$di"
    [ -n "$il" ] && echo -n " NCCL_BPF_INLINE_BYTES=$il"
    echo
    return 0
  fi
  return 1
}

# Everything checked before the GPU is touched.
[ -f "$LIB" ] || die "missing $LIB: run scripts/stage.sh on a build machine"
for a in $ARMS $SWEEP_ARMS; do
  arm_env "$a" >/dev/null || die "unknown arm '$a' (sock[<C>ch][<T>x<S>][-r<rules>], bpf[@<tag>], bpfpol[@<tag>], bpfhooks[@<tag>], bpf-<io>, bpfpol-<io> [-w<N>][-d<B>][-s<N>][-c<N>][-p<N>][-g<G>][-m<B>][-i<U>][-l<B>][-r<rules>]; io: auto uring epoll threads)"
  if [[ $a =~ -r([a-z0-9_]+)$ ]]; then
    for f in "$B/rules.o" "$B/${BASH_REMATCH[1]}.conf"; do [ -f "$f" ] || die "missing $f (arm $a)"; done
  fi
  if [[ $a =~ @([a-z0-9]+) ]]; then
    [ -f "$B/libnccl-net-bpf-${BASH_REMATCH[1]}.so" ] || die "missing $B/libnccl-net-bpf-${BASH_REMATCH[1]}.so (arm $a)"
  fi
  case $a in
    bpfhooks*) [ -f "$B/conn_counter.o" ] || die "missing $B/conn_counter.o (arm $a): run scripts/stage.sh" ;;
    bpfpol*) for f in "$B/conn_counter.o" "$B/size_aware.o"; do [ -f "$f" ] || die "missing $f (arm $a): run scripts/stage.sh"; done ;;
  esac
done
for a in $SWEEP_ARMS; do [[ $a == sock* ]] || die "SWEEP_ARMS takes Socket arms only, not '$a'"; done
for n in $RANKS; do [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || die "RANKS: '$n' is not a rank count >= 2"; done
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || die "ROUNDS: '$ROUNDS' is not a count >= 1"
for s in $SIZES $DECODE $SWEEP_SIZES; do [[ $s =~ ^[0-9]+$ ]] && [ "$s" -ge 1 ] || die "size '$s' is not a byte count"; done
for c in $COLLS $SWEEP_COLLS; do
  case $c in all_reduce | all_gather | reduce_scatter | broadcast) ;; *) die "unknown collective '$c'" ;; esac
done
command -v python3 >/dev/null || die "python3 not found"
command -v nvidia-cuda-mps-control >/dev/null || die "nvidia-cuda-mps-control not found (MPS is needed: shared/docs/gpu-testbed.md)"

rm -rf "$W"
mkdir -p "$W/logs" "$OUT" || die "cannot make $W or $OUT"
: >"$W/results.txt"
: >"$W/jobs.txt"

finished=0
finish() {
  [ "$finished" = 1 ] && return
  finished=1
  echo quit | nvidia-cuda-mps-control 2>/dev/null
  echo "total $(since) s" >>"$W/meta.txt"
  python3 bench/gpu/e2e_report.py "$W" >"$W/summary.md" 2>"$W/report.err" ||
    { echo "report failed:"; cat "$W/report.err"; } >>"$W/summary.md"
  cp "$W/summary.md" "$OUT/summary.md"
  rm -f "$OUT/e2e.tar.gz"
  tar -C "$W" -czf "$OUT/e2e.tar.gz" . || echo "e2e.sh: tar failed" >&2
  cat "$OUT/summary.md"
  echo "e2e.sh: $OUT/summary.md and $OUT/e2e.tar.gz, $(since) s"
}
trap finish EXIT
trap 'echo "e2e.sh: stopped by a signal at $(since) s" >>"$W/meta.txt"; exit 3' TERM INT

export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d 2>/dev/null || echo "note: nvidia-cuda-mps-control -d failed (already running?)"

{
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  echo "host $(hostname) cpus $(nproc)"
  nvidia-smi -L 2>&1 | sed 's/^/nvidia-smi-L /'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  python3 -c 'import torch, torch.cuda.nccl as n; v = n.version(); print("torch", torch.__version__, "nccl", ".".join(map(str, v)) if isinstance(v, tuple) else v)' 2>&1
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "lib $(sha256sum "$LIB" | cut -c1-16) $LIB"
  [ -x "$B/ncclbpf" ] && echo "cli $("$B/ncclbpf" --version 2>&1)"
  for a in $ARMS; do echo "arm $a $(arm_env "$a")"; done
  for a in $SWEEP_ARMS; do echo "sweep_arm $a $(arm_env "$a")"; done
  echo "RANKS=$RANKS"
  echo "ROUNDS=$ROUNDS"
  echo "SIZES=$SIZES"
  echo "COLLS=$COLLS"
  echo "DECODE=$DECODE"
  echo "SWEEP_SIZES=$SWEEP_SIZES"
  echo "SWEEP_COLLS=$SWEEP_COLLS"
  echo "SWEEP_DECODE=$SWEEP_DECODE"
  echo "TIME_PER_SIZE=$TIME_PER_SIZE"
  echo "DECODE_TIME=$DECODE_TIME"
  echo "DEADLINE=$DEADLINE"
} | tee "$W/meta.txt"

declare -A longest # rank count -> seconds of its longest job so far
port=29900

# job ARM N ROUND SIZES COLLS DECODE: one job; its lines into results.txt and jobs.txt.
job() {
  local arm=$1 n=$2 round=$3 sizes=$4 colls=$5 decode=$6
  local label=$arm-n$n-r$round t_job=$(date +%s) env_words left guess limit
  guess=${longest[$n]:-$JOB_GUESS}
  left=$((DEADLINE - $(since)))
  if [ "$guess" -gt "$left" ]; then
    echo "SKIPPED arm=$arm ranks=$n round=$round reason=deadline left=${left}s expected=${guess}s" | tee -a "$W/jobs.txt"
    return
  fi
  limit=$((DEADLINE + 20 - $(since)))
  [ "$limit" -gt "$JOB_TIMEOUT" ] && limit=$JOB_TIMEOUT
  env_words=$(arm_env "$arm")
  port=$((port + 1))
  local pids=() r
  for r in $(seq 0 $((n - 1))); do
    # shellcheck disable=SC2086
    env $env_words ARM=$arm ROUND=$round SIZES="$sizes" COLLS="$colls" DECODE="$decode" \
      TIME_PER_SIZE=$TIME_PER_SIZE DECODE_TIME=$DECODE_TIME PYTHONUNBUFFERED=1 \
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=$NCCL_SUBSYS \
      timeout -k 5 "$limit" python3 bench/gpu/e2e.py >"$W/logs/$label-rank$r.log" 2>&1 &
    pids+=($!)
  done
  # Fail fast: once a rank fails, the others (stuck in a collective) get 5 s, then are stopped.
  local live=("${pids[@]}") rc first_rc=0 done_pid p stopper= keep
  while [ "${#live[@]}" -gt 0 ]; do
    done_pid=
    wait -n -p done_pid "${live[@]}"
    rc=$?
    [ -z "$done_pid" ] && { echo "  $label: wait failed ($rc) with ranks ${live[*]} left"; break; }
    keep=()
    for p in "${live[@]}"; do [ "$p" != "$done_pid" ] && keep+=("$p"); done
    live=("${keep[@]}")
    if [ "$rc" -ne 0 ] && [ "$first_rc" -eq 0 ]; then
      first_rc=$rc
      echo "  $label: a rank (pid $done_pid) exited $rc at $(since) s; stopping the others in 5 s"
      (
        sleep 5
        for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
      ) &
      stopper=$!
    fi
  done
  [ -n "$stopper" ] && kill "$stopper" 2>/dev/null
  local secs=$(($(date +%s) - t_job))
  [ "$secs" -gt "${longest[$n]:-0}" ] && longest[$n]=$secs
  local logs=("$W/logs/$label"-rank*.log)
  local net other using version done_lines init
  net=$(cat "${logs[@]}" | grep -c 'via NET/')
  other=$(cat "${logs[@]}" | grep -c -E 'via (P2P|SHM|CUMEM)')
  using=$(grep -h -m1 -o 'Using network [^ ]*' "${logs[0]}" | head -1 | sed 's/Using network //')
  version=$(grep -h -m1 -o 'NCCL version [^ ]*' "${logs[0]}" | head -1 | sed 's/NCCL version //')
  done_lines=$(cat "${logs[@]}" | grep -c '^DONE ')
  init=$(grep -h -m1 -o 'seconds_init=[0-9.]*' "${logs[0]}" | sed 's/.*=//')
  echo "JOB arm=$arm ranks=$n round=$round rc=$first_rc seconds=$secs via_net=$net via_other=$other network=${using:-?} nccl=${version:-?} done=$done_lines/$n init=${init:-?} t_end=$(since)" |
    tee -a "$W/jobs.txt"
  grep -h -E '^(RESULT|DECODE) ' "${logs[0]}" >>"$W/results.txt"
}

for round in $(seq 1 "$ROUNDS"); do
  order="$ARMS $SWEEP_ARMS"
  if [ $((round % 2)) -eq 0 ]; then order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for n in $RANKS; do
    for arm in $order; do
      if [[ " $SWEEP_ARMS " == *" $arm "* ]]; then
        job "$arm" "$n" "$round" "$SWEEP_SIZES" "$SWEEP_COLLS" "$SWEEP_DECODE"
      else
        job "$arm" "$n" "$round" "$SIZES" "$COLLS" "$DECODE"
      fi
    done
  done
done
