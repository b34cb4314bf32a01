// BPF-to-BPF calls passing stack pointers: the callee fills the caller's buffer and reads it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[4]); __uint(max_entries, 1); } out SEC(".maps");
static __attribute__((noinline)) void fill(__u64 *buf, __u64 seed) {
  for (int i = 0; i < 4; i++) buf[i] = seed * (i + 1);
}
static __attribute__((noinline)) __u64 sum(const __u64 *buf, __u32 n) {
  __u64 s = 0;
  for (__u32 i = 0; i < 4 && i < n; i++) s += buf[i];
  return s;
}
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u64 buf[4];
  fill(buf, ctx->bytes);
  __u32 k = 0;
  bpf_map_update_elem(&out, &k, buf, BPF_ANY);
  return sum(buf, ctx->nstreams) & 1;
}
