// expect: pointer_leak
// A stack buffer holding the context pointer passed as the value of bpf_map_update_elem.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[2]); __uint(max_entries, 1); } m SEC(".maps");
SEC("net/connect") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 v[2];
  v[0] = ctx->conn_id;
  v[1] = (__u64)ctx;
  bpf_map_update_elem(&m, &k, v, BPF_ANY); /* REJECT */
  return 0;
}
