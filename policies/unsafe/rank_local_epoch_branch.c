// expect: rank_local
// An epoch program that writes a constant into its state under a branch on a rank-local value
// (the rank's own latency counter): the state would differ on the ranks where it is large.
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
} lat SEC(".maps");

SEC("tuner/epoch") int epoch(struct ncclbpf_tuner_epoch_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&lat, &k);
  if (!v) return 0;
  if (*v > 1000)
    ctx->state[1] = 1; /* REJECT */
  return 0;
}
