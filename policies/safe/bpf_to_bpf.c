#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); NCCLBPF_CONFIG; } cfg SEC(".maps");
static __attribute__((noinline)) __u64 threshold(__u32 which) {
  __u64 *v = bpf_map_lookup_elem(&cfg, &which);
  return v ? *v : 65536;
}
static __attribute__((noinline)) int choose(__u64 size, __u64 small, __u64 large) {
  if (size <= small) return NCCL_PROTO_LL;
  if (size <= large) return NCCL_PROTO_LL128;
  return NCCL_PROTO_SIMPLE;
}
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  ctx->proto = choose(ctx->msg_size, threshold(0), threshold(1));
  return 0;
}
