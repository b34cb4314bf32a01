#!/usr/bin/env bash
# Staged tuner swaps and the decision comparison on real NCCL, on the GPU machine
# (shared/docs/gpu-testbed.md): every rank a separate "host" on one GPU, all traffic through our
# net plugin, NCCL_NET_PLUGIN and NCCL_TUNER_PLUGIN both the library (as bench/gpu/tuner.sh).
# For 2 ranks, then 4: the job starts with NCCL_BPF_POLICY=size_aware.o and runs the all_reduce
# size sweep REPEAT times (every result checked). While it runs, from outside:
#   1. once rank 0 printed a first RESULT: `ncclbpf status --all`;
#   2. `ncclbpf reload --at-seq +300 --all bad_channels.o` (Ring/LL/1 channel from that
#      decision on, in every process), then `ncclbpf status --all` (the pending switch);
#   3. once every rank logged its switch line: `ncclbpf status --all` again;
#   4. once every rank finished the sweep and waits on HOLD_FILE: `ncclbpf status --all` and
#      `ncclbpf decisions --compare PID...` on the rank pids, then HOLD_FILE is touched.
# Afterwards, from each rank's log: the seq its switch line names, NCCL's TUNING lines before and
# after it (how many show Ring/LL on one channel), its checks and exit code.
# Expects build/ from scripts/stage.sh. Usage: bench/gpu/stage.sh [outdir]
# Knobs: RANKS ("2 4"), REPEAT (6), AT (+300), SIZES (8 B .. 16 MiB).
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-stage}}
mkdir -p "$OUT"
B=$PWD/build
LIB=$B/libnccl-net-bpf.so
CLI=$B/ncclbpf
for f in "$LIB" "$B/size_aware.o" "$B/bad_channels.o" "$CLI"; do
  [ -e "$f" ] || { echo "missing $f: run scripts/stage.sh on a build machine"; exit 1; }
done
. bench/gpu/lib.sh
start_mps

