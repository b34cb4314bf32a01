// Signed 32-bit compares: a __s32 context field range-checked both ways, then used as an index.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u32[8]); __uint(max_entries, 1); } hits SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u32 *v = bpf_map_lookup_elem(&hits, &k);
  if (!v) return 0;
  __s32 a = ctx->algo;
  if (a < 0 || a > NCCL_ALGO_PAT) return 0;
  v[a] += 1;
  __s32 p = ctx->proto;
  if (p >= 0 && p <= NCCL_PROTO_SIMPLE) v[7] += p;
  return 0;
}
