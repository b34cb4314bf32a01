// expect: pointer_leak
// The context pointer as a hash map key: the key is readable by every process that maps it.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64); __uint(max_entries, 16); } seen SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 key = (__u64)ctx;
  __u64 one = 1;
  bpf_map_update_elem(&seen, &key, &one, BPF_ANY); /* REJECT */
  return 0;
}
