// expect: null_deref
// The lookup's result passes up through three frames unchecked; the entry program writes
// through it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); } m SEC(".maps");
static __attribute__((noinline)) __u64 *find(__u32 k) {
  return bpf_map_lookup_elem(&m, &k);
}
static __attribute__((noinline)) __u64 *find2(__u32 k) {
  return find(k + 1);
}
static __attribute__((noinline)) __u64 *find3(__u32 k) {
  return find2(k * 2);
}
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 *v = find3(ctx->coll_type);
  *v = 1; /* REJECT */
  return 0;
}
