export NCCLBPF_PLUGIN=/work/perf-run/libnccl-net-bpf.so NCCL_SOCKET_IFNAME=lo NCCL_BPF_NSTREAMS=4
unset NCCL_BPF_POLICY NCCL_BPF_NET_POLICY
B=/work/perf-run/ncclbpf-bench
# arm: off|tcp-poll|tcp-block ; io: auto|epoll|threads ; test; size; extra
arm() { local a=$1 io=$2 t=$3 s=$4; shift 4; NCCL_BPF_IO=$io $B arm --arm $a --test $t --size $s "$@" 2>/dev/null | awk '/@result value/{print $3}'; }
