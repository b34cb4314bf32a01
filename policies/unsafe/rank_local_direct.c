// expect: rank_local
// A tuner that decides straight from a map the net hooks write: each rank's counts are its own.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64); __uint(max_entries, 64); } net_bytes SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 k = ctx->comm_id;
  __u64 *v = bpf_map_lookup_elem(&net_bytes, &k);
  if (v) ctx->nchannels = *v & 7; /* REJECT */
  return 0;
}
SEC("net/complete") int count(struct ncclbpf_net_ctx *ctx) {
  __u64 k = ctx->comm_id;
  __u64 *v = bpf_map_lookup_elem(&net_bytes, &k);
  if (v) __sync_fetch_and_add(v, ctx->bytes);
  return 0;
}
