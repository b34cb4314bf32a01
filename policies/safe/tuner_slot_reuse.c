// A tuner that looks a rank-local 8-byte key up first, then an agreed map with a 4-byte key
// stored where the first key was (clang reuses the slot): the decision depends on the agreed
// key's bytes only.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); NCCLBPF_AGREED; } algo_of SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64); __uint(max_entries, 64); } seen SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } last SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 zero = 0;
  __u64 *l = bpf_map_lookup_elem(&last, &zero);
  if (!l) return 0;
  {
    __u64 k = *l;
    __u64 one = 1;
    bpf_map_update_elem(&seen, &k, &one, BPF_ANY);
  }
  {
    __u32 k = ctx->coll_type & 7;
    __u64 *a = bpf_map_lookup_elem(&algo_of, &k);
    if (a) ctx->algo = *a & 7;
  }
  return 0;
}
