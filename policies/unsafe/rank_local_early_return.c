// expect: rank_local
// Returning early on a rank-local condition: the decision after it is made on some ranks only.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } net_errors SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *e = bpf_map_lookup_elem(&net_errors, &k);
  if (e && *e > 0) return 0;
  ctx->algo = NCCL_ALGO_TREE; /* REJECT */
  return 0;
}
