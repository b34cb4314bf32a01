// Index-first pointer arithmetic: clang emits "r1 = idx; r1 += r0" (scalar += map value).
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u32[4]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u32 *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  long i = (long)(ctx->op & 7) - 4;
  if (i < 0) return 0;
  v[i] += 1;
  return 0;
}
