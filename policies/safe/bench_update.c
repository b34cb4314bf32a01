/* Benchmark: a hash-map lookup plus an update of the value (the counter pattern). */
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u32); __type(value, __u64); __uint(max_entries, 64); } bench_hash SEC(".maps");
SEC("tuner") int bench_update(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = ctx->coll_type;
  __u64 *v = bpf_map_lookup_elem(&bench_hash, &k);
  if (v) {
    __sync_fetch_and_add(v, ctx->msg_size);
  } else {
    __u64 init = ctx->msg_size;
    bpf_map_update_elem(&bench_hash, &k, &init, BPF_ANY);
  }
  return 0;
}
