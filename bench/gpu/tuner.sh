#!/usr/bin/env bash
# The tuner side on real NCCL (issue 8), on the GPU machine (shared/docs/gpu-testbed.md): every
# rank a separate "host" on one GPU, all traffic through our net plugin, NCCL_NET_PLUGIN and
# NCCL_TUNER_PLUGIN both set to the library, policies chosen with NCCL_BPF_POLICY.
#   1. sweep: all_reduce time for every algorithm x protocol NCCL can use here (NCCL_ALGO and
#      NCCL_PROTO forced, no tuner policy), the table size_aware's thresholds come from;
#   2. no policy vs size_aware vs bad_channels (results checked at every size; NCCL's TUNING
#      lines show what was applied);
#   3. conn_counter: its maps, read with `ncclbpf maps PID` from outside each rank, against the
#      bytes the all_reduces had to move (Ring/Simple forced so the count is exact).
# Expects build/ from scripts/stage.sh. Usage: bench/gpu/tuner.sh [outdir]
# Knobs: RANKS ("2 4"), SWEEP (1), SWEEP_RANKS ("2 4"), ONLY_SWEEP (0), POLICIES (1: the
# no policy / size_aware / bad_channels comparison; 0 skips it).
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-tuner}}
mkdir -p "$OUT"
B=$PWD/build
LIB=$B/libnccl-net-bpf.so
for f in "$LIB" "$B/size_aware.o" "$B/bad_channels.o" "$B/conn_counter.o" "$B/ncclbpf"; do
  [ -e "$f" ] || { echo "missing $f: run scripts/stage.sh on a build machine"; exit 1; }
done
. bench/gpu/lib.sh
start_mps

port=29700
run() { # label nranks extra-env...: the plugin as both net and tuner plugin
  local label=$1 n=$2 rc=0
  shift 2
  run_ranks "$label" "$n" NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_TUNER_PLUGIN=$LIB "$@" || rc=1
  echo "$label n=$n exit=$rc" | tee -a "$OUT/runs.txt"
  grep -h -E 'TUNER/BPF' "$OUT/$label-n$n-r0.log" | head -3 | sed 's/^/    /' | tee -a "$OUT/runs.txt"
}

: >"$OUT/results.txt"; : >"$OUT/runs.txt"; : >"$OUT/sweep.txt"
python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())' | tee "$OUT/versions.txt"
SWEEP_SIZES=8,1024,16384,65536,262144,1048576,4194304,16777216,67108864

if [ "${SWEEP:-1}" = 1 ]; then
  for n in ${SWEEP_RANKS:-2 4}; do
    for algo in Ring Tree; do
      for proto in LL LL128 Simple; do
        run "sweep_${algo}_${proto}" "$n" SIZES=$SWEEP_SIZES NCCL_ALGO=$algo NCCL_PROTO=$proto
        grep -h RESULT "$OUT/sweep_${algo}_${proto}-n$n-r0.log" >>"$OUT/sweep.txt"
      done
    done
  done
  python3 - "$OUT/sweep.txt" >"$OUT/sweep.md" <<'PY'
import collections, sys
t = collections.defaultdict(dict)
ok = collections.defaultdict(lambda: True)
for line in open(sys.argv[1]):
    p = line.split()
    f = dict(kv.split("=", 1) for kv in p[2:])
    key = (int(f["ranks"]), int(f["bytes"]))
    t[key][p[1].replace("sweep_", "")] = float(f["us"])
    ok[key] &= f["correct"] == "yes"
cols = ["Ring_LL", "Ring_LL128", "Ring_Simple", "Tree_LL", "Tree_LL128", "Tree_Simple"]
print("| ranks | bytes | " + " | ".join(c.replace("_", " ") + " (us)" for c in cols) + " | fastest | correct |")
print("|---:|---:|" + "---:|" * len(cols) + "---|---|")
for (n, b), r in sorted(t.items()):
    best = min(r, key=r.get)
    print(f"| {n} | {b} | " + " | ".join(f"{r[c]:.1f}" if c in r else "n/a" for c in cols) + f" | {best.replace('_', ' ')} | {'yes' if ok[(n, b)] else 'NO'} |")
PY
  cat "$OUT/sweep.md"
fi

if [ "${ONLY_SWEEP:-0}" = 1 ]; then
  pack_logs
  exit 0
