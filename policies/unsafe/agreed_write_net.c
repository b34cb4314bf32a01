// expect: map_read_only
// Only the agreement fills an agreed map: a net hook may not write it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); NCCLBPF_AGREED; } agreed_lat SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&agreed_lat, &k);
  if (v) *v = ctx->latency_ns; /* REJECT */
  return 0;
}
