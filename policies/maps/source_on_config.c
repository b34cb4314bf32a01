// expect: map 'cfg': a config map cannot have an ncclbpf_source
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
ARR(cfg, __u64, 4, __uint(ncclbpf_scope, 3); __uint(ncclbpf_source, 1););
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
