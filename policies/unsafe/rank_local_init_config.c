// expect: rank_local
// tuner/init runs once per communicator at init, without the communicator's view of its config
// maps: a constant taken from one may be another communicator's value.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); NCCLBPF_CONFIG; } net_latency_us SEC(".maps");
SEC("tuner/init") int prog(struct ncclbpf_tuner_init_ctx *ctx) {
  __u32 k = 0;
  __u64 *lat = bpf_map_lookup_elem(&net_latency_us, &k);
  if (!lat) return 0;
  ctx->hw_latencies[NCCL_HW_NET][NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = *lat; /* REJECT */
  return 0;
}
