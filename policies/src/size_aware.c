/* A size-aware tuner: LL for small messages, LL128 for medium, Simple with more channels for
 * large ones; thresholds come from a map operators can change while the job runs. */
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
} tuner_thresholds SEC(".maps");

struct decision_counts {
  __u64 calls;
  __u64 bytes;
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __type(key, __u32);
  __type(value, struct decision_counts);
  __uint(max_entries, 64);
} tuner_decisions SEC(".maps");

static const volatile __u64 default_small = 64 * 1024;

SEC("tuner")
int size_aware(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k0 = 0, k1 = 1;
  __u64 small = default_small, large = 4 << 20;
  __u64 *v = bpf_map_lookup_elem(&tuner_thresholds, &k0);
  if (v && *v) small = *v;
  v = bpf_map_lookup_elem(&tuner_thresholds, &k1);
  if (v && *v) large = *v;

  __u64 n = ctx->msg_size;
  __u32 key;
  if (n <= small) {
    ctx->proto = NCCL_PROTO_LL;
    key = 0;
  } else if (n <= large) {
    ctx->proto = NCCL_PROTO_LL128;
    key = 1;
  } else {
    ctx->algo = NCCL_ALGO_RING;
    ctx->proto = NCCL_PROTO_SIMPLE;
    if (ctx->max_channels < 8 && ctx->nnodes > 1) ctx->nchannels = 8;
    key = 2;
  }
  struct decision_counts *c = bpf_map_lookup_elem(&tuner_decisions, &key);
  if (!c) {
    struct decision_counts zero = {};
    bpf_map_update_elem(&tuner_decisions, &key, &zero, BPF_NOEXIST);
    c = bpf_map_lookup_elem(&tuner_decisions, &key);
    if (!c) return 0;
  }
  __sync_fetch_and_add(&c->calls, 1);
  __sync_fetch_and_add(&c->bytes, n);
  return 0;
}
