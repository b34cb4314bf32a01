// expect: map_out_of_bounds
// Off by one at the value's end: the check should be i >= 4.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u32[4]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u32 *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  __u32 i = ctx->dev;
  if (i > 4) return 0;
  return v[i]; /* REJECT */
}
