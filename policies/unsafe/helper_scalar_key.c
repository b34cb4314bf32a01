// expect: bad_helper_arg
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  return bpf_map_lookup_elem(&arr, (void *)(long)ctx->nranks) != 0; /* REJECT */
}
