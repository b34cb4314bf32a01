// expect: bad_insn
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[2]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  char *v = bpf_map_lookup_elem(&arr, &k);
  if (!v) return 0;
  __sync_fetch_and_add((__u64 *)(v + 4), 1); /* REJECT */
  return 0;
}
