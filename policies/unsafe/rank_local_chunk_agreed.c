// expect: rank_local
// tuner/chunk runs without the communicator's view of its agreed maps: it reads whichever
// communicator's contents were installed last, so an agreed value is rank-local there.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); NCCLBPF_AGREED; } agreed_chunk SEC(".maps");
SEC("tuner/chunk") int prog(struct ncclbpf_tuner_chunk_ctx *ctx) {
  __u32 k = 0;
  __u64 *c = bpf_map_lookup_elem(&agreed_chunk, &k);
  if (!c) return 0;
  ctx->chunk_size = *c; /* REJECT */
  return 0;
}
