// Two address-taken 4-byte variables side by side in one stack slot: the loop counter (the key
// of one lookup) and a key rewritten every iteration (of another). Each keeps its own bounds.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); NCCLBPF_AGREED; } lat SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); NCCLBPF_CONFIG; } weight SEC(".maps");
SEC("tuner/epoch") int prog(struct ncclbpf_tuner_epoch_ctx *ctx) {
  __u64 sum = 0;
  for (__u32 i = 0; i < 8; i++) {
    __u32 w = 7 - i;
    __u64 *v = bpf_map_lookup_elem(&lat, &i);
    __u64 *k = bpf_map_lookup_elem(&weight, &w);
    if (v && k) sum += *v * *k;
  }
  ctx->state[0] = sum;
  return 0;
}
