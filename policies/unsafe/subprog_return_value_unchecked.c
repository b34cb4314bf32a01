// expect: null_deref
// A subprogram returns its lookup's result (a map value or NULL); the caller reads through it
// without the NULL check the callee left to it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); } m SEC(".maps");
static __attribute__((noinline)) __u64 *find(__u32 k) {
  return bpf_map_lookup_elem(&m, &k);
}
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u64 *v = find(ctx->op);
  return *v & 1; /* REJECT */
}
