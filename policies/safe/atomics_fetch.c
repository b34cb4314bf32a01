// Every atomic on map values, with the fetched results used (fetch_and/or/xor included).
#include "ncclbpf.h"
struct st { __u64 a; __u64 b; __u32 c; __u32 d; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, struct st); __uint(max_entries, 1); } s SEC(".maps");
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  struct st *v = bpf_map_lookup_elem(&s, &k);
  if (!v) return 0;
  __u64 r = __sync_fetch_and_add(&v->a, ctx->bytes);
  r ^= __sync_fetch_and_or(&v->b, 1);
  r ^= __sync_fetch_and_and(&v->b, ~2ull);
  r ^= __sync_fetch_and_xor(&v->a, r);
  r ^= __sync_fetch_and_add(&v->c, 1);
  r ^= __sync_fetch_and_or(&v->c, 8);
  r ^= __sync_fetch_and_and(&v->d, 0xff);
  r ^= __sync_fetch_and_xor(&v->d, 3);
  r ^= __sync_lock_test_and_set(&v->c, 5);
  r ^= __sync_val_compare_and_swap(&v->b, 1, r);
  r ^= __sync_val_compare_and_swap(&v->d, 3, 4);
  __sync_fetch_and_sub(&v->a, 1);
  return r & 1;
}
