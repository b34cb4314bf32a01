#!/usr/bin/env bash
# How many collective channels NCCL opens with our net plugin, and what lets a tuner pick more
# (issue 9 item 4), on the GPU machine (shared/docs/gpu-testbed.md): 2 ranks (RANKS), each its
# own "host" on the one GPU (MPS), all traffic through our net plugin, NCCL_NET_PLUGIN and
# NCCL_TUNER_PLUGIN both the library.
# NCCL clamps a tuner's channel count to the communicator's (docs/reference/nccl-collective-facts.md
# §2.4), so a tuner can only use as many channels as NCCL opened. For each setting (SETTINGS):
#   default                      nothing set
#   speed100g / speed400g        NCCL_BPF_SPEED_MBPS=100000 / 400000 (the port speed our plugin
#                                reports; default: sysfs, else 10000 — lo has none)
#   minnch8                      NCCL_MIN_NCHANNELS=8
#   minctas8                     NCCL_MIN_CTAS=8
#   maxnch16                     NCCL_MAX_NCHANNELS=16
# two jobs (arms), alternated:
#   nccl     no tuner policy: NCCL's own choice;
#   rules8   NCCL_BPF_POLICY=rules.o with NCCL_TUNER_CONFIG_FILE asking for Ring/Simple on 8
#            channels for every all_reduce (`allreduce,0,-1,ring,simple,8,-1,-1`).
# Each job runs bench/gpu/allreduce.py on SIZES (16 MiB, 64 MiB) REPEAT times (10 timed
# all_reduces per size and round, the first of each checked against the exact sum).
# Read from rank 0's NCCL_DEBUG=INFO log: the "N coll channels" line, the ring graph search
# ("Pattern 4 ... nChannels N, bw X/Y"), NCCL's model bandwidth for Ring/Simple all_reduce, and the
# per-collective TUNING lines (algo, proto, channel{Lo..Hi}) at each size; the busbw of
# allreduce.py (2 (n-1)/n · bytes / time). Writes $OUT/channels.md (the table) and
# $OUT/logs.tar.gz after every job, so a run stopped at its limit still returns what it did.
# Jobs that would end past DEADLINE seconds (default 120) are skipped.
# Expects BUILD (default build/) from scripts/stage.sh with rules.o.
# Usage: bench/gpu/channels.sh [outdir]
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-channels}}
mkdir -p "$OUT"
W=${WORK:-/tmp/ncclbpf-channels-work}
rm -rf "$W"
mkdir -p "$W"
B=$(cd "${BUILD:-build}" 2>/dev/null && pwd)
LIB=$B/libnccl-net-bpf.so
RULES=$B/rules.o
for f in "$LIB" "$RULES"; do
  [ -e "$f" ] || { echo "missing $f: run scripts/stage.sh on a build machine"; exit 1; }
done
RANKS=${RANKS:-2}
SIZES=${SIZES:-16777216,67108864}
REPEAT=${REPEAT:-3}
DEADLINE=${DEADLINE:-120}
EST=${EST:-9}
ARMS=${ARMS:-nccl rules8}
SETTINGS=${SETTINGS:-default minnch8 speed400g speed100g minctas8 maxnch16}
t_start=$(date +%s)
since() { echo $(($(date +%s) - t_start)); }

setting_env() {
  case $1 in
    default) ;;
    speed100g) echo NCCL_BPF_SPEED_MBPS=100000 ;;
    speed400g) echo NCCL_BPF_SPEED_MBPS=400000 ;;
    minnch8) echo NCCL_MIN_NCHANNELS=8 ;;
    minctas8) echo NCCL_MIN_CTAS=8 ;;
    maxnch16) echo NCCL_MAX_NCHANNELS=16 ;;
    *=*) echo "${1//,/ }" ;; # VAR=VALUE[,VAR=VALUE...] given directly
  esac
}
CONF=$W/ring8.conf
printf '# bench/gpu/channels.sh: Ring/Simple on 8 channels for every all_reduce\nallreduce,0,-1,ring,simple,8,-1,-1\n' >"$CONF"
arm_env() {
  case $1 in
    nccl) ;;
    rules8) echo NCCL_BPF_POLICY="$RULES" NCCL_TUNER_CONFIG_FILE="$CONF" ;;
  esac
}

