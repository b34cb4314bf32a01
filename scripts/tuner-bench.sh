#!/usr/bin/env bash
# getCollInfo cost as NCCL pays it: bench/c/tuner_bench.c, a C caller, dlopens the plugin library,
# takes ncclTunerPlugin_v5, inits one context (8 ranks, 2 nodes) and times getCollInfo over a mix
# of collectives and sizes (8 B ... 1 GiB) on a freshly filled float[7][3] cost table: per-call
# P50 and P99 over batches of 64 calls. Configurations:
#   no policy                 NCCL_BPF_TUNER_POLICY unset
#   size_aware, JIT           NCCL_BPF_TUNER_POLICY=target/policies/src/size_aware.o
#   size_aware, interpreter   the same with NCCL_BPF_JIT=0
#   bench_trivial, JIT        policies/safe/bench_trivial.c (one comparison, one store): what
#                             running any policy costs the plugin, besides the policy itself
# and, for this tree's library only (ALL=0 leaves them out), every other shipped tuner policy,
# JIT and interpreted: noop, bad_channels, rules (NCCL_TUNER_CONFIG_FILE: a 6-line file in NCCL's
# example format), and net_autotune and slo_enforcer on a 1-rank communicator (they run the
# agreement, which a single process can only hold with itself: every 64th call ends an epoch,
# posts, combines and runs the epoch program)
# for this tree's library and for the library of another commit (default e4d9be4, before the
# lock-free getCollInfo; "none" skips it), built in a temporary worktree; and, in the benchmark
# itself, size_aware's native twin (its logic in C, through a function pointer) and an empty
# function (the harness's own cost per call).
#
# The plugin reads its policy from the environment once, so each configuration gets its own copy
# of the library; all of them are loaded into one process and timed interleaved (the machines
# are shared and noisy: that way a busy moment slows every configuration alike). SEPARATE=1 runs
# each configuration in a process of its own instead. The whole run repeats RUNS times (default
# 3); the table shows the median over runs of each figure. PERIOD=N repeats the first N of the
# 4096 random inputs (e.g. 64: the same 64 collectives every batch, like a training step).
#   scripts/tuner-bench.sh [commit|none]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-e4d9be4}
runs=${RUNS:-3}
period=${PERIOD:-0}
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$PWD/$target ;; esac
tmp=$(mktemp -d)
wt=
cleanup() {
  if [ -n "$wt" ]; then git worktree remove --force "$wt"; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

policies/build.sh >/dev/null
scripts/build.sh >/dev/null
cp "$target/release/libnccl-net-bpf.so" "$tmp/now.so"
libs=(now)
if [ "$base" != none ]; then
  wt=$tmp/base
  git worktree add -q --detach "$wt" "$base"
  # Its own target directory, kept, so later runs rebuild only what changed.
  (cd "$wt" && CARGO_TARGET_DIR="$target/tuner-bench-base" scripts/build.sh) >"$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log" >&2; exit 1; }
  cp "$target/tuner-bench-base/release/libnccl-net-bpf.so" "$tmp/base.so"
  libs=(base now)
fi
gcc -O2 -Wall -Wextra -o "$tmp/tuner_bench" bench/c/tuner_bench.c -ldl

size_aware=$PWD/target/policies/src/size_aware.o
trivial=$PWD/target/policies/safe/bench_trivial.o
configs=(empty=empty native=native)
shipped=()
if [ "${ALL:-1}" = 1 ]; then
  # NCCL's example tuner format: collective,min,max,algorithm,protocol,channels,nNodes,nRanks
  cat >"$tmp/nccl_tuner.conf" <<'CONF'
