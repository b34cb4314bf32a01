// Subprograms that return pointers which outlive them: a map value (NULL-checked by the caller
// when the callee may return NULL, used directly when it cannot), one handed up through three
// frames, a pointer into the caller's own stack (its frame is still alive) and the context.
// Only a pointer into the callee's own stack dies when it returns (unsafe/subprog_*_stack_*).
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[4]); __uint(max_entries, 8); } vals SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64); __uint(max_entries, 64); } seen SEC(".maps");
static __attribute__((noinline)) __u64 *slot(__u32 k) {
  return bpf_map_lookup_elem(&vals, &k);
}
static __attribute__((noinline)) __u64 *slot2(__u32 k) {
  return slot(k & 7);
}
static __attribute__((noinline)) __u64 *slot3(__u32 k) {
  __u64 *v = slot2(k);
  if (!v) return 0;
  v[1] += 1;
  return v;
}
/* Never NULL: falls back to a global. */
static __u64 fallback[4];
static __attribute__((noinline)) __u64 *slot_or_global(__u64 key) {
  __u64 *v = bpf_map_lookup_elem(&seen, &key);
  return v ? v : &fallback[1];
}
static __attribute__((noinline)) __u64 *pick(__u64 *a, __u64 *b, __u32 c) {
  return (c & 1) ? a : b;
}
static __attribute__((noinline)) __u64 *at(__u64 *buf, __u32 i) {
  return &buf[i & 3];
}
static __attribute__((noinline)) struct ncclbpf_net_ctx *same(struct ncclbpf_net_ctx *ctx, __u32 c) {
  ctx->op == c ? (void)0 : (void)bpf_ktime_get_ns();
  return ctx;
}
SEC("net/complete") int map_values(struct ncclbpf_net_ctx *ctx) {
  __u64 *v = slot(ctx->op);
  if (v) v[0] += ctx->bytes;
  __u64 *w = slot3(ctx->dev);
  if (w) w[3] = ctx->latency_ns;
  __u64 *g = slot_or_global(ctx->conn_id);
  return *g & 1;
}
SEC("net/isend") int stack_and_ctx(struct ncclbpf_net_ctx *ctx) {
  __u64 a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  __u64 *p = pick(a, b, ctx->nstreams);
  __u64 *q = at(b, ctx->dev);
  struct ncclbpf_net_ctx *c = same(ctx, 3);
  return (p[2] + *q + c->bytes) & 1;
}
SEC("tuner") int tuner_value(struct ncclbpf_tuner_ctx *ctx) {
  __u64 *v = slot2(ctx->coll_type);
  if (v) v[2] += 1; /* a rank-local counter beside the decision */
  ctx->proto = NCCL_PROTO_SIMPLE;
  return 0;
}
