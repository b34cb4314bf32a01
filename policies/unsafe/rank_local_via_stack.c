// expect: rank_local
// The rank-local value copied through the stack (spilled, then a byte-wise copy) before use.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } net_lat SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  volatile __u64 slot;
  volatile __u8 bytes[8];
  __u64 *v = bpf_map_lookup_elem(&net_lat, &k);
  slot = v ? *v : 0;
  __u64 x = slot;
  for (int i = 0; i < 8; i++) bytes[i] = (x >> (8 * i)) & 0xff;
  ctx->proto = bytes[0] & 1; /* REJECT */
  return 0;
}
