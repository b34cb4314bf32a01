// expect: unbounded_access
// Signed/unsigned confusion: a signed index checked only against its upper bound can be negative.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[4]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  int i = (__s8)ctx->nranks;
  if (i > 3) return 0;
  return v[i]; /* REJECT */
}
