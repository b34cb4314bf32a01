// A map entry updated from its own value (`update(&m, &k, lookup(&m, &k))`), in an array, a
// per-CPU array and a hash map, and a hash entry inserted under a key read from a value of the
// same map. The kernel allows it; the runtime copies the value with overlap allowed, so the
// entry keeps its value (policy-runtime/tests/idioms.rs runs it on both engines).
#include "ncclbpf.h"
struct pair { __u64 a, b; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, struct pair); __uint(max_entries, 4); } arr SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __type(key, __u32); __type(value, struct pair); __uint(max_entries, 4); } pcpu SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, struct pair); __uint(max_entries, 16); } hash SEC(".maps");
SEC("net/complete") int self_update(struct ncclbpf_net_ctx *ctx) {
  __u32 k = ctx->op & 3;
  struct pair *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  v->a += ctx->bytes;
  v->b = v->a ^ 0x5555;
  bpf_map_update_elem(&arr, &k, v, BPF_ANY);
  struct pair *p = bpf_map_lookup_elem(&pcpu, &k);
  if (p) {
    p->a += 1;
    bpf_map_update_elem(&pcpu, &k, p, BPF_EXIST);
  }
  __u64 h = ctx->conn_id;
  struct pair fresh = {ctx->bytes, ctx->latency_ns};
  bpf_map_update_elem(&hash, &h, &fresh, BPF_NOEXIST);
  struct pair *w = bpf_map_lookup_elem(&hash, &h);
  if (!w) return 0;
  w->b += 1;
  bpf_map_update_elem(&hash, &h, w, BPF_EXIST);
  /* A key that is a value of the same map (its first word). */
  bpf_map_update_elem(&hash, &w->a, w, BPF_ANY);
  return 0;
}
