/* A size-aware tuner for NCCL over this plugin's TCP transport. The defaults come from the
 * sweep in bench/results/gpu-2026-12-01-sweep.md (every algorithm x protocol forced, 2 and 4
 * ranks each on its own host): Tree/Simple wins from 1 KiB to 4 MiB, Ring/Simple above; LL only
 * pays for the smallest messages from 4 nodes on. LL128 is never chosen: NCCL cannot use it
 * over NET here (its cost entry is disabled and the tuner never revives one). Thresholds come
 * from a config map (NCCLBPF_CONFIG: only staged updates change it, at the same collective on
 * every rank); 0 keeps the default. Channels are left to NCCL. */
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 4);
  NCCLBPF_CONFIG;
} tuner_thresholds SEC(".maps");

struct decision_counts {
  __u64 calls;
  __u64 bytes;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct decision_counts);
  __uint(max_entries, 3);
} tuner_decisions SEC(".maps");

static const volatile __u64 default_small = 16 * 1024;
static const volatile __u64 default_large = 4 << 20;

SEC("tuner")
int size_aware(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k0 = 0, k1 = 1;
  __u64 small = default_small, large = default_large;
  __u64 *v = bpf_map_lookup_elem(&tuner_thresholds, &k0);
  if (v && *v) small = *v;
  v = bpf_map_lookup_elem(&tuner_thresholds, &k1);
  if (v && *v) large = *v;

  __u64 n = ctx->msg_size;
  __u32 key;
  if (n <= small && ctx->nnodes >= 4) {
    ctx->algo = NCCL_ALGO_TREE;
    ctx->proto = NCCL_PROTO_LL;
    key = 0;
  } else if (n <= large) {
    ctx->algo = NCCL_ALGO_TREE;
    ctx->proto = NCCL_PROTO_SIMPLE;
    key = 1;
  } else {
    ctx->algo = NCCL_ALGO_RING;
    ctx->proto = NCCL_PROTO_SIMPLE;
    key = 2;
  }
  /* One counter pair per decision, keys 0..2: an array, whose lookups the JIT inlines (a
   * hash map here cost about 4 ns more a call in scripts/tuner-bench.sh). */
  struct decision_counts *c = bpf_map_lookup_elem(&tuner_decisions, &key);
  if (!c) return 0;
  __sync_fetch_and_add(&c->calls, 1);
  __sync_fetch_and_add(&c->bytes, n);
  return 0;
}
