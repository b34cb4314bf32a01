// Variable-offset stack writes into initialized buffers: a byte array and a struct's array.
#include "ncclbpf.h"
struct rec { __u64 f[2]; __u64 n; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, struct rec); __uint(max_entries, 1); } last SEC(".maps");
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  __u8 buf[16] = {};
  buf[ctx->conn_id & 15] = 1;
  buf[(ctx->conn_id + 1) & 15] += 2;
  struct rec r = {};
  r.f[ctx->op & 1] = ctx->bytes;
  r.n = buf[ctx->peer_port & 15];
  __u32 k = 0;
  bpf_map_update_elem(&last, &k, &r, BPF_ANY);
  return 0;
}
