// expect: rank_local
// A config map is the same everywhere, but which entry is read depends on a rank-local key.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } net_lat SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __s32); __uint(max_entries, 4); NCCLBPF_CONFIG; } algo_of SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *lat = bpf_map_lookup_elem(&net_lat, &k);
  if (!lat) return 0;
  __u32 bucket = *lat & 3;
  __s32 *a = bpf_map_lookup_elem(&algo_of, &bucket);
  if (a) ctx->algo = *a; /* REJECT */
  return 0;
}
