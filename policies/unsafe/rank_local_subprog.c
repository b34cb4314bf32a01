// expect: rank_local
// A BPF-to-BPF call whose return value depends on a rank-local value.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } net_lat SEC(".maps");
static __attribute__((noinline)) __u32 pick(__u32 k) {
  __u64 *lat = bpf_map_lookup_elem(&net_lat, &k);
  return lat ? (__u32)(*lat & 3) : 0;
}
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 p = pick(0);
  ctx->proto = p; /* REJECT */
  return 0;
}
