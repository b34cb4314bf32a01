// requires: v4
// What clang emits at -mcpu=v4: sign-extending loads and moves, signed division and modulo,
// bswap instructions.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __s8[16]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __s8 *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  long i = v[0];
  if (i < 0 || i > 15) return 0;
  long x = v[i];
  long d = (__s16)ctx->peer_port;
  long s = ctx->status;
  if (s != 0) x += (long)ctx->latency_ns / s + d % s;
  return (x ^ __builtin_bswap16((__u16)ctx->peer_port)) & 1;
}
