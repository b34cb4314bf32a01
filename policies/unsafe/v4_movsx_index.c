// expect: unbounded_access
// requires: v4
// A sign-extending move (movsx from 16 bits) of a context field used as a negative index.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[8]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  long i = (__s16)ctx->peer_port;
  if (i >= 8) return 0;
  return v[i]; /* REJECT */
}
