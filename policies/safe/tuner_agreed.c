// A tuner that decides from an agreed map and a config map, keeps rank-local counters of its
// own (written after deciding; a branch on them that meets again before the next decision does
// not taint it), and ignores the rank-local counters in its decisions.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); NCCLBPF_AGREED; } agreed_lat SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); NCCLBPF_CONFIG; } limits SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } counts SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *c = bpf_map_lookup_elem(&counts, &k);
  if (c && *c < 1000000) __sync_fetch_and_add(c, 1);
  __u64 *lat = bpf_map_lookup_elem(&agreed_lat, &k);
  __u64 *lim = bpf_map_lookup_elem(&limits, &k);
  if (!lat || !lim) return 0;
  if (*lat > *lim) ctx->proto = NCCL_PROTO_SIMPLE;
  else ctx->proto = NCCL_PROTO_LL;
  __u32 k1 = 1;
  c = bpf_map_lookup_elem(&counts, &k1);
  if (c) __sync_fetch_and_add(c, ctx->msg_size);
  return 0;
}
