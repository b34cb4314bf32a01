// expect: rank_local
// tuner/init's constants feed NCCL's cost model on every rank: they must be the same.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } net_lat SEC(".maps");
SEC("tuner/init") int prog(struct ncclbpf_tuner_init_ctx *ctx) {
  __u32 k = 0;
  __u64 *lat = bpf_map_lookup_elem(&net_lat, &k);
  if (!lat) return 0;
  ctx->hw_latencies[NCCL_HW_NET][1][2] = *lat; /* REJECT */
  return 0;
}
