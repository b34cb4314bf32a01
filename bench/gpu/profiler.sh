#!/usr/bin/env bash
# The GPU check of the profiler plugin (ncclProfiler_v4..v6 in libnccl-net-bpf.so), in one
# script for one device call on the GPU machine (shared/docs/gpu-testbed.md): every rank a
# separate process and its own NCCL host (NCCL_HOSTID) on the one GPU, under MPS, P2P and SHM
# disabled, so every byte between ranks crosses the net plugin (each job's log is checked for
# channels "via NET/" and none via P2P/SHM). float32 all_reduce throughout; every result checked.
#
#   1. four plugin types from one library (job plugins-n2): 2 ranks, PLUGIN_ITERS checked
#      all_reduces of PLUGIN_SIZE with NCCL_NET_PLUGIN=lib NCCL_ENV_PLUGIN=lib NCCL_NET=BPF,
#      NCCL_TUNER_PLUGIN and NCCL_PROFILER_PLUGIN unset (NCCL 2.28 then takes both from the net
#      library), NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING,NET,PROFILE; the report prints
#      rank 0's lines that show each of net, tuner, profiler and env loading, verbatim, and every
#      PROFILER/BPF line (event mask, finalize summary).
#   2. accuracy against CUDA events (jobs acc-n<N>, for each N in RANKS): per size, WARMUP
#      checked calls, then ITERS calls (ITERS_LARGE from 64 MiB on), each bracketed by CUDA
#      events and synchronized, once per variant in ACC_VARIANTS: "queued" (a torch.cuda._sleep
#      of SLEEP_CYCLES before the start event, so the launch is hidden: GPU time only) and
#      "plain" (the host's launch latency included); the profiler's mean per collective from each rank's metrics
#      endpoint (NCCL_BPF_METRICS_ADDR=127.0.0.1:MPORT+rank, scraped before and after the calls:
#      delta _sum / delta _count of nccl_collective_duration_seconds, collective allreduce, the
#      size's bucket); delta count against ITERS; misuse and open events at the end.
#   3. overhead, profiler on against off (jobs ovh-on-r<R>, ovh-off-r<R>): 2 ranks (OVH_RANKS),
#      ROUNDS rounds, arms alternated (on off, off on, on off, ...), each a fresh process group:
#        on   NCCL_NET_PLUGIN=lib NCCL_NET=BPF, NCCL_PROFILER_PLUGIN unset (NCCL finds it in lib)
#        off  the same with NCCL_PROFILER_PLUGIN=none
#      per size, OVH_BATCHES batches of K back-to-back calls between CUDA events (K from the first
#      overhead job, the same in every later one); time per collective (median batch, slowest
#      rank), busbw as nccl-tests (2 (n-1)/n x bytes / time); on/off per size with the spread.
#   Order: 1, 2 at the first rank count, overhead rounds 1-2, 2 at the other rank counts, the
#   remaining rounds. Budget: a job starts only while its expected end (the longest job of its
#   kind so far, JOB_GUESS before the first) is before DEADLINE seconds from the start; a job is
#   killed at DEADLINE + 20 s or JOB_TIMEOUT; when a rank fails the others are stopped 5 s later.
#
# Output: $OUT/profiler.md (bench/gpu/profiler_report.py: jobs, the plugin lines, the accuracy
# and overhead tables, verdicts), $OUT/profiler.json (the same data, raw) and
# $OUT/profiler-logs.tar.gz (every rank's log and records, the profiler's metrics at the end of
# each accuracy job, meta.txt, jobs.txt); nothing else is left in $OUT.
#
# Usage: bench/gpu/profiler.sh [outdir]      (outdir default $OUT, else /tmp/ncclbpf-profiler)
#        bench/gpu/profiler.sh --help
# Knobs (environment):
#   BUILD        folder with libnccl-net-bpf.so (default build/, from scripts/stage.sh)
#   RANKS        rank counts of the accuracy check ("2 4")
#   ROUNDS       overhead rounds (4; at least 2 for a spread)
#   SIZES        bytes ("8 65536 1048576 16777216 134217728")
#   ITERS        accuracy: timed calls per size (50); ITERS_LARGE (20) from LARGE_FROM (64 MiB)
#   WARMUP       checked calls before the timed ones (5)
#   ACC_VARIANTS accuracy variants ("queued plain"); SLEEP_CYCLES (300000, ~150 us: the queued spin)
#   DEADLINE     seconds from the start after which no job starts (420)
#   JOB_TIMEOUT  seconds per job at most (150); JOB_GUESS (45): a job's expected length at first
#   OVH_RANKS (2), OVH_BATCHES (5), OVH_BATCH_S (0.2 s per batch, sets K), OVH_K ("size:k,..."
#   fixes K), PLUGIN_SIZE (1048576), PLUGIN_ITERS (20), MPORT (19700: metrics ports),
#   TOL_REL (0.10), TOL_US (5): accuracy tolerance, |profiler - CUDA| <= max(TOL_REL x CUDA, TOL_US)
#   PAIRED       1: after everything else, one job "paired-n2" (2 ranks, profiler loaded): per size,
#                PAIRED_PAIRS (20) pairs of batches, profiler on and off in the same processes
#                (ncclBpfProfilerPause/Resume switch NCCL's mask), alternated; the ratio on/off of
#                neighbouring batches, median and quartiles (0: not run, the default)
#   ON_EXTRA     VAR=VALUE words added to the overhead's "on" arm only, to attribute its cost:
#                e.g. ON_EXTRA=NCCL_PROFILE_EVENT_MASK=6 (collectives and p2p without their kernel
#                channels: the plugin's event handling without NCCL's profiler proxy operations)
set -u
case "${1:-}" in
  -h | --help)
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
    exit 0
    ;;
