#!/usr/bin/env bash
# The research prototype's NVLink case study, reproduced on the GPUs of one host, in one script
# (shared/docs/gpu-testbed.md). A tuner study: over NVLink NCCL moves the data
# itself (P2P), so the net plugin carries nothing there; the one library is loaded anyway, as
# users would load it (NCCL_NET_PLUGIN = NCCL_TUNER_PLUGIN = BUILD/libnccl-net-bpf.so,
# NCCL_NET=BPF, so a plugin that failed to start fails the job instead of NCCL falling back).
# Every rank is a separate process started here (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK =
# its CUDA device), one per GPU; every result of every call is checked on every rank against the
# exact expected values (bench/gpu/nvlink.py). NVLink multicast stays off in every process
# (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1, exported here
# and set again for every rank; nvlink.py refuses to start without them).
#
# Phases (PHASES, in this order):
#   sweep    NCCL's choices and every alternative, per collective and size (SWEEP_COLLS,
#            SWEEP_SIZES; one round):
#              default          the library, no policy: NCCL's own choice (its TUNING lines) and time;
#              sw-<Algo>-<Proto> each algorithm x protocol NCCL offers here without NVLS (ALGOS x
#                               PROTOS: Ring for every collective, Tree for all_reduce, PAT (Simple
#                               only) for all_gather/reduce_scatter where NCCL enables it, i.e.
#                               one rank per node), forced through the library's own `rules` policy
#                               with a one-line rules file per collective, so a sweep point is
#                               exactly what a derived rule can do; the TUNING lines show whether
#                               NCCL applied it (a combination NCCL cannot use stays NCCL's choice
#                               and is reported as not applicable, never as a measurement of it);
#              sw-c<C>          for each C in CHANNELS: every size's best algorithm/protocol of
#                               the above with C channels (a rule's channel field; NCCL caps it at
#                               the communicator's count, and the TUNING lines show what ran).
#            Then the rules file for `rules` (rules/final.conf, NCCL's example-tuner CSV format,
#            bench/gpu/nvlink_report.py rules): per collective and size range, the sweep's best
#            choice where it beat NCCL's default by RULE_MARGIN (3%) or more; elsewhere no rule, so
#            NCCL decides. RULES=file uses that file instead.
#            Why a rules file and not size_aware's thresholds: size_aware's shape is fixed (Tree/LL
#            below `small` from 4 nodes on, Tree/Simple up to `large`, Ring/Simple above, the same
#            for every collective, never LL128, no channel count) and was fitted to TCP; on one
#            NVLink node its first band never applies and Tree is no choice for all_gather or
#            reduce_scatter, so no pair of thresholds can say what the sweep finds. Its thresholds
#            also sit in a config map that only a staged update changes (`ncclbpf config
#            --at-seq`, with the agreement running), i.e. not before the first collective. A rules
#            file says algorithm, protocol and channels per collective and size range, in NCCL's
#            own format, read before the first decision, and checked with `ncclbpf rules check`.
#   compare  the arms (ARMS, ROUNDS rounds, alternated, the order reversed every other round):
#              nolib      NCCL alone (no plugin variables at all);
#              lib        the library as net and tuner plugin, no policy: "the default";
#              rules      lib + NCCL_BPF_POLICY=rules.o, NCCL_TUNER_CONFIG_FILE=rules/final.conf;
#              autotune   lib + NCCL_BPF_POLICY=net_autotune.o (K=AUTO_K, D=AUTO_D; the agreement
#                         runs through the node-local relay); before each size's timed calls
#                         it gets AUTO_SETTLE synchronized calls to explore and settle (at most
#                         AUTO_SETTLE_S seconds a size; default (8 (D + 3) + 2 D + 1) K, its
#                         bound for a new size class);
#              size_aware lib + size_aware.o with its built-in (TCP) thresholds (not by default).
#            The report gives lib / nolib (what loading the library costs) and each policy / lib
#            per size, flagging every ratio above 1.01.
#   net      the plugin's net path between real GPUs: NET_RANKS ranks (2), one per GPU, each its
#            own NCCL host (NCCL_HOSTID) with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, so every byte
#            crosses the NET transport as between two hosts; arms as bench/gpu/e2e.sh's (NET_ARMS):
#            sock[<C>ch][<T>x<S>] NCCL's Socket (NCCL_MIN_NCHANNELS=C, NCCL_SOCKET_NTHREADS=T
#            NCCL_NSOCKS_PERTHREAD=S; "best Socket" per size is the best of them), bpf[-s<N>][-c<N>]
#            [-g<G>] the plugin, no tuner (NCCL_TUNER_PLUGIN=none; NCCL_BPF_NSTREAMS=N,
#            NCCL_MIN_NCHANNELS=N, NCCL_BPF_SPEED_MBPS=G*1000).
#
# Fewer GPUs than RANKS (nvidia-smi -L; the one-GPU machine): the script still runs end to end as
# a test of itself. Rank r runs on GPU r mod G under MPS, each rank its own NCCL host
# (NCCL_HOSTID=host<r>), which makes NCCL move every byte through NET (Socket for nolib, the
# plugin for the others), not NVLink; the report says so at its top, loudly. The net phase with
# fewer GPUs than NET_RANKS is bench/gpu/e2e.sh's setting (MPS, one GPU).
#
# Per job bench/gpu/nvlink.py runs COLLS at SIZES, each time-boxed (TIME_PER_SIZE), its helper
# reductions over gloo so that NCCL sees only measured calls, one NCCL communicator per
# collective. Sizes that do not fit in GPU memory (or repeat the previous size's bytes) are
# skipped and listed. Budget: a job starts only while its expected length (the longest job of its
# kind so far, JOB_GUESS before the first) ends before DEADLINE seconds from the start; a job is
# killed at DEADLINE + 20 s or JOB_TIMEOUT; when a rank fails the others are stopped 5 s later
# (bench/gpu/lib.sh wait_ranks). Skipped jobs are listed in the report.
#
# Output, in OUTDIR (default /tmp/ncclbpf-nvlink): NAME.md (the summary: bench/gpu/nvlink_report.py),
# NAME.png (the plot, when matplotlib is importable; else the summary says it was skipped), and
# NAME.tar.gz (every log, results.txt, jobs.txt, meta.txt, the rules files, NCCL's TUNING lines
# per job run-length coded in tuning/); NAME defaults to nvlink-<gpu>x<count>-<date>, e.g.
# nvlink-h200x8-2026-12-05 (with -<phases> when PHASES is not all three).
# Expects BUILD (default build/) from scripts/stage.sh: libnccl-net-bpf.so, rules.o,
# net_autotune.o (size_aware.o for that arm), ncclbpf (optional: `rules check`).
# Usage: bench/gpu/nvlink.sh [outdir]
#   8 GPUs, in two device calls of under 10 minutes each (all three phases: about 15 minutes by
#   estimate, not yet measured; DEADLINE skips what would not fit):
#     PHASES="sweep compare" bench/gpu/nvlink.sh "$OUT";  PHASES=net bench/gpu/nvlink.sh "$OUT"
#   one GPU, the script's own test (plumbing, about 4 minutes):
#     RANKS=2 SIZES="8 65536 4194304" ROUNDS=1 CHANNELS=2 TIME_PER_SIZE=0.05 AUTO_SETTLE_S=1 \
#     NET_SIZES="65536 4194304" NET_ARMS="sock sock8ch2x2 bpf" DEADLINE=200 JOB_TIMEOUT=60 \
#     JOB_GUESS=20 bench/gpu/nvlink.sh "$OUT"
# Knobs: RANKS (8), SIZES (8 B to 8 GiB, x4), COLLS (all_reduce all_gather reduce_scatter),
#   ROUNDS (2), PHASES (sweep compare net), ARMS (nolib lib rules autotune), ALGOS (Ring Tree, and
#   PAT with one rank per node), PROTOS (LL LL128 Simple), CHANNELS (2 8 32; "" none),
#   SWEEP_SIZES (SIZES), SWEEP_COLLS (COLLS), RULE_MARGIN (0.03), RULES (a rules file), AUTO_K (32),
#   AUTO_D (2), AUTO_SETTLE (from K and D), AUTO_SETTLE_S (4), NET_RANKS (2), NET_ARMS (sock
#   sock4x1 sock8ch2x2 bpf), NET_SIZES (8 B to 256 MiB), NET_COLLS (COLLS), NET_ROUNDS (ROUNDS),
#   TIME_PER_SIZE (0.1), MIN_ITERS (3), MAX_ITERS (1000), DEADLINE (540), JOB_TIMEOUT (300),
#   JOB_GUESS (60), NCCL_SUBSYS (INIT,NET,TUNING,GRAPH: TUNING is needed for NCCL's choices),
#   NGPUS (GPUs seen; CUDA_VISIBLE_DEVICES's count when set, else nvidia-smi -L), NAME, BUILD
#   (build), WORK (/tmp/ncclbpf-nvlink-work), DRY (1: print every job and its environment, launch
#   nothing, write nothing).
# shellcheck disable=SC2015,SC2317 # the `[[ ]] && [ ] || die` checks; finish runs from a trap
set -u
cd "$(dirname "$0")/../.." || exit 2
# NVLink multicast off in this script and everything it starts (the machines' hard rule).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Every collective gets a communicator of its own, destroyed after it: NCCL 2.28/2.29 unload the
# net plugin with the last one and cannot load it again (NVIDIA/nccl#1978; docs/guide/using-with-nccl.md).
# A starting count of 1 keeps it loaded, in every arm alike.
export NCCL_NET_PLUGIN_REF_COUNT=1
OUT=${1:-${OUT:-/tmp/ncclbpf-nvlink}}
W=${WORK:-/tmp/ncclbpf-nvlink-work}
T0=$(date +%s)
since() { echo $(($(date +%s) - T0)); }
die() { echo "nvlink.sh: $*" >&2; exit 2; }
DRY=${DRY:-0}

