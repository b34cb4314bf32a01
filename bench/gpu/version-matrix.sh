#!/usr/bin/env bash
# The NCCL version matrix (issue 35): the same checked PyTorch job under several NCCL releases,
# each built on the GPU machine for sm_90 only, with NCCL's log showing which ABI version of
# each plugin type (net, tuner, profiler, env) it loaded from our one library.
#
# Method (shared/docs/gpu-testbed.md): the GPU machine reaches no registry and has no NCCL source,
# so a source copy travels with the repository's ignored build/ folder:
#   1. on a CPU machine with NVIDIA/nccl's git mirror: `bench/gpu/version-matrix.sh pack`
#      writes build/nccl-src/<tag>.tar.gz for every tag in TAGS (`git archive` of src/,
#      makefiles/ and Makefile: about 1.1 MB each). build/ is ignored: NCCL's code is never
#      committed, and it is carried to the GPU machine with the plugin (scripts/stage.sh);
#   2. on the GPU machine: `bench/gpu/version-matrix.sh build <tag>` unpacks one release under
#      $WORK (default /tmp/nccl-matrix, outside the repository) and builds libnccl.so.2 there with
#      `make -j src.build NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90"`; one release per
#      device call (the 10-minute limit), while the machine stays warm (builds stay in $WORK);
#   3. `bench/gpu/version-matrix.sh run [outdir]`: for every built release, 2 ranks of
#      bench/gpu/matrix_job.py (each its own NCCL host on the one GPU, MPS, all traffic through
#      the plugin) with LD_PRELOAD=<that libnccl.so.2> (the job checks torch.cuda.nccl.version()),
#      NCCL_NET_PLUGIN, NCCL_TUNER_PLUGIN, NCCL_PROFILER_PLUGIN and NCCL_ENV_PLUGIN all the
#      library, NCCL_NET=BPF, NCCL_BPF_POLICY=net_autotune.o, a metrics endpoint per rank, and
#      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET,TUNING; then greps each rank-0 log.
#   `bench/gpu/version-matrix.sh` alone builds what is missing, then runs (where time allows).
#
# The job (matrix_job.py): two communicators alive at once (the default group and a second
# group of every rank); on each, at odd element counts (1, 7, 1023, 65537, 1048573), all_reduce,
# broadcast, reduce, all_gather, reduce_scatter, all_to_all and a send/recv ring, every result
# checked on the device; then each rank scrapes its own endpoint and needs timed collectives
# (nccl_collective_duration_seconds_count > 0, i.e. our profiler ran).
#
# Which ABI version was loaded, from NCCL's INFO lines:
#   net       "NET/Plugin: Loaded net plugin BPF (vN)"                 (every release)
#   tuner     "TUNER/Plugin: Using BPF (vN)"                           (2.28+)
#             2.27 prints "Using tuner plugin BPF" without a version: vN is 4 minus the
#             "Failed to find ncclTunerPlugin_vK symbol" lines before it
#   profiler  "PROFILER/Plugin: Loaded BPF (vN)"                       (2.28+)
#             2.27: "PROFILER/Plugin: loaded BPF", vN is 4 minus the "failed to find
#             ncclProfiler_vK" lines
#   env       "ENV/Plugin: Using BPF (vN)"                             (2.28+; 2.27 has none)
# Expected (the newest each release looks up that the library exports; see
# ncclnet-headers/tests/releases.rs):
#   2.27.7 net v10 tuner v4 profiler v4 env -    2.28.9 net v11 tuner v5 profiler v5 env v1
#   2.29.7 net v11 tuner v5 profiler v6 env v1   2.30.7 net v12 tuner v6 profiler v6 env v2
#   2.31+  net v12 tuner v6 profiler v7 env v2   (2.32.6+ also look up tuner v7, which the
#   library does not export: v6 stays right)
#
# Output: $OUT/matrix.md (release, version NCCL reported, the four ABI versions against the
# expected, checks, bad results, timed collectives, exit codes, verdict), $OUT/matrix.tsv, and
# $OUT/matrix-logs.tar.gz (every rank's log and each build's tail).
#
# Build time per release, estimated (not measured; nothing here has run yet): NCCL compiles its
# device kernels once per (collective, operation, type, algorithm, protocol) and nvcc dominates;
# with one gencode on 16 cores about 4-6 minutes for 2.27/2.28, 5-8 minutes for 2.29-2.31 (more
# kernels: symmetric memory, copy-engine collectives, GIN), so one release per device call, and
# the whole matrix about 30 minutes of builds plus about 1 minute per release to run. Risk: nvcc
# 13.0 against an older release's code (2.27.7's makefiles already select CUDA 13 gencodes, and
# NVCC_GENCODE overrides them); a failed build's tail is printed and kept in the logs.
#
# TAGS: the releases, newest last; NEWEST (optional): one more git ref packed as "newest" (a 2.32
# tag once a mirror has one; the mirror this was written against ends at v2.30.7-1). Knobs:
# MIRROR (/work/.mirror/NVIDIA+nccl/repo), WORK (/tmp/nccl-matrix), BUILD (build), RANKS (2),
# JOBS (nproc), MPORT (29900), JOB_TIMEOUT (240).
# Usage: bench/gpu/version-matrix.sh [pack | build <tag> | run [outdir]]
set -u
cd "$(dirname "$0")/../.." || exit 2
TAGS=${TAGS:-v2.27.7-1 v2.28.9-1 v2.29.7-1 v2.30.7-1}
NEWEST=${NEWEST:-}
MIRROR=${MIRROR:-/work/.mirror/NVIDIA+nccl/repo}
WORK=${WORK:-/tmp/nccl-matrix}
BUILD=${BUILD:-build}
RANKS=${RANKS:-2}
JOBS=${JOBS:-$(nproc)}
MPORT=${MPORT:-29900}
JOB_TIMEOUT=${JOB_TIMEOUT:-240}
GENCODE="-gencode=arch=compute_90,code=sm_90"
SRC=$BUILD/nccl-src
die() { echo "version-matrix.sh: $*" >&2; exit 2; }

