// expect: pointer_arithmetic
// Values of two different maps subtracted: the result is where the maps sit relative to each
// other, stored where other processes read it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } m1 SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } m2 SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *a = bpf_map_lookup_elem(&m1, &k);
  __u64 *b = bpf_map_lookup_elem(&m2, &k);
  if (!a || !b) return 0;
  *a = ((__u64)a - (__u64)b) >> 12; /* REJECT */
  return 0;
}
