/* Live-reload fixture: a tuner program (refused: tuner swaps wait for sequence numbers) next to
 * an irecv program (swapped in), which counts receives posted in irecv_posted. */
#include "ncclbpf.h"

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } irecv_posted SEC(".maps");

SEC("tuner")
int one_channel(struct ncclbpf_tuner_ctx *ctx) {
  ctx->nchannels = 1;
  return 0;
}

SEC("net/irecv")
int count_irecv(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&irecv_posted, &k);
  if (v) __sync_fetch_and_add(v, 1);
  return 0;
}
