// expect: null_deref
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u32); __type(value, __u64); __uint(max_entries, 16); } h SEC(".maps");
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = ctx->op;
  __u64 *v = bpf_map_lookup_elem(&h, &k);
  if (v) return 0;
  return *(volatile __u64 *)v; /* REJECT */
}
