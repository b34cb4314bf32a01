// expect: map_read_only
// A config map changes only through staged updates, not from a program (here through a helper).
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); NCCLBPF_CONFIG; } thresholds SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  __u64 v = ctx->msg_size;
  bpf_map_update_elem(&thresholds, &k, &v, BPF_ANY); /* REJECT */
  return 0;
}
