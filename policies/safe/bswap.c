// Byte swaps of context fields: network-order ports, bpf_htons-style helpers.
#include "ncclbpf.h"
#define my_htons(x) __builtin_bswap16(x)
#define my_htonl(x) __builtin_bswap32(x)
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[3]); __uint(max_entries, 1); } seen SEC(".maps");
SEC("net/connect") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&seen, &k);
  if (!v) return 0;
  v[0] = my_htons((__u16)ctx->peer_port);
  v[1] = my_htonl(ctx->dev);
  v[2] = __builtin_bswap64(ctx->conn_id);
  return my_htons((__u16)ctx->peer_port) == 0x1234;
}
