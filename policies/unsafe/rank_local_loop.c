// expect: rank_local
// A loop that runs a rank-local number of times: what it counts differs between ranks.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } net_lat SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *lat = bpf_map_lookup_elem(&net_lat, &k);
  if (!lat) return 0;
  __u64 lim = *lat;
  __u32 n = 1;
  for (int i = 0; i < 8; i++) {
    if (i >= lim) break;
    n++;
  }
  ctx->nchannels = n; /* REJECT */
  return 0;
}
