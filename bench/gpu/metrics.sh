#!/usr/bin/env bash
# Issue 10 on the GPU machine (shared/docs/gpu-testbed.md): the node exporter and the in-process
# endpoints serving a running 4-rank PyTorch job, checked against what NCCL moved, and a rank
# frozen mid-transfer named by `ncclbpf status` while the exporter keeps answering.
#
#   1. `ncclbpf exporter --listen 127.0.0.1:$PORT` starts; N ranks of metrics_job.py (each its
#      own NCCL host, all traffic through the plugin, NCCL_ALGO=Ring NCCL_PROTO=Simple so that the
#      bytes are known: N1 x 2 (N - 1) x BYTES summed over the ranks) with
#      NCCL_BPF_METRICS_ADDR=127.0.0.1:0 (each rank's endpoint; address in the registry);
#   2. the exporter is scraped every SCRAPE_EVERY seconds for the whole job (scrapes/*.prom, with
#      the time of each, for the dashboard render); once every rank ended phase 1, the exporter
#      and every rank's endpoint are scraped (phase1-*.prom) and `ncclbpf status --all` saved;
#   3. phase 2: the ranks all_reduce without end; after 3 s rank FREEZE is SIGSTOPped for
#      FROZEN seconds: the exporter is timed while it is stopped, and `ncclbpf status --all
#      --stall-after 2 [--json]` names the stalled connections; then SIGCONT, STOP, and the ranks
#      end (every result checked);
#   4. bench/gpu/metrics_report.py writes summary.md (totals against the expected bytes, per
#      rank endpoint against the exporter, the frozen rank's stalled connections, the answer
#      times) beside the scrapes and logs.
# Expects BUILD (default build/) from scripts/stage.sh. Usage: bench/gpu/metrics.sh [outdir]
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-/tmp/ncclbpf-metrics}}
mkdir -p "$OUT/scrapes"
B=$(cd "${BUILD:-build}" 2>/dev/null && pwd)
LIB=$B/libnccl-net-bpf.so
CLI=$B/ncclbpf
for f in "$LIB" "$CLI"; do
  [ -e "$f" ] || { echo "missing $f: run scripts/stage.sh on a build machine"; exit 1; }
done
N=${N:-4}
BYTES=${BYTES:-4194304}
N1=${N1:-400}
PORT=${PORT:-19464}
SCRAPE_EVERY=${SCRAPE_EVERY:-0.5}
FREEZE=${FREEZE:-1}
FROZEN=${FROZEN:-6}
W=$OUT/work
mkdir -p "$W"
rm -f "$W"/go "$W"/stop

. bench/gpu/lib.sh
start_mps
{
  date -u +'date %Y-%m-%dT%H:%M:%SZ'
  python3 -c 'import torch, torch.cuda.nccl as n; print("torch", torch.__version__, "nccl", n.version())'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'
  "$CLI" --version
  echo "N=$N BYTES=$BYTES N1=$N1 PORT=$PORT FREEZE=$FREEZE FROZEN=$FROZEN"
} | tee "$OUT/meta.txt"

"$CLI" exporter --listen "127.0.0.1:$PORT" >"$W/exporter.log" 2>&1 &
EXP=$!
scrape() { # URL FILE: one GET, the seconds it took into FILE.time
  python3 - "$1" "$2" <<'EOF'
import sys, time, urllib.request
t0 = time.time()
try:
    body = urllib.request.urlopen(sys.argv[1], timeout=10).read()
    ok = "200"
except Exception as e:
    body, ok = str(e).encode(), "error"
t1 = time.time()
open(sys.argv[2], "wb").write(body)
open(sys.argv[2] + ".time", "w").write(f"{t0:.3f} {t1 - t0:.4f} {ok}\n")
EOF
}
sleep 0.5

