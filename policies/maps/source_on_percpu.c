// expect: map 'p': a map with an ncclbpf_source must be an array, not percpu_array
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); __uint(ncclbpf_source, 1); } p SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
