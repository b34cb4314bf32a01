// expect: rank_local
// Whether an entry exists in a rank-local hash map is this rank's own.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64); __uint(max_entries, 64); } peers_seen SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 k = ctx->comm_id;
  if (bpf_map_lookup_elem(&peers_seen, &k)) ctx->proto = NCCL_PROTO_SIMPLE; /* REJECT */
  return 0;
}
