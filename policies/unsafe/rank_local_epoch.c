// expect: rank_local
// An epoch program that reads its rank's own epoch source instead of the agreed map filled from
// it: every rank would compute a different state, and the tuner programs would decide apart.
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
  NCCLBPF_EPOCH_SOURCE(1);
} lat SEC(".maps");

SEC("tuner/epoch") int epoch(struct ncclbpf_tuner_epoch_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&lat, &k);
  if (!v) return 0;
  __u64 x = *v;
  ctx->state[0] = x; /* REJECT */
  return 0;
}
