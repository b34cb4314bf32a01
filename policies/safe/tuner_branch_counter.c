// A tuner that bumps a second rank-local counter only when the first is high (a store through
// a lookup result made inside the rank-local branch: map memory, not the stack), and decides
// from an agreed map with a key it stored before the branch.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); NCCLBPF_AGREED; } algo_of SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } counts SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 key = ctx->coll_type & 7;
  __u32 zero = 0;
  __u64 *c = bpf_map_lookup_elem(&counts, &zero);
  if (c && *c > 1000) {
    __u32 one = 1;
    __u64 *d = bpf_map_lookup_elem(&counts, &one);
    if (d) *d += 1;
  }
  __u64 *a = bpf_map_lookup_elem(&algo_of, &key);
  if (a) ctx->algo = *a & 7;
  return 0;
}
