// expect: rank_local
// A constant written under a branch on a rank-local value: the decision still depends on it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } net_lat SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *lat = bpf_map_lookup_elem(&net_lat, &k);
  if (!lat) return 0;
  if (*lat > 1000) ctx->algo = NCCL_ALGO_RING; /* REJECT */
  return 0;
}