. bench/gpu/lib.sh
start_mps

{
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  nproc | sed 's/^/cpus /'
  echo "RANKS=$RANKS SIZES=$SIZES REPEAT=$REPEAT SETTINGS=$SETTINGS ARMS=$ARMS DEADLINE=$DEADLINE"
  echo "LIB $(sha256sum "$LIB" | cut -c1-16) RULES $(sha256sum "$RULES" | cut -c1-16)"
  echo "rules file: $(grep -v '^#' "$CONF")"
} | tee "$W/meta.txt"

report() {
  python3 - "$W" >"$OUT/channels.md.tmp" 2>"$W/report.err" <<'PY' && mv -f "$OUT/channels.md.tmp" "$OUT/channels.md"
import collections, glob, os, re, statistics, sys
w = sys.argv[1]
COLL = re.compile(r"NCCL INFO (\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels, (\d+) p2p channels, (\d+) p2p channels per peer")
PAT = re.compile(r"Pattern (\d+), crossNic \d+, nChannels (\d+), bw ([\d.]+)/([\d.]+)")
TUN = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\S+) proto (\S+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
MODEL = re.compile(r"NCCL INFO\s+AllReduce \|(.*)")
RES = re.compile(r"^RESULT \S+ ranks=(\d+) bytes=(\d+) us=([\d.]+) busbw=([\d.]+) correct=(\S+)")
RULE = re.compile(r"(\d+) tuner rules? from ")
meta = open(f"{w}/meta.txt").read().strip() if os.path.exists(f"{w}/meta.txt") else ""
jobs = []
for line in open(f"{w}/jobs.txt") if os.path.exists(f"{w}/jobs.txt") else []:
    f = line.split("\t")
    jobs.append((f[0], f[1], f[2], int(f[3]), f[4].strip()))
print("# NCCL's channel count with the ncclbpf net plugin, and what a tuner then runs\n")
print("Made by `bench/gpu/channels.sh`. Per setting, two jobs: `nccl` (no tuner policy) and `rules8` (rules.o, a rules file "
      "asking for Ring/Simple on 8 channels for every all_reduce). 'coll channels': NCCL's INIT line (rank 0); 'ring graph': NCCL's "
      "ring search (Pattern 4: nChannels, bw intra/inter GB/s) before channels are duplicated; 'model Ring/Simple': NCCL's "
      "AllReduce bandwidth (GB/s) for Ring/Simple in its tuning table; per size: the choice NCCL ran (TUNING lines of rank 0, the most "
      "common, with how many of the lines it is) and the bus bandwidth in GB/s, median of the rounds (each round after it).\n")
print("```\n" + meta + "\n```\n")
rows = []
all_sizes = []
for label, setting, arm, n, env in jobs:
    lp = f"{w}/{label}-n{n}-r0.log"
    lines = open(lp, errors="replace").read().splitlines() if os.path.exists(lp) else []
    coll = next((m.groups() for m in map(COLL.search, lines) if m), None)
    pats = [m.groups() for m in map(PAT.search, lines) if m]
    ring = next((p for p in pats if p[0] == "4"), None)
    model = next((m.group(1) for m in map(MODEL.search, lines) if m), None)
    ring_simple = None
    if model:
        cells = [c.strip() for c in model.split("|")]
        # Tree LL, LL128, Simple, Ring LL, LL128, Simple, ...: "latency/ bandwidth"
        if len(cells) >= 6 and "/" in cells[5]:
            ring_simple = cells[5].split("/")[1].strip()
    tun = collections.defaultdict(collections.Counter)
    for m in map(TUN.search, lines):
        if m:
            tun[int(m.group(1))][f"{m.group(2)}/{m.group(3)} ch {m.group(4)}..{m.group(5)}"] += 1
    res = collections.defaultdict(list)
    ok = True
    for l in lines:
        m = RES.search(l)
        if m:
            res[int(m.group(2))].append(float(m.group(4)))
            ok &= m.group(5) == "yes"
            if int(m.group(2)) not in all_sizes:
                all_sizes.append(int(m.group(2)))
    rules = next((m.group(1) for m in map(RULE.search, lines) if m), None)
    rcs = []
    for r in range(n):
        rp = f"{w}/{label}-n{n}-r{r}.rc"
        rcs.append(open(rp).read().strip() if os.path.exists(rp) else "?")
    rows.append((setting, arm, env, n, coll, ring, ring_simple, tun, res, ok and bool(res), rules, rcs))
def fb(b):
    return f"{b >> 20} MiB" if b % (1 << 20) == 0 else f"{b} B"
hdr = "| setting | env | arm | ranks | coll channels (p2p) | ring graph: nChannels, bw | model Ring/Simple GB/s | " + \
      " | ".join(f"{fb(b)}: NCCL ran | {fb(b)}: busbw GB/s" for b in all_sizes) + " | all right | exit |"
print(hdr)
print("|---|---|---|---:|---:|---|---:|" + "---|---:|" * len(all_sizes) + "---|---|")
for setting, arm, env, n, coll, ring, rs, tun, res, ok, rules, rcs in rows:
    cells = []
    for b in all_sizes:
        c = tun.get(b)
        if c:
            top, k = c.most_common(1)[0]
            tot = sum(c.values())
            cells.append(f"{top} ({k}/{tot})" if k == tot else f"{top} ({k}/{tot}; also {', '.join(x for x in c if x != top)})")
        else:
            cells.append("?")
        v = res.get(b, [])
        cells.append(f"{statistics.median(v):.2f} ({' / '.join(f'{x:.2f}' for x in v)})" if v else "n/a")
    armtxt = arm + (f" ({rules} rule)" if arm == "rules8" and rules else (" (NO rules loaded)" if arm == "rules8" else ""))
    print(f"| {setting} | {env or '–'} | {armtxt} | {n} | {coll[0] + ' (' + coll[3] + ')' if coll else '?'} | "
          f"{(ring[1] + ', ' + ring[2] + '/' + ring[3]) if ring else '?'} | {rs or '?'} | " + " | ".join(cells) +
          f" | {'yes' if ok else 'NO'} | {' '.join(rcs)} |")
if os.path.exists(f"{w}/runs.txt"):
    print("\n```\n" + open(f"{w}/runs.txt").read().strip() + "\n```")
PY
  tar -C "$W" -czf "$OUT/logs.tar.gz.tmp" . 2>/dev/null && mv -f "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

port=30500
: >"$W/jobs.txt"
: >"$W/runs.txt"
for n in $RANKS; do
  for s in $SETTINGS; do
    for a in $ARMS; do
      label=${s//[^A-Za-z0-9]/_}-$a
      if [ $(($(since) + EST + 2 * n)) -gt "$DEADLINE" ]; then
        echo "SKIP $label n=$n (t=$(since) s, deadline $DEADLINE s)" | tee -a "$W/runs.txt"
        continue
      fi
      port=$((port + 1))
      t0=$(date +%s)
      senv=$(setting_env "$s")
      printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$s" "$a" "$n" "$senv" >>"$W/jobs.txt"
      for r in $(seq 0 $((n - 1))); do
        (
          # shellcheck disable=SC2046
          env $senv $(arm_env "$a") SIZES="$SIZES" REPEAT="$REPEAT" \
            RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
            NVSHMEM_DISABLE_NVLS=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING,GRAPH,ENV PYTHONUNBUFFERED=1 \
            NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_TUNER_PLUGIN=$LIB \
            timeout -k 5 45 python3 bench/gpu/allreduce.py "$label" >"$W/$label-n$n-r$r.log" 2>&1
          echo $? >"$W/$label-n$n-r$r.rc"
        ) &
      done
      wait
      rcs=""
      for r in $(seq 0 $((n - 1))); do rcs="$rcs r$r=$(cat "$W/$label-n$n-r$r.rc" 2>/dev/null || echo '?')"; done
      echo "RUN $label n=$n$rcs wall=$(($(date +%s) - t0)) t=$(since) $(grep -h -o '[0-9]* coll channels' "$W/$label-n$n-r0.log" | head -1)" | tee -a "$W/runs.txt"
      grep -h '^RESULT' "$W/$label-n$n-r0.log" | sed 's/^/    /'
      report
    done
  done
done
echo "total $(since) s" | tee -a "$W/runs.txt"
report
cat "$W/report.err" 2>/dev/null
cat "$OUT/channels.md"
