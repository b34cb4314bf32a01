// expect: rank_local
// tuner/chunk decides too: sender and receiver must step through the buffer alike.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } net_lat SEC(".maps");
SEC("tuner/chunk") int prog(struct ncclbpf_tuner_chunk_ctx *ctx) {
  __u32 k = 0;
  __u64 *lat = bpf_map_lookup_elem(&net_lat, &k);
  if (!lat) return 0;
  ctx->chunk_size = *lat << 9; /* REJECT */
  return 0;
}
