// expect: map 'a': filled from epoch source 1 ('l'), which has value_size 8 and max_entries 4; this map has value_size 8 and max_entries 8
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
ARR(l, __u64, 4, __uint(ncclbpf_source, 1););
ARR(a, __u64, 8, __uint(ncclbpf_scope, 2); __uint(ncclbpf_source, 1););
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