if ! B=$(cd "${BUILD:-build}" 2>/dev/null && pwd); then
  [ "$DRY" = 1 ] || die "no build folder ${BUILD:-build}: run scripts/stage.sh on a build machine (and carry build/)"
  B=$PWD/${BUILD:-build}
fi
LIB=$B/libnccl-net-bpf.so
CLI=$B/ncclbpf

RANKS=${RANKS:-8}
geo() { # geo FIRST LAST FACTOR: FIRST, FIRST*FACTOR, ... up to LAST
  local s=$1
  while [ "$s" -le "$2" ]; do echo -n "$s "; s=$((s * $3)); done
}
SIZES=${SIZES:-$(geo 8 $((8 << 30)) 4)}
COLLS=${COLLS:-all_reduce all_gather reduce_scatter}
ROUNDS=${ROUNDS:-2}
PHASES=${PHASES:-sweep compare net}
ARMS=${ARMS:-nolib lib rules autotune}
PROTOS=${PROTOS:-LL LL128 Simple}
CHANNELS=${CHANNELS-2 8 32}
SWEEP_SIZES=${SWEEP_SIZES:-$SIZES}
SWEEP_COLLS=${SWEEP_COLLS:-$COLLS}
RULE_MARGIN=${RULE_MARGIN:-0.03}
RULES=${RULES:-}
AUTO_K=${AUTO_K:-32}
AUTO_D=${AUTO_D:-2}
AUTO_SETTLE_S=${AUTO_SETTLE_S:-4}
NET_RANKS=${NET_RANKS:-2}
NET_ARMS=${NET_ARMS:-sock sock4x1 sock8ch2x2 bpf}
NET_SIZES=${NET_SIZES:-8 1024 65536 1048576 4194304 16777216 67108864 268435456}
NET_COLLS=${NET_COLLS:-$COLLS}
NET_ROUNDS=${NET_ROUNDS:-$ROUNDS}
TIME_PER_SIZE=${TIME_PER_SIZE:-0.1}
MIN_ITERS=${MIN_ITERS:-3}
MAX_ITERS=${MAX_ITERS:-1000}
DEADLINE=${DEADLINE:-540}
JOB_TIMEOUT=${JOB_TIMEOUT:-300}
JOB_GUESS=${JOB_GUESS:-60}
NCCL_SUBSYS=${NCCL_SUBSYS:-INIT,NET,TUNING,GRAPH}
# Lists may be given with commas too.
for v in SIZES COLLS PHASES ARMS PROTOS CHANNELS SWEEP_SIZES SWEEP_COLLS NET_ARMS NET_SIZES NET_COLLS; do
  printf -v "$v" '%s' "$(echo "${!v}" | tr ',' ' ')"
