// expect: ok
// Map identity across objects (netplugin/tests/map_identity.rs): a net object that declares
// size_aware's config map `tuner_thresholds` exactly as size_aware does (NCCLBPF_CONFIG) and
// only reads it: the same map, shared.
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
  NCCLBPF_CONFIG;
} tuner_thresholds SEC(".maps");

SEC("net/complete")
int read_threshold(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&tuner_thresholds, &k);
  return v && ctx->bytes > *v;
}
