// expect: map 'odd': a map with an ncclbpf_source is recorded and combined as u64 words: value_size 12 is not a multiple of 8
#include "ncclbpf.h"
#define ARR(name, value_t, n, extra) struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, value_t); __uint(max_entries, n); extra } name SEC(".maps")
struct three { __u32 a, b, c; };
ARR(odd, struct three, 4, __uint(ncclbpf_source, 1););
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) { return 0; }