all_tags() { echo $TAGS ${NEWEST:+newest}; }

pack() {
  [ -d "$MIRROR" ] || die "no NCCL mirror at $MIRROR (MIRROR=...)"
  mkdir -p "$SRC"
  for t in $TAGS; do
    git -C "$MIRROR" archive --format=tar.gz -o "$PWD/$SRC/$t.tar.gz" "$t" -- src makefiles Makefile ||
      die "git archive $t failed"
  done
  if [ -n "$NEWEST" ]; then
    git -C "$MIRROR" archive --format=tar.gz -o "$PWD/$SRC/newest.tar.gz" "$NEWEST" -- src makefiles Makefile ||
      die "git archive $NEWEST failed"
  fi
  ls -l "$SRC"
}

lib_of() { echo "$WORK/$1/build/lib/libnccl.so.2"; }

build_one() {
  local t=$1 tar="$SRC/$1.tar.gz" d="$WORK/$1" t0
  [ -f "$tar" ] || die "no $tar: run 'bench/gpu/version-matrix.sh pack' where the mirror is, and carry build/"
  command -v nvcc >/dev/null || die "no nvcc"
  if [ -f "$(lib_of "$t")" ]; then echo "$t: built already ($(lib_of "$t"))"; return 0; fi
  rm -rf "$d" && mkdir -p "$d" && tar -xzf "$tar" -C "$d" || die "unpacking $tar failed"
  t0=$(date +%s)
  # BUILDDIR stays under $WORK: nothing of NCCL's is written into the repository.
  if make -C "$d" -j"$JOBS" src.build NVCC_GENCODE="$GENCODE" BUILDDIR="$d/build" >"$d/make.log" 2>&1; then
    echo "$t: built in $(($(date +%s) - t0)) s: $(lib_of "$t")"
    echo "$t $(($(date +%s) - t0))" >>"$WORK/build-times.txt"
  else
    echo "$t: build failed after $(($(date +%s) - t0)) s; tail of $d/make.log:" >&2
    tail -20 "$d/make.log" >&2
    return 1
  fi
}

