// expect: ok
// Map identity across objects (issue 38; netplugin/tests/map_identity.rs): a net object that
// declares size_aware's config map `tuner_thresholds` as a plain (rank-local) map of the same
// shape and writes this rank's last send size into it. It verifies on its own; listed beside
// size_aware.o it must not load (before, the registry compared shapes only and joined the two,
// so the tuner's choice followed this rank's traffic).
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
} tuner_thresholds SEC(".maps");

SEC("net/isend")
int last_send(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&tuner_thresholds, &k);
  if (v) *v = ctx->bytes;
  return 0;
}
