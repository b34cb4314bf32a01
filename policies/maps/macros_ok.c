// expect: ok
// The map declarations of an epoch with ncclbpf.h's macros (tests/maps.rs checks what they expand
// to).
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
  NCCLBPF_EPOCH_SOURCE(3);
} counts SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
  NCCLBPF_AGREED_FROM(3, NCCLBPF_REDUCE_MIN);
} counts_min SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, NCCLBPF_STATE_WORDS);
  NCCLBPF_AGREED_STATE;
} state SEC(".maps");

SEC("tuner/epoch") int prog(struct ncclbpf_tuner_epoch_ctx *ctx) { return 0; }
