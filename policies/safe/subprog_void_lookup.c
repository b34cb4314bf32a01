// Void subprograms that count into a map: clang leaves the lookup's result (a map value, or
// NULL) in r0 at their exit, at call depth 1, 2 and 3. Map values outlive every frame, so what
// r0 holds when a subprogram returns is fine; a caller of a void function never reads it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); } hits SEC(".maps");
static __attribute__((noinline)) void bump(__u32 k) {
  __u64 *v = bpf_map_lookup_elem(&hits, &k);
  if (v) *v += 1;
}
static __attribute__((noinline)) void bump2(__u32 k) {
  bump(k & 3);
  __u32 j = 4 + (k & 1);
  __u64 *v = bpf_map_lookup_elem(&hits, &j);
  if (v) *v += k;
}
static __attribute__((noinline)) void bump3(__u32 k) {
  bump2(k);
  __u32 j = 7;
  __u64 *v = bpf_map_lookup_elem(&hits, &j);
  if (v) __sync_fetch_and_add(v, 1);
}
SEC("net/isend") int depth1(struct ncclbpf_net_ctx *ctx) {
  bump(ctx->op);
  return 0;
}
SEC("net/complete") int depth2(struct ncclbpf_net_ctx *ctx) {
  bump2(ctx->dev);
  return 0;
}
SEC("net/close") int depth3(struct ncclbpf_net_ctx *ctx) {
  bump3(ctx->nstreams);
  return 0;
}
SEC("tuner") int tuner_counts(struct ncclbpf_tuner_ctx *ctx) {
  bump3(ctx->coll_type);
  ctx->proto = NCCL_PROTO_SIMPLE;
  return 0;
}
