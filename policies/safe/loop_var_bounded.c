#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 16); NCCLBPF_CONFIG; } weights SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 n = ctx->nranks;
  if (n > 64) n = 64;
  __u64 s = 0;
#pragma clang loop unroll(disable)
  for (__u32 i = 0; i < n; i++) {
    __u32 k = i & 15;
    __u64 *v = bpf_map_lookup_elem(&weights, &k);
    if (v) s += *v;
  }
  ctx->nchannels = s > 32 ? 32 : s;
  return 0;
}
