# Shared by bench/gpu/run.sh and bench/gpu/tuner.sh (sourced): MPS, and N ranks of
# allreduce.py as separate "hosts" on the one GPU (shared/docs/gpu-testbed.md).

# Starts MPS so the ranks' kernels run side by side; stops it when the script exits.
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d 2>/dev/null || true
  trap 'echo quit | nvidia-cuda-mps-control 2>/dev/null' EXIT
}

# run_ranks LABEL N [VAR=VALUE ...]: N ranks of allreduce.py with the given settings, each its
# own NCCL host, logs in $OUT/LABEL-nN-rR.log; waits for all; returns 1 if any failed. Uses a
# fresh MASTER_PORT each time ($port, which the caller initialises).
run_ranks() {
  local label=$1 n=$2; shift 2
  port=$((port + 1))
  local pids=() rc=0
  for r in $(seq 0 $((n - 1))); do
    env "$@" RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING \
      timeout 240 python3 bench/gpu/allreduce.py "$label" >"$OUT/$label-n$n-r$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || rc=1; done
  grep -h RESULT "$OUT/$label-n$n-r0.log" >>"$OUT/results.txt"
  return $rc
}

# Few files come back from the GPU machine: packs the per-rank logs into logs.tar.gz.
pack_logs() {
  tar -C "$OUT" -czf "$OUT/logs.tar.gz" $(cd "$OUT" && ls *-r*.log) && rm -f "$OUT"/*-r*.log
}

# wait_ranks LABEL PID...: waits for every rank process of one job. Once a rank exits non-zero,
# the others (stuck in a collective with it) get 5 s, then SIGTERM. Returns the first non-zero
# exit status (0 when every rank succeeded). Needs bash >= 5.1 (wait -n -p).
wait_ranks() {
  local label=$1
  shift
  local pids=("$@") live=("$@") rc first_rc=0 done_pid p stopper='' keep
  while [ "${#live[@]}" -gt 0 ]; do
    done_pid=
    wait -n -p done_pid "${live[@]}"
    rc=$?
    [ -z "$done_pid" ] && { echo "  $label: wait failed ($rc) with ranks ${live[*]} left" >&2; break; }
    keep=()
    for p in "${live[@]}"; do [ "$p" != "$done_pid" ] && keep+=("$p"); done
    live=("${keep[@]}")
    if [ "$rc" -ne 0 ] && [ "$first_rc" -eq 0 ]; then
      first_rc=$rc
      echo "  $label: a rank (pid $done_pid) exited $rc; stopping the others in 5 s" >&2
      (
        sleep 5
        for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
      ) &
      stopper=$!
    fi
  done
  [ -n "$stopper" ] && kill "$stopper" 2>/dev/null
  return "$first_rc"
}

# round_order ROUND WORD...: the words in order, reversed in even rounds (arms alternated, so
# that no arm always runs first or last in a round).
round_order() {
  local round=$1
  shift
  if [ $((round % 2)) -eq 0 ]; then printf '%s\n' "$@" | tac | tr '\n' ' '; else echo "$*"; fi
}
