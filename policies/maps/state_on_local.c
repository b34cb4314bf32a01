// expect: map 's': ncclbpf_source 255 (NCCLBPF_SOURCE_STATE) is only for the agreed map
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
ARR(s, __u64, 32, __uint(ncclbpf_source, 255););
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
