// Pointer equality: v2 == v1 where v1 is known non-NULL makes v2 non-NULL on that branch.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k0 = 0, k1 = ctx->coll_type & 3;
  __u64 *v1 = bpf_map_lookup_elem(&arr, &k0);
  if (!v1) return 0;
  __u64 *v2 = bpf_map_lookup_elem(&arr, &k1);
  if (v2 == v1) return *v2 & 1;
  return 0;
}
