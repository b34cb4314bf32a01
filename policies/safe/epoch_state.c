// An epoch program and the tuner program that reads its state: the state comes from an agreed map
// filled from an epoch source (the slowest rank's latency), a config map, the context and the
// state kept from the last run; the tuner program decides from the state map.
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
  NCCLBPF_AGREED_FROM(1, NCCLBPF_REDUCE_MAX);
} lat_max SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 1);
  NCCLBPF_CONFIG;
} limit SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, NCCLBPF_STATE_WORDS);
  NCCLBPF_AGREED_STATE;
} state SEC(".maps");

SEC("tuner/epoch") int epoch(struct ncclbpf_tuner_epoch_ctx *ctx) {
  __u32 k = 0;
  ctx->state[0] += 1; /* epochs seen */
  if (ctx->duration_max_ns) ctx->state[3] = ctx->bytes / ctx->duration_max_ns; /* GB/s */
  __u64 *m = bpf_map_lookup_elem(&lat_max, &k);
  __u64 *l = bpf_map_lookup_elem(&limit, &k);
  if (!m || !l) return 0;
  ctx->state[1] = *m;
  if (*l && *m > *l)
    ctx->state[2] += 1; /* epochs over the limit in a row */
  else
    ctx->state[2] = 0;
  return 0;
}

SEC("tuner") int decide(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 2;
  __u64 *over = bpf_map_lookup_elem(&state, &k);
  if (over && *over >= 2) ctx->proto = NCCL_PROTO_LL;
  return 0;
}

SEC("net/complete") int count(struct ncclbpf_net_ctx *ctx) {
  __u32 k = ctx->op & 3;
  __u64 *v = bpf_map_lookup_elem(&lat, &k);
  if (v) __sync_fetch_and_add(v, ctx->latency_ns);
  return 0;
}
