// expect: rank_local
// A config map other than .rodata is per communicator (staged updates take effect at each
// communicator's own collective), and tuner/chunk runs without the communicator's view of it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); NCCLBPF_CONFIG; } chunk_limits SEC(".maps");
SEC("tuner/chunk") int prog(struct ncclbpf_tuner_chunk_ctx *ctx) {
  __u32 k = 2;
  __u64 *lim = bpf_map_lookup_elem(&chunk_limits, &k);
  if (!lim) return 0;
  ctx->chunk_size = *lim; /* REJECT */
  return 0;
}
