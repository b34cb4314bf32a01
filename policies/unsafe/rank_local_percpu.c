// expect: rank_local
// A per-CPU map is rank-local by nature.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } pc SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&pc, &k);
  if (!v) return 0;
  ctx->algo = *v & 1; /* REJECT */
  return 0;
}
