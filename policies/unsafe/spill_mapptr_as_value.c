// expect: pointer_leak
// A map value pointer inside a stack struct, copied into another map by bpf_map_update_elem.
#include "ncclbpf.h"
struct rec { __u64 bytes; __u64 *where; };
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } cnt SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, struct rec); __uint(max_entries, 1); } history SEC(".maps");
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *c = bpf_map_lookup_elem(&cnt, &k);
  if (!c) return 0;
  struct rec r = { ctx->bytes, c };
  bpf_map_update_elem(&history, &k, &r, BPF_ANY); /* REJECT */
  return 0;
}
