// expect: unbounded_loop
// A loop whose bound is a map value: nothing limits it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } cfg SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *n = bpf_map_lookup_elem(&cfg, &k);
  if (!n) return 0;
  __u64 acc = 0;
  for (__u64 i = 0; i < *n; i++)
    acc += i ^ ctx->bytes; /* REJECT */ /* the loop head: first insn of the body */
  return acc & 1;
}
