// expect: map_read_only
// An epoch program that counts into an agreed map: only the agreement fills agreed maps (its
// state reaches the state map through the runtime).
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
  NCCLBPF_EPOCH_SOURCE(1);
} lat SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
  NCCLBPF_AGREED_FROM(1, NCCLBPF_REDUCE_SUM);
} lat_sum SEC(".maps");

SEC("tuner/epoch") int epoch(struct ncclbpf_tuner_epoch_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&lat_sum, &k);
  if (!v) return 0;
  __sync_fetch_and_add(v, 1); /* REJECT */
  return 0;
}
