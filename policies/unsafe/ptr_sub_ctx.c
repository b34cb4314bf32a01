// expect: pointer_arithmetic
// A map value minus the context pointer, stored into the map.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } m SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 *a = bpf_map_lookup_elem(&m, &k);
  if (!a) return 0;
  *a = (__u64)a - (__u64)ctx; /* REJECT */
  return 0;
}