done

# The counts the derived settings below are computed from (the rest is checked further down).
for n in "$RANKS" "$NET_RANKS"; do [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || die "RANKS/NET_RANKS: '$n' is not a rank count >= 2"; done
for v in AUTO_K AUTO_D; do [[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -ge 1 ] || die "$v: '${!v}' is not a count >= 1"; done

# GPUs: CUDA_VISIBLE_DEVICES's entries when set, else nvidia-smi's list.
if [ -z "${NGPUS:-}" ]; then
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    NGPUS=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
  else
    NGPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  fi
fi
[[ $NGPUS =~ ^[0-9]+$ ]] || die "NGPUS: '$NGPUS' is not a count"
G=$((NGPUS > 0 ? NGPUS : 1))
if [ "$NGPUS" -ge "$RANKS" ]; then
  MODE=nvlink NNODES=1 RPG=1
else
  MODE=plumbing NNODES=$RANKS RPG=$(((RANKS + G - 1) / G))
fi
NET_RPG=$(((NET_RANKS + G - 1) / G))
[ "$NGPUS" -ge "$NET_RANKS" ] && NET_RPG=1
# PAT: NCCL 2.28 enables it for all_gather/reduce_scatter only with one rank per node
# (ncclPatEnable: nNodes == nRanks), which here means the plumbing test.
ALGOS=${ALGOS:-Ring Tree$([ "$NNODES" = "$RANKS" ] && echo " PAT")}
AUTO_SETTLE=${AUTO_SETTLE:-$(((8 * (AUTO_D + 3) + 2 * AUTO_D + 1) * AUTO_K))}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr '[:upper:]' '[:lower:]' | sed 's/nvidia//g; s/[^a-z0-9]//g')
TAG=${gpu:-gpu}x$NGPUS
# shellcheck disable=SC2086 # flattens the list
phases_tag=$(echo $PHASES | tr ' ' '-')
NAME=${NAME:-nvlink-$TAG-$(date -u +%Y-%m-%d)$([ "$phases_tag" != sweep-compare-net ] && echo "-$phases_tag")}
[[ $NAME =~ ^[A-Za-z0-9._-]+$ ]] || die "NAME: '$NAME' (letters, digits, '.', '_', '-' only)"

has_phase() { [[ " $PHASES " == *" $1 "* ]]; }
has_arm() { [[ " $ARMS " == *" $1 "* ]]; }

# Collectives of COLLS (given as $2...) that NCCL 2.28 can run with algorithm $1 (tuning.cc:
# Tree only for all_reduce; PAT only for all_gather and reduce_scatter; Ring for all).
algo_colls() {
  local a=$1 c out=
  shift
  for c in "$@"; do
    case $a:$c in
      Ring:*) out="$out $c" ;;
      Tree:all_reduce) out="$out $c" ;;
      PAT:all_gather | PAT:reduce_scatter) out="$out $c" ;;
    esac
  done
  echo "${out# }"
}
rules_coll() { case $1 in all_reduce) echo allreduce ;; all_gather) echo allgather ;; reduce_scatter) echo reducescatter ;; esac; }
lc() { echo "$1" | tr '[:upper:]' '[:lower:]'; }

