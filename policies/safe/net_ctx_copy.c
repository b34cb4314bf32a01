// Copies of the net context: a whole-struct copy (clang loads it 8 bytes at a time, the last
// load covering `status` and `reserved`), a copy of its tail, and `reserved` read alone. The
// runtime fills every byte of the context (`reserved` is 0), so each load reads defined bytes.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, struct ncclbpf_net_ctx); __uint(max_entries, 8); } last SEC(".maps");
struct tail { __u64 latency_ns; __s32 status; __u32 reserved; };
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, struct tail); __uint(max_entries, 64); } tails SEC(".maps");
SEC("net/complete") int copy_whole(struct ncclbpf_net_ctx *ctx) {
  struct ncclbpf_net_ctx c = *ctx;
  __u32 k = c.op & 7;
  bpf_map_update_elem(&last, &k, &c, BPF_ANY);
  return 0;
}
SEC("net/close") int copy_into_value(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 7;
  struct ncclbpf_net_ctx *v = bpf_map_lookup_elem(&last, &k);
  if (v) *v = *ctx;
  return 0;
}
SEC("net/isend") int copy_tail(struct ncclbpf_net_ctx *ctx) {
  struct tail t;
  __u64 key = ctx->conn_id;
  __builtin_memcpy(&t, &ctx->latency_ns, sizeof(t));
  bpf_map_update_elem(&tails, &key, &t, BPF_ANY);
  return 0;
}
SEC("net/irecv") int status_and_reserved(struct ncclbpf_net_ctx *ctx) {
  __u64 both;
  __builtin_memcpy(&both, &ctx->status, 8);
  return (both >> 32) == 0 && ctx->reserved == 0;
}
