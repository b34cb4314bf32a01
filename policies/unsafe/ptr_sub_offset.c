// expect: pointer_arithmetic
// A pointer difference of two lookups used as an offset into one of them.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64[4]); __uint(max_entries, 64); } conns SEC(".maps");
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  __u64 k0 = ctx->conn_id, k1 = ctx->conn_id + 1;
  __u64 *a = bpf_map_lookup_elem(&conns, &k0);
  __u64 *b = bpf_map_lookup_elem(&conns, &k1);
  if (!a || !b) return 0;
  __u64 d = (__u64)b - (__u64)a; /* REJECT */
  return a[(d >> 3) & 3];
}
