// expect: map 's': the state map receives the epoch program's state[] (32 u64 words, 256 bytes): value_size x max_entries is 264 bytes
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
ARR(s, __u64, 33, __uint(ncclbpf_scope, 2); __uint(ncclbpf_source, 255););
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