pids=()
for r in $(seq 0 $((N - 1))); do
  env RANK=$r WORLD_SIZE=$N LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 \
    NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_BPF_METRICS_ADDR=127.0.0.1:0 \
    BYTES=$BYTES N1=$N1 GO_FILE=$W/go STOP_FILE=$W/stop PYTHONUNBUFFERED=1 \
    timeout -k 5 200 python3 bench/gpu/metrics_job.py >"$W/rank$r.log" 2>&1 &
  pids+=($!)
done

# Scrapes for the whole job, in the background.
(
  i=0
  while kill -0 "${pids[0]}" 2>/dev/null; do
    scrape "http://127.0.0.1:$PORT/metrics" "$OUT/scrapes/$(printf %05d $i).prom"
    i=$((i + 1))
    sleep "$SCRAPE_EVERY"
  done
) &
SCR=$!

end=$(($(date +%s) + 150))
phase1_done() {
  local r
  for r in $(seq 0 $((N - 1))); do grep -q '^PHASE1 ' "$W/rank$r.log" 2>/dev/null || return 1; done
}
while ! phase1_done && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
sleep 1 # the last completions reach the tables
scrape "http://127.0.0.1:$PORT/metrics" "$OUT/phase1-exporter.prom"
reg=${NCCL_BPF_SHM_DIR:-/dev/shm/ncclbpf-$(id -u)}
for r in $(seq 0 $((N - 1))); do
  pid=$(sed -n 's/^PHASE1 rank=[0-9]* pid=\([0-9]*\).*/\1/p' "$W/rank$r.log")
  echo "$pid" >"$W/rank$r.pid"
  addr=$(cat "$reg/$pid.metrics" 2>/dev/null | head -1)
  echo "rank $r pid $pid endpoint ${addr:-none}" | tee -a "$OUT/endpoints.txt"
  case $addr in
    http*) scrape "$addr" "$OUT/phase1-rank$r.prom" ;;
    ?*) scrape "http://$addr/metrics" "$OUT/phase1-rank$r.prom" ;;
  esac
done
timeout 20 "$CLI" status --all >"$OUT/status-phase1.txt" 2>&1
echo "exit $?" >>"$OUT/status-phase1.txt"
touch "$W/go"

sleep 3
fpid=$(cat "$W/rank$FREEZE.pid")
kill -STOP "$fpid"
echo "SIGSTOP rank $FREEZE pid $fpid at $(date +%s.%N)" | tee -a "$OUT/freeze.txt"
sleep "$FROZEN"
scrape "http://127.0.0.1:$PORT/metrics" "$OUT/frozen-exporter.prom"
timeout 20 "$CLI" status --all --stall-after 2 >"$OUT/status-frozen.txt" 2>&1
echo "exit $?" >>"$OUT/status-frozen.txt"
timeout 20 "$CLI" status --all --stall-after 2 --json >"$OUT/status-frozen.json" 2>/dev/null
kill -CONT "$fpid"
echo "SIGCONT rank $FREEZE pid $fpid at $(date +%s.%N)" | tee -a "$OUT/freeze.txt"
sleep 2
timeout 20 "$CLI" status --all --stall-after 2 >"$OUT/status-resumed.txt" 2>&1
echo "exit $?" >>"$OUT/status-resumed.txt"
touch "$W/stop"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
kill "$SCR" 2>/dev/null
wait "$SCR" 2>/dev/null
kill "$EXP" 2>/dev/null
wait "$EXP" 2>/dev/null
echo "ranks rc=$rc" | tee -a "$OUT/meta.txt"
cp "$W"/rank*.log "$W/exporter.log" "$OUT/" 2>/dev/null
python3 bench/gpu/metrics_report.py "$OUT" >"$OUT/report.txt" 2>&1 || echo "report failed (report.txt)"
tar -C "$OUT" -czf "$OUT/scrapes.tar.gz" scrapes && rm -rf "$OUT/scrapes" "$W"
cat "$OUT/summary.md" 2>/dev/null
