// expect: null_deref
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u32); __uint(max_entries, 4); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  void *v = bpf_map_lookup_elem(&arr, &k);
  return bpf_map_lookup_elem(&arr, v) != 0; /* REJECT */
}
