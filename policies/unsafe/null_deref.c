// expect: null_deref
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 16); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 1;
  __u64 *v = bpf_map_lookup_elem(&arr, &k);
  return *v; /* REJECT */
}