# Cleared for every rank, whatever the caller's environment holds; each arm sets its own.
CLEAN=(-u NCCL_NET_PLUGIN -u NCCL_TUNER_PLUGIN -u NCCL_PROFILER_PLUGIN -u NCCL_NET -u NCCL_BPF_POLICY
  -u NCCL_TUNER_CONFIG_FILE -u NCCL_ALGO -u NCCL_PROTO -u NCCL_MIN_NCHANNELS -u NCCL_MAX_NCHANNELS
  -u NCCL_P2P_DISABLE -u NCCL_SHM_DISABLE -u NCCL_HOSTID -u NCCL_SOCKET_NTHREADS -u NCCL_NSOCKS_PERTHREAD
  -u NCCL_BPF_AGREEMENT_EPOCH -u NCCL_BPF_AGREEMENT_DELAY -u SETTLE -u SETTLE_S -u NCCL_DEBUG_FILE)
LIB_ENV="NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_TUNER_PLUGIN=$LIB"
# compare_env ARM: the environment (VAR=VALUE words) of a compare (or sweep) arm; exit 1 if unknown.
compare_env() {
  case $1 in
    nolib) [ "$MODE" = plumbing ] && echo "NCCL_NET=Socket"; return 0 ;;
    lib | default) echo "$LIB_ENV" ;;
    rules) echo "$LIB_ENV NCCL_BPF_POLICY=$B/rules.o NCCL_TUNER_CONFIG_FILE=$W/rules/final.conf" ;;
    autotune)
      echo "$LIB_ENV NCCL_BPF_POLICY=$B/net_autotune.o NCCL_BPF_AGREEMENT_EPOCH=$AUTO_K" \
        "NCCL_BPF_AGREEMENT_DELAY=$AUTO_D NCCL_BPF_AGREEMENT_TIMEOUT=30 SETTLE=$AUTO_SETTLE SETTLE_S=$AUTO_SETTLE_S"
      ;;
    size_aware) echo "$LIB_ENV NCCL_BPF_POLICY=$B/size_aware.o" ;;
    *) return 1 ;;
  esac
}
# sweep_env LABEL: a forced sweep point, the rules policy reading rules/LABEL.conf.
sweep_env() { echo "$LIB_ENV NCCL_BPF_POLICY=$B/rules.o NCCL_TUNER_CONFIG_FILE=$W/rules/$1.conf"; }
# net_env ARM: a net-phase arm's environment; exit 1 if unknown.
net_env() {
  local a=$1
  if [[ $a =~ ^sock(([0-9]+)ch)?(([0-9]+)x([0-9]+))?$ ]]; then
    echo -n "NCCL_NET=Socket"
    [ -n "${BASH_REMATCH[2]}" ] && echo -n " NCCL_MIN_NCHANNELS=${BASH_REMATCH[2]}"
    [ -n "${BASH_REMATCH[4]}" ] && echo -n " NCCL_SOCKET_NTHREADS=${BASH_REMATCH[4]} NCCL_NSOCKS_PERTHREAD=${BASH_REMATCH[5]}"
    echo
    return 0
  fi
  if [[ $a =~ ^bpf(-s([0-9]+))?(-c([0-9]+))?(-g([0-9]+))?$ ]]; then
    echo -n "NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_TUNER_PLUGIN=none"
    [ -n "${BASH_REMATCH[2]}" ] && echo -n " NCCL_BPF_NSTREAMS=${BASH_REMATCH[2]}"
    [ -n "${BASH_REMATCH[4]}" ] && echo -n " NCCL_MIN_NCHANNELS=${BASH_REMATCH[4]}"
    [ -n "${BASH_REMATCH[6]}" ] && echo -n " NCCL_BPF_SPEED_MBPS=$((BASH_REMATCH[6] * 1000))"
    echo
    return 0
  fi
  return 1
}

# ---- everything checked before a GPU is touched
for p in $PHASES; do case $p in sweep | compare | net) ;; *) die "PHASES: unknown phase '$p' (sweep compare net)" ;; esac; done
for v in ROUNDS NET_ROUNDS MIN_ITERS MAX_ITERS DEADLINE JOB_TIMEOUT JOB_GUESS AUTO_K AUTO_D AUTO_SETTLE; do
  [[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -ge 1 ] || die "$v: '${!v}' is not a count >= 1"
done
[ "$AUTO_D" -ge 2 ] && [ "$AUTO_D" -le 16 ] || die "AUTO_D: $AUTO_D (NCCL_BPF_AGREEMENT_DELAY takes 2-16)"
for v in TIME_PER_SIZE AUTO_SETTLE_S RULE_MARGIN; do
  [[ ${!v} =~ ^[0-9]*\.?[0-9]+$ ]] || die "$v: '${!v}' is not a number"
done
for s in $SIZES $SWEEP_SIZES $NET_SIZES; do [[ $s =~ ^[0-9]+$ ]] && [ "$s" -ge 1 ] || die "size '$s' is not a byte count"; done
for c in $COLLS $SWEEP_COLLS $NET_COLLS; do
  case $c in all_reduce | all_gather | reduce_scatter) ;; *) die "unknown collective '$c' (all_reduce all_gather reduce_scatter)" ;; esac
