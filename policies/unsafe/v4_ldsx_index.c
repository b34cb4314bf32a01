// expect: map_out_of_bounds
// requires: v4
// A sign-extending byte load (ldsx) gives [-128, 127]; only the upper bound is checked.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __s8[16]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __s8 *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  long i = v[0];
  if (i > 15) return 0;
  return v[i]; /* REJECT */
}