# loaded KIND LOG: the ABI version of one plugin type in one rank-0 log, "-" if none.
loaded() {
  local kind=$1 log=$2 v
  case $kind in
    net) v=$(grep -oE 'NET/Plugin: Loaded net plugin BPF \(v[0-9]+\)' "$log" | grep -oE '[0-9]+\)$' | tr -d ')' | head -1) ;;
    tuner)
      v=$(grep -oE 'TUNER/Plugin: Using BPF \(v[0-9]+\)' "$log" | grep -oE '[0-9]+\)$' | tr -d ')' | head -1)
      if [ -z "$v" ] && grep -q 'TUNER/Plugin: Using tuner plugin BPF' "$log"; then
        v=$((4 - $(grep -oE 'Failed to find ncclTunerPlugin_v[0-9]+ symbol' "$log" | sort -u | wc -l)))
      fi ;;
    profiler)
      v=$(grep -oE 'PROFILER/Plugin: Loaded BPF \(v[0-9]+\)' "$log" | grep -oE '[0-9]+\)$' | tr -d ')' | head -1)
      if [ -z "$v" ] && grep -q 'PROFILER/Plugin: loaded BPF' "$log"; then
        v=$((4 - $(grep -oE 'failed to find ncclProfiler_v[0-9]+' "$log" | sort -u | wc -l)))
      fi ;;
    env) v=$(grep -oE 'ENV/Plugin: Using BPF \(v[0-9]+\)' "$log" | grep -oE '[0-9]+\)$' | tr -d ')' | head -1) ;;
  esac
  if [ -n "$v" ]; then echo "v$v"; else echo -; fi
}

# expected MAJOR.MINOR: "net tuner profiler env" the release should load from the library.
expected() {
  case $1 in
    2.27) echo "v10 v4 v4 -" ;;
    2.28) echo "v11 v5 v5 v1" ;;
    2.29) echo "v11 v5 v6 v1" ;;
    2.30) echo "v12 v6 v6 v2" ;;
    *) echo "v12 v6 v7 v2" ;;
  esac
}

