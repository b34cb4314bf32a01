// expect: rank_local
// A tuner deciding from what the profiler measured on this rank: every rank's GPU times differ.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } last_coll_ns SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *ns = bpf_map_lookup_elem(&last_coll_ns, &k);
  if (!ns) return 0;
  if (*ns > 100000) ctx->algo = NCCL_ALGO_TREE; /* REJECT */
  return 0;
}
SEC("profiler/coll") int measure(struct ncclbpf_profiler_ctx *ctx) {
  __u32 k = 0;
  __u64 d = ctx->duration_ns;
  bpf_map_update_elem(&last_coll_ns, &k, &d, BPF_ANY);
  return 0;
}