esac
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-profiler}}
W=${WORK:-/tmp/ncclbpf-profiler-work}
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
die() { echo "profiler.sh: $*" >&2; exit 2; }

B=$(cd "${BUILD:-build}" 2>/dev/null && pwd) || die "no build folder ${BUILD:-build}: run scripts/stage.sh on a build machine (and carry build/)"
LIB=$B/libnccl-net-bpf.so
RANKS=${RANKS:-2 4}
ROUNDS=${ROUNDS:-4}
SIZES=${SIZES:-8 65536 1048576 16777216 134217728}
ITERS=${ITERS:-50}
ITERS_LARGE=${ITERS_LARGE:-20}
LARGE_FROM=${LARGE_FROM:-67108864}
WARMUP=${WARMUP:-5}
DEADLINE=${DEADLINE:-420}
JOB_TIMEOUT=${JOB_TIMEOUT:-150}
JOB_GUESS=${JOB_GUESS:-45}
OVH_RANKS=${OVH_RANKS:-2}
OVH_BATCHES=${OVH_BATCHES:-5}
OVH_BATCH_S=${OVH_BATCH_S:-0.2}
ACC_VARIANTS=${ACC_VARIANTS:-queued plain}
SLEEP_CYCLES=${SLEEP_CYCLES:-300000}
OVH_K=${OVH_K:-}
PLUGIN_SIZE=${PLUGIN_SIZE:-1048576}
PLUGIN_ITERS=${PLUGIN_ITERS:-20}
MPORT=${MPORT:-19700}
export TOL_REL=${TOL_REL:-0.10} TOL_US=${TOL_US:-5}
COMMON_SUBSYS=INIT,ENV,NET,PROFILE
PLUGIN_SUBSYS=INIT,ENV,TUNING,NET,PROFILE
# Never inherited from the caller: every job sets what it means.
UNSET=(-u NCCL_NET_PLUGIN -u NCCL_TUNER_PLUGIN -u NCCL_PROFILER_PLUGIN -u NCCL_ENV_PLUGIN -u NCCL_NET
  -u NCCL_BPF_POLICY -u NCCL_BPF_METRICS_ADDR -u NCCL_BPF_PROFILER -u NCCL_PROFILE_EVENT_MASK
  -u NCCL_ALGO -u NCCL_PROTO -u NCCL_MIN_NCHANNELS -u NCCL_MAX_NCHANNELS -u NCCL_DEBUG_FILE -u SCRAPE_URL)

