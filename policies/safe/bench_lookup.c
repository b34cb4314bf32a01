/* Benchmark: one array-map lookup. */
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 16); NCCLBPF_CONFIG; } bench_arr SEC(".maps");
SEC("tuner") int bench_lookup(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = ctx->coll_type & 15;
  __u64 *v = bpf_map_lookup_elem(&bench_arr, &k);
  if (v && ctx->msg_size > *v) ctx->proto = NCCL_PROTO_SIMPLE;
  return 0;
}
