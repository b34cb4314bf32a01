/* Live-reload fixture: one program the verifier accepts (irecv, with a map of its own) and one
 * it rejects (close writes a read-only context field). Nothing may change: the irecv hook stays
 * empty and half_bad_seen is never created. */
#include "ncclbpf.h"

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } half_bad_seen SEC(".maps");

SEC("net/irecv")
int good_irecv(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&half_bad_seen, &k);
  if (v) __sync_fetch_and_add(v, 1);
  return 0;
}

SEC("net/close")
int bad_close(struct ncclbpf_net_ctx *ctx) {
  ctx->status = 0; /* read-only: rejected */
  return 0;
}
