// A tuner that counts rank-locally in a helper function called only when a rank-local counter
// is high (the call gets no pointer to the caller's stack; its result halves the counter), and
// decides from an agreed map with a key it stored before the branch.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 8); NCCLBPF_AGREED; } algo_of SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 4); } counts SEC(".maps");
static __attribute__((noinline)) __u64 note_busy(__u64 n) {
  __u32 k = 1;
  __u64 *c = bpf_map_lookup_elem(&counts, &k);
  if (c) __sync_fetch_and_add(c, n);
  return n / 2;
}
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 key = ctx->coll_type & 7;
  __u32 zero = 0;
  __u64 *c = bpf_map_lookup_elem(&counts, &zero);
  if (c && *c > 1000) *c = note_busy(*c);
  __u64 *a = bpf_map_lookup_elem(&algo_of, &key);
  if (a) ctx->algo = *a & 7;
  return 0;
}