fi
POLICIES=${POLICIES:-1}
for n in ${RANKS:-2 4}; do
  [ "$POLICIES" = 1 ] || break
  run "nopolicy" "$n"
  run "size_aware" "$n" NCCL_BPF_POLICY=$B/size_aware.o,$B/uniform_constants.o
  run "bad_channels" "$n" NCCL_BPF_POLICY=$B/bad_channels.o
done
# NCCL's own record of what was applied: its TUNING lines for size_aware, one per size.
for n in ${RANKS:-2 4}; do
  [ "$POLICIES" = 1 ] || break
  echo "## size_aware, $n ranks: NCCL's TUNING lines (first per size)" >>"$OUT/applied.md"
  grep -h -E 'AllReduce: [0-9]+ Bytes -> Algo' "$OUT/size_aware-n$n-r0.log" | sed 's/.*AllReduce: //' |
    awk '!seen[$1]++' >>"$OUT/applied.md"
  echo "## no policy, $n ranks" >>"$OUT/applied.md"
  grep -h -E 'AllReduce: [0-9]+ Bytes -> Algo' "$OUT/nopolicy-n$n-r0.log" | sed 's/.*AllReduce: //' |
    awk '!seen[$1]++' >>"$OUT/applied.md"
done
[ -f "$OUT/applied.md" ] && cat "$OUT/applied.md"

# conn_counter: 2 ranks, Ring/Simple so the expected byte count is exact. While the job runs,
# the same object is reloaded into both ranks (a live swap keeping its maps): the counts at the
# end must still equal the bytes moved.
(
  # Once the job is under way (rank 0 printed its first result), while it still runs.
  for _ in $(seq 1 900); do
    grep -q RESULT "$OUT/conn_counter-n2-r0.log" 2>/dev/null && break
    sleep 0.1
  done
  echo "## ncclbpf status --all (before)"; "$B/ncclbpf" status --all
  echo "## ncclbpf reload --all conn_counter.o"; "$B/ncclbpf" reload --all "$B/conn_counter.o"; echo "exit $?"
  echo "## ncclbpf status --all (after)"; "$B/ncclbpf" status --all
) >"$OUT/reload.txt" 2>&1 &
reloader=$!
run "conn_counter" 2 NCCL_BPF_POLICY=$B/conn_counter.o NCCL_ALGO=Ring NCCL_PROTO=Simple MAPS_CMD="$B/ncclbpf maps"
wait $reloader
cat "$OUT/reload.txt"
for r in 0 1; do
  grep -h -A40 -E '^(MOVED|MAPS) ' "$OUT/conn_counter-n2-r$r.log" | grep -v '^NCCL\|NCCL INFO' >>"$OUT/conn_counter.txt"
done
cat "$OUT/conn_counter.txt"

python3 - "$OUT/results.txt" >"$OUT/summary.md" <<'PY'
import collections, sys
rows = collections.defaultdict(dict)
ok = collections.defaultdict(lambda: True)
for line in open(sys.argv[1]):
    p = line.split()
    if p[1].startswith("sweep_") or p[1] == "conn_counter":
        continue
    f = dict(kv.split("=", 1) for kv in p[2:])
    key = (int(f["ranks"]), int(f["bytes"]))
    rows[key][p[1]] = (float(f["us"]), float(f["busbw"]))
    ok[key] &= f["correct"] == "yes"
print("| ranks | bytes | no policy (us) | size_aware (us) | bad_channels (us) | size_aware / none | bad_channels busbw / none | correct |")
print("|---:|---:|---:|---:|---:|---:|---:|---|")
for (n, b), r in sorted(rows.items()):
    none, sa, bc = r.get("nopolicy"), r.get("size_aware"), r.get("bad_channels")
    fmt = lambda v: f"{v[0]:.1f}" if v else ""
    ratio = f"{sa[0] / none[0]:.2f}" if sa and none else ""
    bw = f"{bc[1] / none[1]:.2f}" if bc and none and none[1] > 0 else ""
    print(f"| {n} | {b} | {fmt(none)} | {fmt(sa)} | {fmt(bc)} | {ratio} | {bw} | {'yes' if ok[(n, b)] else 'NO'} |")
PY
cat "$OUT/summary.md"
pack_logs
