/* Records what the connect hook sees: the communicator and the connection's shape. */
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[3]); __uint(max_entries, 1); } net_seen SEC(".maps");
SEC("net/connect") int on_connect(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&net_seen, &k);
  if (!v) return 0;
  v[0] = ctx->comm_id;
  v[1] = ctx->nstreams;
  v[2] = ctx->op;
  return 0;
}
