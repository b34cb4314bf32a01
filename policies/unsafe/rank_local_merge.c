// expect: rank_local
// Both arms assign a constant and the paths meet again before the decision: the value written
// after the meeting point still depends on the branch.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } net_lat SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  volatile __s32 choice = NCCL_PROTO_SIMPLE;
  __u64 *lat = bpf_map_lookup_elem(&net_lat, &k);
  if (lat && *lat > 1000) choice = NCCL_PROTO_LL;
  __s32 c = choice;
  ctx->proto = c; /* REJECT */
  return 0;
}
