// `&buf[i]` into an 8-aligned stack buffer with i < 8 (or the element offset below 8): clang
// knows the low three bits of the buffer's address are 0 and computes the address as
// `ptr |= i`. The frame pointer is 8-aligned in both engines, so the `or` is an add; the
// verifier takes it as one when the pointer is a stack pointer at a constant multiple of 8
// and the scalar is within [0, 7] (docs/design/verifier.md).
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); } m SEC(".maps");
SEC("net/isend") int bytes(struct ncclbpf_net_ctx *ctx) {
  __u8 buf[8] __attribute__((aligned(8)));
  *(__u64 *)buf = ctx->bytes;
  __u32 i = ctx->dev & 7;
  buf[i] = 1;
  return buf[i ^ 1] + *(__u64 *)buf;
}
SEC("net/complete") int second_word(struct ncclbpf_net_ctx *ctx) {
  __u8 buf[24] __attribute__((aligned(8)));
  __builtin_memcpy(buf, &ctx->bytes, 24);
  __u32 i = ctx->nstreams & 7;
  buf[8 + i] += 3;
  buf[16 + (i ^ 7)] = (__u8)i;
  __u32 k = 0;
  bpf_map_update_elem(&m, &k, &buf[8], BPF_ANY);
  return buf[16] & 1;
}
SEC("net/close") int halves(struct ncclbpf_net_ctx *ctx) {
  __u16 h[4] __attribute__((aligned(8)));
  *(__u64 *)h = ctx->latency_ns;
  __u32 i = ctx->op & 3;
  h[i] = 0xffff;
  __u32 w[2] __attribute__((aligned(8)));
  *(__u64 *)w = ctx->conn_id;
  w[ctx->dev & 1] = 9;
  return (h[i ^ 2] + w[0]) & 1;
}
static __attribute__((noinline)) __u32 in_callee(__u64 x, __u32 i) {
  __u8 buf[8] __attribute__((aligned(8)));
  *(__u64 *)buf = x;
  return buf[i & 7];
}
SEC("tuner") int tuner_bytes(struct ncclbpf_tuner_ctx *ctx) {
  __u8 buf[8] __attribute__((aligned(8)));
  *(__u64 *)buf = ctx->msg_size;
  __u32 i = ctx->coll_type & 7;
  ctx->nchannels = buf[i] & 1 ? 2 : 4;
  return in_callee(ctx->comm_id, ctx->nranks) & 1;
}
