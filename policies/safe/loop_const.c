#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 16); NCCLBPF_CONFIG; } thresholds SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  int pick = -1;
#pragma clang loop unroll(disable)
  for (__u32 i = 0; i < 16; i++) {
    __u32 k = i;
    __u64 *v = bpf_map_lookup_elem(&thresholds, &k);
    if (v && *v && ctx->msg_size <= *v) { pick = i; break; }
  }
  if (pick >= 0) ctx->proto = pick % 3;
  return 0;
}
