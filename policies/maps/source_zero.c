// expect: map 'z': ncclbpf_source 0 is not an epoch source
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
ARR(z, __u64, 4, __uint(ncclbpf_source, 0););
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
