// expect: map 's': a map with an ncclbpf_source is recorded and combined as u64 words: value_size 4 is not a multiple of 8
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
ARR(s, __u32, 8, __uint(ncclbpf_scope, 2); __uint(ncclbpf_source, 255););
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
