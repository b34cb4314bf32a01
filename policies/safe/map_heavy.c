#include "ncclbpf.h"
struct val { __u64 a, b, c; };
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, struct val); __uint(max_entries, 128); } h SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, struct val); __uint(max_entries, 8); } a SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } pc SEC(".maps");
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  __u64 key = ctx->conn_id;
  struct val nv = { ctx->bytes, 1, 0 };
  if (bpf_map_update_elem(&h, &key, &nv, BPF_NOEXIST) != 0) {
    struct val *v = bpf_map_lookup_elem(&h, &key);
    if (v) { v->a += ctx->bytes; v->b++; }
  }
  __u32 slot = ctx->op & 7;
  struct val *av = bpf_map_lookup_elem(&a, &slot);
  if (av) { av->a = ctx->bytes; av->c = ctx->peer_port; }
  __u32 z = 0;
  __u64 *p = bpf_map_lookup_elem(&pc, &z);
  if (p) *p += 1;
  if (ctx->bytes == 0) bpf_map_delete_elem(&h, &key);
  return 0;
}
