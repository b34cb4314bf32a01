// A loop with more live values than callee-saved registers across two lookups per iteration:
// clang spills them to the stack, and their bounds must survive the spill and fill.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 16); NCCLBPF_CONFIG; } w SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 n = ctx->nranks, m = ctx->nnodes, q = ctx->coll_type, p = ctx->num_pipe_ops;
  __u64 a = 0, b = 0, c = 0, d = 0;
  if (n > 16) n = 16;
#pragma clang loop unroll(disable)
  for (__u32 i = 0; i < n; i++) {
    __u32 k = (i + m) & 15;
    __u64 *v = bpf_map_lookup_elem(&w, &k);
    if (!v) continue;
    a += *v * q; b ^= *v + p; c += i; d += m * i;
    k = (i * 3) & 15;
    v = bpf_map_lookup_elem(&w, &k);
    if (v) { a += *v; d ^= *v; }
  }
  ctx->nchannels = (a + b + c + d) & 31;
  return 0;
}
