// A tuner that sums an agreed array in a loop whose counter is the lookup key (its address is
// taken): clang keeps the counter in 4 bytes of the stack, stored and filled every iteration.
// The fill keeps the counter's bounds (a narrow spill), so the loop ends.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); NCCLBPF_AGREED; } lat SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 sum = 0;
  for (__u32 i = 0; i < 8; i++) {
    __u64 *v = bpf_map_lookup_elem(&lat, &i);
    if (v) sum += *v;
  }
  if (sum > ctx->msg_size) ctx->algo = NCCL_ALGO_RING;
  return 0;
}
