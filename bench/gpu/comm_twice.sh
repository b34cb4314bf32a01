#!/usr/bin/env bash
# Two NCCL communicators one after the other in one process, through the plugin, on the GPU
# machine (2 ranks, each its own NCCL host on the one GPU, MPS): NCCL 2.28/2.29 unload an external
# net plugin with the last communicator and then cannot load it again (NVIDIA/nccl#1978). Arms:
#   plain     NCCL_NET_PLUGIN=lib NCCL_NET=BPF: the second communicator is expected to fail there
#   refcount  the same with NCCL_NET_PLUGIN_REF_COUNT=1 (the documented workaround)
#   envplugin NCCL_ENV_PLUGIN=lib only: the env plugin supplies NCCL_NET_PLUGIN and, on
#             2.28/2.29, NCCL_NET_PLUGIN_REF_COUNT=1 (NCCL_NET=BPF is set so a fallback shows)
# Prints a table (arm, communicator, ok) and writes $OUT/comm_twice.md and the logs' tarball.
# Expects build/ from scripts/stage.sh. Usage: bench/gpu/comm_twice.sh [outdir]
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT=${1:-${OUT:-/tmp/ncclbpf-comm-twice}}
W=$(mktemp -d)
mkdir -p "$OUT"
LIB=$PWD/build/libnccl-net-bpf.so
[ -f "$LIB" ] || { echo "missing $LIB: run scripts/stage.sh"; exit 2; }
. bench/gpu/lib.sh
start_mps
port=29600
printf '| arm | rank | communicator 1 | communicator 2 | exit |\n|---|---:|---|---|---:|\n' >"$OUT/comm_twice.md"
for arm in plain refcount envplugin; do
  case $arm in
    plain) env_words="NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF" ;;
    refcount) env_words="NCCL_NET_PLUGIN=$LIB NCCL_NET=BPF NCCL_NET_PLUGIN_REF_COUNT=1" ;;
    envplugin) env_words="NCCL_ENV_PLUGIN=$LIB NCCL_NET=BPF" ;;
  esac
  port=$((port + 1))
  pids=()
  for r in 0 1; do
    # shellcheck disable=SC2086
    env -u NCCL_NET_PLUGIN -u NCCL_NET_PLUGIN_REF_COUNT -u NCCL_ENV_PLUGIN $env_words \
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      NCCL_HOSTID=host$r NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
      NVSHMEM_DISABLE_NVLS=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV \
      timeout 120 python3 bench/gpu/comm_twice.py >"$W/$arm-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}"
    rc=$?
    c1=$(grep -m1 '^COMM n=1' "$W/$arm-rank$r.log" || echo "COMM n=1 (no line)")
    c2=$(grep -m1 '^COMM n=2' "$W/$arm-rank$r.log" || echo "COMM n=2 (no line)")
    echo "| $arm | $r | ${c1#COMM n=1 } | ${c2#COMM n=2 } | $rc |" >>"$OUT/comm_twice.md"
  done
  grep -h -E 'ENV/BPF|Unloading plugin|Failed to initialize any NET|NET/Plugin: Loaded|NET_PLUGIN_REF_COUNT' "$W/$arm-rank0.log" |
    sed "s/^/$arm: /" >>"$W/lines.txt"
done
{ echo; echo '```'; cat "$W/lines.txt"; echo '```'; } >>"$OUT/comm_twice.md"
tar -C "$W" -czf "$OUT/comm_twice-logs.tar.gz" .
cat "$OUT/comm_twice.md"
