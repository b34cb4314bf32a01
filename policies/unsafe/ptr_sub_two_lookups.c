// expect: pointer_arithmetic
// The distance between two map values (two lookups, different keys) is an address difference.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[4]); __uint(max_entries, 4); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k0 = 0, k1 = 1;
  char *a = bpf_map_lookup_elem(&arr, &k0);
  char *b = bpf_map_lookup_elem(&arr, &k1);
  if (!a || !b) return 0;
  long d = b - a; /* REJECT */
  ctx->nchannels = d > 32 ? 2 : 1;
  return 0;
}
