// expect: pointer_leak
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  *v = (__u64)ctx; /* REJECT */
  return 0;
}