run_all() {
  local OUT=${1:-${OUT:-/tmp/ncclbpf-matrix}} B LIB POL t n r pids rc port=29700 log ver want got row
  mkdir -p "$OUT"
  B=$(cd "$BUILD" 2>/dev/null && pwd) || die "no $BUILD: run scripts/stage.sh on a build machine and carry build/"
  LIB=$B/libnccl-net-bpf.so POL=$B/net_autotune.o
  for f in "$LIB" "$POL"; do [ -f "$f" ] || die "missing $f (scripts/stage.sh)"; done
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d 2>/dev/null || true
  trap 'echo quit | nvidia-cuda-mps-control 2>/dev/null' EXIT
  printf 'release\tnccl\tnet\ttuner\tprofiler\tenv\texpected\tchecks\tbad\ttimed\texits\tverdict\n' >"$OUT/matrix.tsv"
  for t in $(all_tags); do
    [ -f "$(lib_of "$t")" ] || { printf '%s\tnot built\t-\t-\t-\t-\t-\t-\t-\t-\t-\tNOT RUN\n' "$t" >>"$OUT/matrix.tsv"; continue; }
    n=$RANKS port=$((port + 1)) pids=()
    for r in $(seq 0 $((n - 1))); do
      env LD_PRELOAD="$(lib_of "$t")" RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
        NCCL_NET_PLUGIN="$LIB" NCCL_NET=BPF NCCL_TUNER_PLUGIN="$LIB" NCCL_PROFILER_PLUGIN="$LIB" \
        NCCL_ENV_PLUGIN="$LIB" NCCL_BPF_POLICY="$POL" NCCL_BPF_METRICS_ADDR=127.0.0.1:$((MPORT + r)) \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET,TUNING \
        timeout "$JOB_TIMEOUT" python3 bench/gpu/matrix_job.py >"$OUT/$t-r$r.log" 2>&1 &
      pids+=($!)
    done
    rc=""
    for p in "${pids[@]}"; do wait "$p"; rc="$rc$?,"; done
    log=$OUT/$t-r0.log
    ver=$(grep -oE 'NCCL_VERSION rank=0 version=[0-9.]+' "$log" | sed 's/.*=//')
    want=$(expected "$(echo "$ver" | cut -d. -f1,2)")
    got="$(loaded net "$log") $(loaded tuner "$log") $(loaded profiler "$log") $(loaded env "$log")"
    local checks=0 bad=0 timed=0 x
    for r in $(seq 0 $((n - 1))); do
      x=$(grep -oE 'DONE rank=[0-9]+ checks=[0-9]+ bad=[0-9]+' "$OUT/$t-r$r.log")
      checks=$((checks + $(echo "${x:-checks=0}" | grep -oE 'checks=[0-9]+' | cut -d= -f2)))
      bad=$((bad + $(echo "${x:-bad=1}" | grep -oE 'bad=[0-9]+' | cut -d= -f2)))
      x=$(grep -oE 'METRICS rank=[0-9]+ timed=[0-9]+' "$OUT/$t-r$r.log" | grep -oE '[0-9]+$')
      timed=$((timed + ${x:-0}))
    done
    local verdict=OK
    [ -n "$ver" ] || verdict="FAIL (no NCCL version)"
    [ "$got" = "$want" ] || verdict="FAIL (loaded $got, expected $want)"
    [ "$bad" -eq 0 ] && [ "$checks" -gt 0 ] || verdict="FAIL ($bad bad of $checks)"
    [ "$timed" -gt 0 ] || verdict="FAIL (no timed collectives)"
    [ "${rc//0,/}" = "" ] || verdict="FAIL (exit codes ${rc%,})"
    row=$(echo "$got" | tr ' ' '\t')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${ver:--}" "$row" "$want" "$checks" "$bad" "$timed" "${rc%,}" "$verdict" >>"$OUT/matrix.tsv"
    echo "$t: NCCL ${ver:-?}: $got (expected $want), $checks checks, $bad bad, $timed timed: $verdict"
  done
  {
    echo "# NCCL version matrix ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
    echo
    echo "| release | NCCL | net | tuner | profiler | env | expected | checks | bad | timed | exits | verdict |"
    echo "|---|---|---|---|---|---|---|---|---:|---:|---|---|"
    tail -n +2 "$OUT/matrix.tsv" | sed 's/\t/ | /g; s/^/| /; s/$/ |/'
    [ -f "$WORK/build-times.txt" ] && { echo; echo "Build seconds per release: $(tr '\n' ';' <"$WORK/build-times.txt")"; }
  } >"$OUT/matrix.md"
  for t in $(all_tags); do [ -f "$WORK/$t/make.log" ] && tail -40 "$WORK/$t/make.log" >"$OUT/$t-make-tail.log"; done
  (cd "$OUT" && tar -czf matrix-logs.tar.gz ./*.log && rm -f ./*.log)
  cat "$OUT/matrix.md"
  ! grep -q FAIL "$OUT/matrix.tsv"
}

case ${1:-all} in
  pack) pack ;;
  build) [ -n "${2:-}" ] || die "build <tag>"; build_one "$2" ;;
  run) run_all "${2:-}" ;;
  all)
    for t in $(all_tags); do build_one "$t" || true; done
    run_all "${2:-}" ;;
  *) die "usage: $0 [pack | build <tag> | run [outdir]]" ;;
esac
