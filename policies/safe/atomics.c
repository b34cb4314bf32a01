#include "ncclbpf.h"
struct cnt { __u64 n; __u64 last; __u32 w; __u32 flag; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, struct cnt); __uint(max_entries, 2); } c SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  struct cnt *v = bpf_map_lookup_elem(&c, &k);
  if (!v) return 0;
  __u64 before = __sync_fetch_and_add(&v->n, 1);
  __sync_fetch_and_add(&v->w, 2);
  __sync_fetch_and_or(&v->flag, 4);
  __sync_fetch_and_and(&v->flag, 0xff);
  __sync_fetch_and_xor(&v->flag, 1);
  __u64 old = __sync_lock_test_and_set(&v->last, ctx->bytes);
  __u32 prev = __sync_val_compare_and_swap(&v->w, 2, 9);
  return (before + old + prev) & 1;
}