# what a user might keep: small all-reduces on Tree, large ones on Ring
allreduce,0,65536,tree,simple,-1,-1,-1
allreduce,65537,-1,ring,simple,-1,-1,-1
allgather,0,1048576,ring,ll,-1,-1,-1
allgather,1048577,-1,ring,simple,-1,-1,-1
reducescatter,0,-1,ring,simple,-1,2,8
broadcast,0,-1,ring,simple,4,-1,-1
CONF
  export NCCL_TUNER_CONFIG_FILE=$tmp/nccl_tuner.conf
  for pol in noop:8 bad_channels:8 rules:8 net_autotune:1 slo_enforcer:1; do
    name=${pol%%:*} ranks=${pol##*:}
    for tier in 1 0; do
      cp "$tmp/now.so" "$tmp/now-$name-$tier.so"
      configs+=("now:$name-$tier=plugin:$tmp/now-$name-$tier.so:$PWD/target/policies/src/$name.o:$tier:$ranks")
    done
    shipped+=("$name:$ranks")
  done
fi
for lib in "${libs[@]}"; do
  for cfg in none jit interp trivial; do cp "$tmp/$lib.so" "$tmp/$lib-$cfg.so"; done
  configs+=("$lib:none=plugin:$tmp/$lib-none.so"
    "$lib:jit=plugin:$tmp/$lib-jit.so:$size_aware:1"
    "$lib:interp=plugin:$tmp/$lib-interp.so:$size_aware:0"
    "$lib:trivial=plugin:$tmp/$lib-trivial.so:$trivial:1")
done
export NCCL_BPF_SHM_DIR=$tmp/shm
unset NCCL_DEBUG NCCL_BPF_TUNER_POLICY NCCL_BPF_TUNER_PROGRAM NCCL_BPF_JIT
for ((r = 1; r <= runs; r++)); do
  if [ "${SEPARATE:-0}" = 1 ]; then
    for c in "${configs[@]}"; do "$tmp/tuner_bench" --period "$period" "$c"; done
  else
    "$tmp/tuner_bench" --period "$period" "${configs[@]}"
  fi
done >"$tmp/results"

now_name="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo +changes)"
python3 - "$tmp/results" "$base" "$now_name" "$runs" "${SEPARATE:-0}" "$period" "${shipped[@]}" <<'PY'
import os, statistics, sys
path, base, now, runs, separate, period, *shipped = sys.argv[1:]
runs_of = {}
for line in open(path):
    _, label, *kv = line.split()
    d = dict(x.split("=") for x in kv)
    runs_of.setdefault(label, []).append((float(d["p50"]), float(d["p99"])))
med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v))
       for k, v in runs_of.items()}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
            if l.startswith("model name")), "?")
how = "each in its own process" if separate == "1" else "all in one process, interleaved"
mix = (f"the same {period} inputs over and over" if period != "0"
       else "4096 random inputs")
print(f"getCollInfo through ncclTunerPlugin_v5 from C, {mix}; configurations {how}; "
      f"{os.cpu_count()} CPUs ({cpu}), load average {os.getloadavg()[0]:.2f}; "
      f"median of {runs} runs, each 20,000 batches of 64 calls per configuration\n")
print("| library | configuration | P50 ns | P99 ns | P50 overhead | P99 overhead |")
print("|---|---|---:|---:|---:|---:|")
names = {"none": "no policy", "jit": "size_aware, JIT", "interp": "size_aware, interpreter",
         "trivial": "bench_trivial, JIT"}
for lib, title in (("base", base), ("now", now)):
    if f"{lib}:none" not in med:
        continue
    z50, z99 = med[f"{lib}:none"]
    for cfg in ("none", "jit", "interp", "trivial"):
        p50, p99 = med[f"{lib}:{cfg}"]
        over = ("", "") if cfg == "none" else (f"+{p50 - z50:.1f}", f"+{p99 - z99:.1f}")
        print(f"| {title} | {names[cfg]} | {p50:.1f} | {p99:.1f} | {over[0]} | {over[1]} |")
    if lib == "now":
        for pol in shipped:
            name, ranks = pol.split(":")
            where = "" if ranks == "8" else f" ({ranks} rank, agreeing with itself)"
            for tier, tname in (("1", "JIT"), ("0", "interpreter")):
                p50, p99 = med[f"now:{name}-{tier}"]
                print(f"| {title} | {name}, {tname}{where} | {p50:.1f} | {p99:.1f} "
                      f"| +{p50 - z50:.1f} | +{p99 - z99:.1f} |")
e50, e99 = med["empty"]
n50, n99 = med["native"]
print(f"| (C, in the benchmark) | size_aware's native twin, through a function pointer "
      f"| {n50:.1f} | {n99:.1f} | +{n50 - e50:.1f} | +{n99 - e99:.1f} |")
print(f"| (C, in the benchmark) | empty function, through the same pointer "
      f"| {e50:.1f} | {e99:.1f} | | |")
print("\nOverhead: over the same library's no-policy call; for the native twin, over the empty "
      "function.")
PY