RANKS=${RANKS:-2 4}
REPEAT=${REPEAT:-6}
AT=${AT:-+300}
SIZES=${SIZES:-8,1024,16384,65536,262144,1048576,4194304,16777216}
t_start=$(date +%s.%N)
since() { awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

{
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  "$CLI" --version
  echo "registry ${NCCL_BPF_SHM_DIR:-/dev/shm/ncclbpf-$(id -u)}"
  echo "REPEAT=$REPEAT AT=$AT SIZES=$SIZES"
} | tee "$OUT/versions.txt"

# until SECONDS DESCRIPTION COMMAND...: polls COMMAND every 50 ms; 1 if it never held.
until_true() {
  local limit=$1 what=$2; shift 2
  local end=$(($(date +%s) + limit))
  while ! "$@" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$end" ]; then
      echo "## TIMEOUT after ${limit} s waiting for: $what (t=$(since) s)"
      return 1
    fi
    sleep 0.05
  done
  echo "## $what (t=$(since) s)"
}
all_logs_have() { # n pattern: every rank's log has a line matching it
  local n=$1 pat=$2 r
  for r in $(seq 0 $((n - 1))); do grep -q -E "$pat" "$OUT/stage-n$n-r$r.log" || return 1; done
}

# cli NAME ARGS...: one ncclbpf command, its output and exit status (also to stage-nN-rc.txt).
cli() {
  local name=$1 rc; shift
  echo "## \$ ncclbpf $* (t=$(since) s)"
  "$CLI" "$@"
  rc=$?
  echo "## exit $rc"
  echo "$name $rc" >>"$OUT/stage-n$n-cli-rc.txt"
}

# The outside driver for one job of n ranks: runs while the ranks run.
drive() {
  local n=$1 hold=$2
  until_true 180 "rank 0 printed a first RESULT" grep -q '^RESULT' "$OUT/stage-n$n-r0.log" || { touch "$hold"; return; }
  cli status_first status --all
  cli reload reload --at-seq "$AT" --all "$B/bad_channels.o"
  cli status_staged status --all
  until_true 120 "every rank logged its switch line" all_logs_have "$n" 'makes decisions from seq' &&
    cli status_switched status --all
  if until_true 200 "every rank finished the sweep and holds" all_logs_have "$n" '^HOLDING '; then
    cli status_holding status --all
    local pids
    pids=$(grep -h '^HOLDING ' "$OUT"/stage-n$n-r*.log | sed 's/.* pid=\([0-9]*\).*/\1/' | tr '\n' ' ')
    echo "## rank pids (from HOLDING lines): $pids"
    # shellcheck disable=SC2086
    cli compare decisions --compare $pids
    # shellcheck disable=SC2086
    "$CLI" decisions --compare $pids --json >"$OUT/stage-n$n-compare.json" 2>&1
  fi
  touch "$hold"
  echo "## released $hold (t=$(since) s)"
}

port=29800
for n in $RANKS; do
  port=$((port + 1))
  hold=$OUT/hold-n$n
  rm -f "$hold" "$OUT/stage-n$n-cli-rc.txt" "$OUT"/stage-n$n-r*.rc
  echo "# $n ranks (t=$(since) s)"
  drive "$n" "$hold" >"$OUT/stage-n$n-cli.txt" 2>&1 &
  driver=$!
  for r in $(seq 0 $((n - 1))); do
    (
      env NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_TUNER_PLUGIN=$LIB NCCL_BPF_POLICY=$B/size_aware.o \
        SIZES=$SIZES REPEAT=$REPEAT HOLD_FILE=$hold HOLD_TIMEOUT=150 \
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING \
        timeout 240 python3 bench/gpu/allreduce.py stage >"$OUT/stage-n$n-r$r.log" 2>&1
      echo $? >"$OUT/stage-n$n-r$r.rc"
    ) &
  done
  wait $driver
  wait # the ranks exit once released (or time out after 240 s)
  echo "  ranks exited: $(for r in $(seq 0 $((n - 1))); do printf 'r%s=%s ' $r "$(cat "$OUT/stage-n$n-r$r.rc")"; done)(t=$(since) s)"
  cat "$OUT/stage-n$n-cli.txt"
  grep -h '^RESULT' "$OUT/stage-n$n-r0.log" >>"$OUT/results.txt"
done

python3 - "$OUT" $RANKS >"$OUT/summary.md" <<'PY'
import os, re, sys
out, ranks = sys.argv[1], [int(v) for v in sys.argv[2:]]
sw = re.compile(r"TUNER/BPF comm (0x[0-9a-f]+): tuner program '([^']+)' makes decisions from seq (\d+) on")
tun = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\S+) proto (\S+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
ok_all = True
for n in ranks:
    print(f"## {n} ranks\n")
    cli = open(f"{out}/stage-n{n}-cli.txt").read()
    m = re.search(r"tuner switch at seq (\d+)", cli)
    staged = int(m.group(1)) if m else None
    rcs = dict(l.split() for l in open(f"{out}/stage-n{n}-cli-rc.txt")) if os.path.exists(f"{out}/stage-n{n}-cli-rc.txt") else {}
    print(f"staged switch (reload output): seq {staged}; ncclbpf exit statuses: " + ", ".join(f"{k} {v}" for k, v in rcs.items()) + "\n")
    print("| rank | switch line: comm, program, seq | TUNING lines before it | of them Ring/LL {0..0} | after it | of them Ring/LL {0..0} | checks (bad) | exit |")
    print("|---:|---|---:|---:|---:|---:|---|---:|")
    seqs = set()
    for r in range(n):
        lines = open(f"{out}/stage-n{n}-r{r}.log", errors="replace").read().splitlines()
        swi = [(i, sw.search(l)) for i, l in enumerate(lines) if sw.search(l)]
        cut = swi[0][0] if swi else len(lines)
        cnt = {"b": 0, "bll": 0, "a": 0, "all": 0}
        for i, l in enumerate(lines):
            t = tun.search(l)
            if not t:
                continue
            bad = t.group(2) == "RING" and t.group(3) == "LL" and t.group(4) == t.group(5) == "0"
            k = "b" if i < cut else "a"
            cnt[k] += 1
            cnt[k + "ll"] += bad
        hold = [l for l in lines if l.startswith("HOLDING ")]
        h = dict(kv.split("=") for kv in hold[0].split()[1:]) if hold else {}
        rc = open(f"{out}/stage-n{n}-r{r}.rc").read().strip() if os.path.exists(f"{out}/stage-n{n}-r{r}.rc") else "?"
        desc = "; ".join(f"{m.group(1)} '{m.group(2)}' seq {m.group(3)}" for _, m in swi) or "NONE"
        seqs |= {int(m.group(3)) for _, m in swi}
        ok_all &= rc == "0" and h.get("bad") == "0" and len(swi) == 1
        print(f"| {r} | {desc} | {cnt['b']} | {cnt['bll']} | {cnt['a']} | {cnt['all']} | {h.get('checks', '?')} ({h.get('bad', '?')}) | {rc} |")
    res = [l for l in open(f"{out}/stage-n{n}-r0.log", errors="replace") if l.startswith("RESULT")]
    good = sum("correct=yes" in l for l in res)
    same = len(seqs) == 1 and staged in seqs
    ok_all &= same and good == len(res) and rcs.get("compare") == "0"
    print(f"\nswitch seqs named by the ranks: {sorted(seqs)} ({'all equal to the staged seq' if same else 'NOT all equal to the staged seq'}); "
          f"rank 0 RESULT lines: {len(res)}, correct: {good}; decisions --compare exit {rcs.get('compare', '?')}\n")
    print("TUNER/BPF lines (rank 0):\n\n```")
    for l in open(f"{out}/stage-n{n}-r0.log", errors="replace"):
        if "TUNER/BPF" in l:
            print(l.rstrip()[l.find("TUNER/BPF"):])
    print("```\n")
print(f"overall: {'PASS' if ok_all else 'FAIL'}")
PY
cat "$OUT/summary.md"
echo "total $(since) s"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" $(cd "$OUT" && ls stage-n*-r*.log) && rm -f "$OUT"/stage-n*-r*.log