# arm_env ARM: the arm's environment (VAR=VALUE words).
arm_env() {
  case $1 in
    plugins) echo "NCCL_NET_PLUGIN=$LIB NCCL_ENV_PLUGIN=$LIB NCCL_NET=BPF" ;;
    acc) echo "NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF" ;;
    on) echo "NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF ${ON_EXTRA:-}" ;;
    off) echo "NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_PROFILER_PLUGIN=none" ;;
    *) return 1 ;;
  esac
}

# Everything checked before the GPU is touched.
[ -f "$LIB" ] || die "missing $LIB: run scripts/stage.sh on a build machine"
for n in $RANKS $OVH_RANKS; do [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || die "RANKS/OVH_RANKS: '$n' is not a rank count >= 2"; done
[[ $ROUNDS =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || die "ROUNDS: '$ROUNDS' is not a count >= 1"
for s in $SIZES $PLUGIN_SIZE; do [[ $s =~ ^[0-9]+$ ]] && [ "$s" -ge 1 ] || die "size '$s' is not a byte count"; done
for a in $ACC_VARIANTS; do case $a in queued | plain) ;; *) die "ACC_VARIANTS: '$a' (queued, plain)" ;; esac; done
for v in SLEEP_CYCLES ITERS ITERS_LARGE WARMUP DEADLINE JOB_TIMEOUT JOB_GUESS OVH_BATCHES PLUGIN_ITERS MPORT LARGE_FROM; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v: '${!v}' is not a whole number"
done
[ -z "$OVH_K" ] || [[ $OVH_K =~ ^[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*$ ]] || die "OVH_K: '$OVH_K' is not size:k[,size:k...]"
command -v python3 >/dev/null || die "python3 not found"
command -v nvidia-cuda-mps-control >/dev/null || die "nvidia-cuda-mps-control not found (MPS is needed: shared/docs/gpu-testbed.md)"
[ -f bench/gpu/profiler.py ] && [ -f bench/gpu/profiler_report.py ] || die "bench/gpu/profiler.py or profiler_report.py missing"

rm -rf "$W"
mkdir -p "$W/logs" "$OUT" || die "cannot make $W or $OUT"
: >"$W/jobs.txt"

finished=0
finish() {
  [ "$finished" = 1 ] && return
  finished=1
  echo quit | nvidia-cuda-mps-control 2>/dev/null
  echo "total $(since) s" >>"$W/meta.txt"
  python3 bench/gpu/profiler_report.py "$W" "$W/profiler.json" >"$W/profiler.md" 2>"$W/report.err" ||
    { echo; echo "report failed:"; cat "$W/report.err"; } >>"$W/profiler.md"
  cp "$W/profiler.md" "$OUT/profiler.md"
  [ -f "$W/profiler.json" ] && cp "$W/profiler.json" "$OUT/profiler.json"
  rm -f "$OUT/profiler-logs.tar.gz"
  tar -C "$W" -czf "$OUT/profiler-logs.tar.gz" . || echo "profiler.sh: tar failed" >&2
  cat "$OUT/profiler.md"
  echo "profiler.sh: $OUT/profiler.md, $OUT/profiler.json and $OUT/profiler-logs.tar.gz, $(since) s"
}
trap finish EXIT
trap 'echo "profiler.sh: stopped by a signal at $(since) s" >>"$W/meta.txt"; exit 3' TERM INT

export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d 2>/dev/null || echo "note: nvidia-cuda-mps-control -d failed (already running?)"

{
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  echo "host $(hostname) cpus $(nproc)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  python3 -c 'import torch, torch.cuda.nccl as n; v = n.version(); print("torch", torch.__version__, "nccl", ".".join(map(str, v)) if isinstance(v, tuple) else v)' 2>&1
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (working tree differs)')"
  echo "lib $(sha256sum "$LIB" | cut -c1-16) $LIB"
  # The plugin tables' names in the library's strings (its dynamic symbols; no nm needed).
  echo "lib_symbols $(grep -a -o -E 'nccl(NetPlugin|TunerPlugin|Profiler|EnvPlugin)_v[0-9]+' "$LIB" | sort -u | tr '\n' ' ')"
  for a in plugins acc on off; do echo "arm $a $(arm_env $a)"; done
  echo "RANKS=$RANKS"
  echo "OVH_RANKS=$OVH_RANKS"
  echo "ROUNDS=$ROUNDS"
  echo "SIZES=$SIZES"
  echo "ITERS=$ITERS"
  echo "ITERS_LARGE=$ITERS_LARGE"
  echo "LARGE_FROM=$LARGE_FROM"
  echo "WARMUP=$WARMUP"
  echo "ACC_VARIANTS=$ACC_VARIANTS"
  echo "SLEEP_CYCLES=$SLEEP_CYCLES"
  echo "OVH_BATCHES=$OVH_BATCHES"
  echo "OVH_BATCH_S=$OVH_BATCH_S"
  echo "PLUGIN_SIZE=$PLUGIN_SIZE"
  echo "PLUGIN_ITERS=$PLUGIN_ITERS"
  echo "TOL_REL=$TOL_REL"
  echo "TOL_US=$TOL_US"
  echo "DEADLINE=$DEADLINE"
  echo "common NCCL_HOSTID=host<rank> NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO LOCAL_RANK=0"
  echo "subsys plugins=$PLUGIN_SUBSYS others=$COMMON_SUBSYS"
} | tee "$W/meta.txt"

declare -A longest # kind -> seconds of its longest job so far
port=29700
mport=$MPORT

# job LABEL KIND ARM N ROUND [VAR=VALUE ...]: one job (KIND plugins, acc or ovh); its JOB line
# in jobs.txt. Returns 0 if it ran and every rank exited 0.
job() {
  local label=$1 kind=$2 arm=$3 n=$4 round=$5
  shift 5
  local extra=("$@") t_job left guess limit subsys=$COMMON_SUBSYS mode=accuracy
  t_job=$(date +%s)
  guess=${longest[$kind]:-$JOB_GUESS}
  left=$((DEADLINE - $(since)))
  if [ "$guess" -gt "$left" ]; then
    echo "SKIPPED label=$label kind=$kind arm=$arm ranks=$n round=$round reason=deadline left=${left}s expected=${guess}s" | tee -a "$W/jobs.txt"
    return 1
  fi
  limit=$((DEADLINE + 20 - $(since)))
  [ "$limit" -gt "$JOB_TIMEOUT" ] && limit=$JOB_TIMEOUT
  [ "$kind" = plugins ] && subsys=$PLUGIN_SUBSYS
  [ "$kind" = ovh ] && mode=overhead
  [ "$kind" = pair ] && mode=paired
  local env_words
  env_words=$(arm_env "$arm") || die "unknown arm $arm"
  port=$((port + 1))
  local pids=() r metrics
  for r in $(seq 0 $((n - 1))); do
    metrics=()
    [ "$kind" != ovh ] && [ "$kind" != pair ] && metrics=(NCCL_BPF_METRICS_ADDR=127.0.0.1:$((mport + r)) PROM_DUMP="$W/logs/$label-rank$r.prom")
    # shellcheck disable=SC2086
    env "${UNSET[@]}" $env_words "${metrics[@]}" \
      MODE=$mode LABEL=$label ARM=$arm ROUND=$round SIZES="$SIZES" ITERS=$ITERS ITERS_LARGE=$ITERS_LARGE \
      LARGE_FROM=$LARGE_FROM WARMUP=$WARMUP ACC_VARIANTS="$ACC_VARIANTS" SLEEP_CYCLES=$SLEEP_CYCLES OVH_BATCHES=$OVH_BATCHES OVH_BATCH_S=$OVH_BATCH_S OVH_K="$OVH_K" \
      RESULT_FILE="$W/logs/$label-rank$r.jsonl" PYTHONUNBUFFERED=1 \
      RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=$subsys "${extra[@]}" \
      timeout -k 5 "$limit" python3 bench/gpu/profiler.py >"$W/logs/$label-rank$r.log" 2>&1 &
    pids+=($!)
  done
  mport=$((mport + 16))
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
  [ "$secs" -gt "${longest[$kind]:-0}" ] && longest[$kind]=$secs
  local logs=("$W/logs/$label"-rank*.log) l0="$W/logs/$label-rank0.log"
  local net other using version done_lines prof_loaded prof_lines
  net=$(cat "${logs[@]}" | grep -c 'via NET/')
  other=$(cat "${logs[@]}" | grep -c -E 'via (P2P|SHM|CUMEM)')
  using=$(grep -h -m1 -o 'Using network [^ ]*' "$l0" | head -1 | sed 's/Using network //')
  version=$(grep -h -m1 -o 'NCCL version [^ ]*' "$l0" | head -1 | sed 's/NCCL version //')
  done_lines=$(cat "${logs[@]}" | grep -c '^DONE ')
  prof_loaded=$(cat "${logs[@]}" | grep -c 'PROFILER/Plugin: Loaded')
  prof_lines=$(cat "${logs[@]}" | grep -c 'PROFILER/BPF')
  echo "JOB label=$label kind=$kind arm=$arm ranks=$n round=$round rc=$first_rc seconds=$secs via_net=$net via_other=$other network=${using:-?} nccl=${version:-?} done=$done_lines/$n profiler_loaded=$prof_loaded profiler_bpf_lines=$prof_lines t_end=$(since)" |
    tee -a "$W/jobs.txt"
  [ "$first_rc" -eq 0 ]
}

# ovh_round R: the two arms of overhead round R, alternated (on off, off on, ...). The first
# overhead job that ends well fixes K for every later one.
ovh_round() {
  local r=$1 arms=("on" "off") a ks
  [ $((r % 2)) -eq 0 ] && arms=("off" "on")
  for a in "${arms[@]}"; do
    if job "ovh-$a-r$r" ovh "$a" "$OVH_RANKS" "$r" && [ -z "$OVH_K" ]; then
      ks=$(grep -h -o 'OVH_K size=[0-9]* k=[0-9]*' "$W/logs/ovh-$a-r$r-rank0.log" | sed -E 's/OVH_K size=([0-9]+) k=([0-9]+)/\1:\2/' | paste -sd, -)
      if [ -n "$ks" ]; then
        OVH_K=$ks
        echo "OVH_K=$OVH_K (from ovh-$a-r$r)" | tee -a "$W/meta.txt"
      fi
    fi
  done
}

# 1. Four plugin types from one library.
job plugins-n2 plugins plugins 2 1 SIZES="$PLUGIN_SIZE" ITERS="$PLUGIN_ITERS" ITERS_LARGE="$PLUGIN_ITERS"
# 2. Accuracy at the first rank count; 3. overhead rounds 1-2; 2 at the other rank counts; the rest.
set -- $RANKS
first_n=$1
shift
other_ns="$*"
job "acc-n$first_n" acc acc "$first_n" 1
for r in $(seq 1 "$ROUNDS"); do
  [ "$r" -gt 2 ] && break
  ovh_round "$r"
done
for n in $other_ns; do job "acc-n$n" acc acc "$n" 1; done
for r in $(seq 3 "$ROUNDS"); do ovh_round "$r"; done
# 4. Paired, in-process on/off.
if [ "${PAIRED:-0}" = 1 ]; then
  job paired-n2 pair acc 2 1 PAIRED_LIB="$LIB" PAIRED_PAIRS="${PAIRED_PAIRS:-20}"
fi