done
for a in $ARMS; do compare_env "$a" >/dev/null || die "unknown arm '$a' (nolib lib rules autotune size_aware)"; done
for a in $NET_ARMS; do net_env "$a" >/dev/null || die "unknown net arm '$a' (sock[<C>ch][<T>x<S>], bpf[-s<N>][-c<N>][-g<G>])"; done
algos=
for a in $ALGOS; do
  case $(lc "$a") in
    ring) algos="$algos Ring" ;;
    tree) algos="$algos Tree" ;;
    pat) algos="$algos PAT" ;;
    nvls | nvlstree) die "ALGOS: $a needs NVLink multicast, which stays off (NCCL_NVLS_ENABLE=0)" ;;
    collnetdirect | collnetchain) die "ALGOS: $a needs a CollNet plugin; there is none here" ;;
    *) die "ALGOS: unknown algorithm '$a' (Ring Tree PAT)" ;;
  esac
done
ALGOS=${algos# }
protos=
for p in $PROTOS; do
  case $(lc "$p") in
    ll) protos="$protos LL" ;;
    ll128) protos="$protos LL128" ;;
    simple) protos="$protos Simple" ;;
    *) die "PROTOS: unknown protocol '$p' (LL LL128 Simple)" ;;
  esac
done
PROTOS=${protos# }
for c in $CHANNELS; do [[ $c =~ ^[0-9]+$ ]] && [ "$c" -ge 1 ] && [ "$c" -le 64 ] || die "CHANNELS: '$c' is not a channel count 1-64"; done
[ -z "$RULES" ] || [ -f "$RULES" ] || die "RULES: no file '$RULES'"
[ -z "$RULES" ] || RULES=$(cd "$(dirname "$RULES")" && pwd)/$(basename "$RULES")
need() { # need FILE WHY
  [ -e "$1" ] && return 0
  [ "$DRY" = 1 ] && { echo "note (DRY): missing $1 ($2)"; return 0; }
  die "missing $1 ($2): run scripts/stage.sh on a build machine"
}
need "$LIB" "the library"
if has_phase sweep || { has_phase compare && has_arm rules; }; then need "$B/rules.o" "the rules policy"; fi
if has_phase compare && has_arm autotune; then need "$B/net_autotune.o" "arm autotune"; fi
if has_phase compare && has_arm size_aware; then need "$B/size_aware.o" "arm size_aware"; fi
if has_phase compare && has_arm rules && ! has_phase sweep && [ -z "$RULES" ]; then
  die "arm rules without the sweep phase needs RULES=<a rules file>"
fi
MPS=0
if { [ "$MODE" = plumbing ] && { has_phase sweep || has_phase compare; }; } || { has_phase net && [ "$NET_RPG" -gt 1 ]; }; then MPS=1; fi
if [ "$DRY" != 1 ]; then
  command -v python3 >/dev/null || die "python3 not found"
  [ "$MPS" = 0 ] || command -v nvidia-cuda-mps-control >/dev/null ||
    die "nvidia-cuda-mps-control not found (MPS is needed for several ranks on one GPU: shared/docs/gpu-testbed.md)"
fi

# ---- the work folder, the end
. bench/gpu/lib.sh
finished=0
finish() {
  [ "$finished" = 1 ] && return
  finished=1
  [ "$MPS" = 1 ] && echo quit | nvidia-cuda-mps-control 2>/dev/null
  echo "total $(since) s" >>"$W/meta.txt"
  python3 bench/gpu/nvlink_report.py report "$W" --md "$W/$NAME.md" --png "$W/$NAME.png" 2>"$W/report.err" ||
    { echo; echo "report failed:"; cat "$W/report.err"; } >>"$W/$NAME.md"
  cp "$W/$NAME.md" "$OUT/$NAME.md"
  [ -f "$W/$NAME.png" ] && cp "$W/$NAME.png" "$OUT/$NAME.png"
  rm -f "$OUT/$NAME.tar.gz"
  tar -C "$W" -czf "$OUT/$NAME.tar.gz" . || echo "nvlink.sh: tar failed" >&2
  # The GPU runner returns files of up to 16 MiB: past 15, keep rank 0's logs only.
  if [ "$(stat -c %s "$OUT/$NAME.tar.gz" 2>/dev/null || echo 0)" -gt $((15 << 20)) ]; then
    echo "nvlink.sh: $NAME.tar.gz over 15 MiB: packed again with rank 0's logs only" | tee -a "$OUT/$NAME.md" >&2
    tar -C "$W" -czf "$OUT/$NAME.tar.gz" --exclude='logs/*-rank[1-9]*.log' . || echo "nvlink.sh: tar failed" >&2
  fi
  cat "$OUT/$NAME.md"
  echo "nvlink.sh: $OUT/$NAME.md, $OUT/$NAME.tar.gz$([ -f "$OUT/$NAME.png" ] && echo ", $OUT/$NAME.png"), $(since) s"
}
if [ "$DRY" != 1 ]; then
  rm -rf "$W"
  mkdir -p "$W/logs" "$W/tuning" "$W/rules" "$OUT" || die "cannot make $W or $OUT"
  : >"$W/results.txt"
  : >"$W/jobs.txt"
  if [ "$MPS" = 1 ]; then
    start_mps # bench/gpu/lib.sh; its EXIT trap is replaced by finish, which also stops MPS
  fi
  trap finish EXIT
  # Stopped from outside: the running job's ranks go too (their timeout(1) passes the signal on).
  trap 'echo "nvlink.sh: stopped by a signal at $(since) s" >>"$W/meta.txt"; kill -TERM "${CUR_PIDS[@]}" 2>/dev/null; exit 3' TERM INT
fi

meta() {
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  echo "host $(hostname) cpus $(nproc)"
  nvidia-smi -L 2>/dev/null | sed 's/^/nvidia-smi-L /'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  nvidia-smi topo -m 2>/dev/null | sed 's/^/topo /'
  python3 -c 'import torch, torch.cuda.nccl as n; v = n.version(); print("torch", torch.__version__, "nccl", ".".join(map(str, v)) if isinstance(v, tuple) else v)' 2>&1 | tail -1
  python3 -c 'import matplotlib; print("matplotlib", matplotlib.__version__)' 2>/dev/null || echo "matplotlib none"
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  [ -f "$LIB" ] && echo "lib $(sha256sum "$LIB" | cut -c1-16) $LIB"
  [ -x "$CLI" ] && echo "cli $("$CLI" --version 2>&1)"
  for a in $ARMS; do echo "arm $a $(compare_env "$a")"; done
  for a in $NET_ARMS; do echo "net_arm $a $(net_env "$a")"; done
  for v in NAME MODE NGPUS RANKS NNODES RPG NET_RANKS NET_RPG PHASES SIZES COLLS ROUNDS ALGOS PROTOS CHANNELS \
    SWEEP_SIZES SWEEP_COLLS RULE_MARGIN RULES AUTO_K AUTO_D AUTO_SETTLE AUTO_SETTLE_S NET_ARMS NET_SIZES \
    NET_COLLS NET_ROUNDS TIME_PER_SIZE MIN_ITERS MAX_ITERS DEADLINE JOB_TIMEOUT NCCL_SUBSYS MPS; do
    # shellcheck disable=SC2086,SC2116 # one line per knob
    echo "$v=$(echo ${!v})"
  done
}
if [ "$DRY" = 1 ]; then
  echo "DRY run: nothing is launched or written. Would write $OUT/$NAME.md, $NAME.png, $NAME.tar.gz"
  meta
  echo "cleared for every rank before its arm's variables: env ${CLEAN[*]}"
  [ "$MODE" = plumbing ] && echo "NOTE: $NGPUS GPU(s) for $RANKS ranks: PLUMBING TEST (MPS, each rank its own NCCL host, NET not NVLink)"
else
  meta | tee "$W/meta.txt"
fi

# ---- jobs
declare -A longest # job kind -> seconds of its longest job so far
CUR_PIDS=()        # the running job's rank processes
port=29950
commas() { # the words of its arguments, comma separated
  local w out=''
  # shellcheck disable=SC2048 # split on purpose
  for w in $*; do out="$out,$w"; done
  echo "${out#,}"
}
# place PHASE R: rank R's placement words: its GPU, and its own NCCL host where it must be one.
place() {
  if [ "$1" = net ]; then
    echo "LOCAL_RANK=$(($2 % G)) NCCL_HOSTID=host$2 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
  elif [ "$MODE" = nvlink ]; then
    echo "LOCAL_RANK=$2"
  else
    echo "LOCAL_RANK=$(($2 % G)) NCCL_HOSTID=host$2"
  fi
}

# job PHASE ARM ROUND LABEL NRANKS COLLS SIZES ENV: one job; its RESULT/SKIP lines into
# results.txt, a JOB (or SKIPPED) line into jobs.txt, rank 0's TUNING lines into tuning/LABEL.txt.
job() {
  local phase=$1 arm=$2 round=$3 label=$4 nr=$5 colls=$6 sizes=$7 envw=$8
  local kind=$phase rpg=$RPG guess left limit r common
  [ "$arm" = autotune ] && kind=$phase-autotune
  [ "$phase" = net ] && rpg=$NET_RPG
  common="PYTHONUNBUFFERED=1 MASTER_ADDR=127.0.0.1 WORLD_SIZE=$nr NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo
NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=$NCCL_SUBSYS
PHASE=$phase ARM=$arm ROUND=$round COLLS=$(commas "$colls") SIZES=$(commas "$sizes") TIME_PER_SIZE=$TIME_PER_SIZE
MIN_ITERS=$MIN_ITERS MAX_ITERS=$MAX_ITERS RANKS_PER_GPU=$rpg"
  port=$((port + 1))
  if [ "$DRY" = 1 ]; then
    echo "JOB phase=$phase arm=$arm round=$round label=$label ranks=$nr colls=$(commas "$colls") sizes=$(commas "$sizes")"
    echo "  env of every rank (after clearing the variables listed at the top):"
    echo "    $common MASTER_PORT=$port" | tr '\n' ' ' | sed 's/  */ /g'
    echo
    echo "    ${envw:-(no arm variables)}"
    for r in $(seq 0 $((nr - 1))); do echo "  rank $r: RANK=$r $(place "$phase" "$r") timeout -k 5 <limit> python3 bench/gpu/nvlink.py"; done
    return
  fi
  guess=${longest[$kind]:-$JOB_GUESS}
  left=$((DEADLINE - $(since)))
  if [ "$guess" -gt "$left" ]; then
    echo "SKIPPED phase=$phase arm=$arm round=$round label=$label reason=deadline left=${left}s expected=${guess}s" | tee -a "$W/jobs.txt"
    return
  fi
  limit=$((DEADLINE + 20 - $(since)))
  [ "$limit" -gt "$JOB_TIMEOUT" ] && limit=$JOB_TIMEOUT
  local t_job pids=() rc
  t_job=$(date +%s)
  echo "  $label ($phase, $nr ranks) at $(since) s"
  for r in $(seq 0 $((nr - 1))); do
    # shellcheck disable=SC2086,SC2046 # word lists of VAR=VALUE, none with spaces
    env "${CLEAN[@]}" $common MASTER_PORT=$port $envw RANK=$r $(place "$phase" "$r") \
      timeout -k 5 "$limit" python3 bench/gpu/nvlink.py >"$W/logs/$label-rank$r.log" 2>&1 &
    pids+=($!)
  done
  CUR_PIDS=("${pids[@]}")
  wait_ranks "$label" "${pids[@]}"
  rc=$?
  CUR_PIDS=()
  local secs=$(($(date +%s) - t_job))
  [ "$secs" -gt "${longest[$kind]:-0}" ] && longest[$kind]=$secs
  local logs=("$W/logs/$label"-rank*.log) r0=$W/logs/$label-rank0.log
  local net p2p shm network netp tuner nodes cch types rules_n notloaded version done_lines init
  net=$(cat "${logs[@]}" | grep -c 'via NET/')
  p2p=$(cat "${logs[@]}" | grep -c 'via P2P/')
  shm=$(cat "${logs[@]}" | grep -c 'via SHM/')
  network=$(grep -h -m1 -o 'Using network [^ ]*' "$r0" | sed 's/Using network //')
  netp=$(grep -h -m1 -o 'Initialized NET plugin [^ ]*' "$r0" | sed 's/.* //')
  tuner=$(grep -h -m1 -o 'TUNER/Plugin: Using [^ ]* ([^)]*)' "$r0" | sed 's/TUNER\/Plugin: Using //; s/ //g')
  nodes=$(grep -h -m1 -o 'nRanks [0-9]* nNodes [0-9]* localRanks [0-9]*' "$r0" | awk '{print $2 "r" $4 "n" $6 "l"}')
  cch=$(grep -h -m1 -o '[0-9]* coll channels' "$r0" | cut -d' ' -f1)
  types=$(grep -h -o 'type [A-Z]*/[A-Z]*' "$r0" | sed 's/type //' | sort -u | tr '\n' ',' | sed 's/,$//')
  rules_n=$(grep -h -m1 -o '[0-9]* tuner rules\? from' "$r0" | cut -d' ' -f1)
  notloaded=$(grep -h -c 'tuner policy not loaded' "$r0")
  version=$(grep -h -m1 -o 'NCCL version [^ ]*' "$r0" | sed 's/NCCL version //')
  done_lines=$(cat "${logs[@]}" | grep -c '^DONE ')
  init=$(grep -h -m1 -o 'seconds_init=[0-9.]*' "$r0" | sed 's/.*=//')
  echo "JOB phase=$phase arm=$arm round=$round label=$label ranks=$nr rc=$rc seconds=$secs via_net=$net via_p2p=$p2p" \
    "via_shm=$shm network=${network:-none} netplugin=${netp:-none} tuner=${tuner:-none} nodes=${nodes:-?} coll_channels=${cch:-?}" \
    "graph=${types:-?} rules=${rules_n:--} policy_not_loaded=$notloaded nccl=${version:-?} done=$done_lines/$nr" \
    "init=${init:-?} t_end=$(since)" | tee -a "$W/jobs.txt"
  grep -h -E '^(RESULT|SKIP) ' "$r0" >>"$W/results.txt"
  # NCCL's TUNING lines (one per collective on rank 0): run-length coded, then out of the log.
  if python3 bench/gpu/nvlink_report.py rle "$r0" >"$W/tuning/$label.txt" 2>>"$W/tuning/errors.txt"; then
    sed -i '/ Bytes -> Algo /d' "$r0"
  fi
}

# check_rules FILE: `ncclbpf rules check` where the CLI is there; 1 if it finds errors.
check_rules() {
  [ "$DRY" = 1 ] && return 0
  [ -x "$CLI" ] || { echo "(no $CLI: not checked)" >"$1.check"; return 0; }
  "$CLI" rules check "$1" >"$1.check" 2>&1
  local rc=$?
  echo "rules_check $(basename "$1") exit=$rc" >>"$W/meta.txt"
  [ "$rc" -ne 1 ]
}

# ---- phase 1: the sweep
if has_phase sweep; then
  echo "== sweep ($MODE, $RANKS ranks) at $(since) s"
  job sweep default 1 sw-default "$RANKS" "$SWEEP_COLLS" "$SWEEP_SIZES" "$(compare_env lib)"
  for algo in $ALGOS; do
    for proto in $PROTOS; do
      [ "$algo" = PAT ] && [ "$proto" != Simple ] && continue # NCCL has PAT/Simple only
      # shellcheck disable=SC2086
      colls=$(algo_colls "$algo" $SWEEP_COLLS)
      [ -n "$colls" ] || continue
      label=sw-$algo-$proto
      conf="# $label: force $algo/$proto with NCCL's channel count (bench/gpu/nvlink.sh sweep)"
      for c in $colls; do conf="$conf"$'\n'"$(rules_coll "$c"),0,-1,$(lc "$algo"),$(lc "$proto"),-1,-1,-1"; done
      if [ "$DRY" = 1 ]; then
        echo "(rules/$label.conf:"; echo "    ${conf//$'\n'/$'\n'    }"; echo ")"
      else
        echo "$conf" >"$W/rules/$label.conf"
      fi
      check_rules "$W/rules/$label.conf" || { echo "SKIPPED phase=sweep arm=$label round=1 label=$label reason=rules-check" | tee -a "$W/jobs.txt"; continue; }
      job sweep "$label" 1 "$label" "$RANKS" "$colls" "$SWEEP_SIZES" "$(sweep_env "$label")"
    done
  done
  for ch in $CHANNELS; do
    label=sw-c$ch
    if [ "$DRY" != 1 ]; then
      python3 bench/gpu/nvlink_report.py rules "$W" --channels "$ch" --out "$W/rules/$label.conf" >"$W/rules/$label.txt" 2>&1 ||
        { echo "SKIPPED phase=sweep arm=$label round=1 label=$label reason=no-stage1-best" | tee -a "$W/jobs.txt"; continue; }
      check_rules "$W/rules/$label.conf" || { echo "SKIPPED phase=sweep arm=$label round=1 label=$label reason=rules-check" | tee -a "$W/jobs.txt"; continue; }
    else
      echo "(rules/$label.conf: each size's best algorithm/protocol of the jobs above with $ch channels, derived at run time)"
    fi
    job sweep "$label" 1 "$label" "$RANKS" "$SWEEP_COLLS" "$SWEEP_SIZES" "$(sweep_env "$label")"
  done
fi
if has_phase compare && has_arm rules && [ "$DRY" != 1 ]; then
  if [ -n "$RULES" ]; then
    cp "$RULES" "$W/rules/final.conf"
    echo "rules_from $RULES" >>"$W/meta.txt"
  else
    python3 bench/gpu/nvlink_report.py rules "$W" --margin "$RULE_MARGIN" --nnodes "$NNODES" --nranks "$RANKS" \
      --out "$W/rules/final.conf" >"$W/rules/final.txt" 2>&1 || echo "rules derivation failed (rules/final.txt)" | tee -a "$W/meta.txt"
    echo "rules_from sweep" >>"$W/meta.txt"
  fi
  [ -f "$W/rules/final.conf" ] && { check_rules "$W/rules/final.conf" || echo "rules/final.conf: ncclbpf rules check found errors" | tee -a "$W/meta.txt"; }
  cat "$W/rules/final.conf" 2>/dev/null
fi

# ---- phase 2: the arms against the default
if has_phase compare; then
  echo "== compare ($MODE, $RANKS ranks) at $(since) s"
  for round in $(seq 1 "$ROUNDS"); do
    # shellcheck disable=SC2086
    for arm in $(round_order "$round" $ARMS); do
      if [ "$arm" = rules ] && [ "$DRY" != 1 ] && [ ! -f "$W/rules/final.conf" ]; then
        echo "SKIPPED phase=compare arm=rules round=$round label=rules-r$round reason=no-rules-file" | tee -a "$W/jobs.txt"
        continue
      fi
      job compare "$arm" "$round" "$arm-r$round" "$RANKS" "$COLLS" "$SIZES" "$(compare_env "$arm")"
    done
  done
fi

# ---- phase 3: the plugin's net path between real GPUs
if has_phase net; then
  echo "== net ($NET_RANKS ranks on $((NET_RANKS < G ? NET_RANKS : G)) GPU(s), P2P and SHM off) at $(since) s"
  for round in $(seq 1 "$NET_ROUNDS"); do
    # shellcheck disable=SC2086
    for arm in $(round_order "$round" $NET_ARMS); do
      job net "$arm" "$round" "net-$arm-r$round" "$NET_RANKS" "$NET_COLLS" "$NET_SIZES" "$(net_env "$arm")"
    done
  done
fi
[ "$DRY" = 1 ] && echo "DRY run done: nothing launched."
exit 0
