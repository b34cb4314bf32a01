/* Latency budgets per size class: when a class's collectives take longer than its budget, move
 * it to the low-latency protocol, then to the low-latency protocol on fewer channels; when it is
 * comfortably within budget again, step back towards NCCL's own choice.
 *
 * Size classes as in net_autotune.c: clamp((floor(log2(msg_size)) - 10) / 2, 0, 7), i.e. 0 below
 * 4 KiB, k in [4^k KiB, 4^(k+1) KiB) for k = 1..6, 7 from 16 MiB.
 *
 * Budgets: slo_budget_ns (NCCLBPF_CONFIG), one u64 per class, nanoseconds per collective; 0 (the
 * default everywhere) is no budget, and the class keeps NCCL's choice. Set them with a staged
 * config update, which takes effect at the same collective on every rank; for example 200000
 * (200 µs) for class 3 (64-256 KiB) and 2000000 (2 ms) for class 5 (1-4 MiB). Removing a budget
 * returns the class to NCCL's choice at the next epoch in which it is dominant.
 *
 * The SEC("tuner/epoch") program learns from an epoch in which one class had at least 90% of the
 * collectives, from t = the slowest rank's wall time for the epoch / K, and only when the epoch
 * ran the class's current level (read from the agreed calls: decisions during an epoch use the
 * state of D epochs before). Levels:
 *   0  NCCL's choice (no opinion)
 *   1  the LL protocol, NCCL's algorithm and channels
 *   2  the LL protocol on slo_level2_channels (2) channels
 * t over the budget in 2 measured epochs in a row: one level down (1, then 2). At a level above
 * 0, t below 4/5 of the budget in 4 measured epochs in a row: one level up (a probe: if the
 * budget is missed there, the class comes back down after 2 epochs).
 *
 * State (slo_state, NCCLBPF_AGREED_STATE: state[4*c .. 4*c+3] for class c):
 *   [0] level    what the tuner program applies (0, 1, 2)
 *   [1] over     measured epochs over the budget in a row
 *   [2] under    measured epochs below 4/5 of the budget in a row
 *   [3] last_ns  t of the last measured epoch, for observers */
#include "ncclbpf.h"

#define SLO_CLASSES 8
#define SLO_LEVELS 3

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, SLO_CLASSES);
  NCCLBPF_CONFIG;
} slo_budget_ns SEC(".maps");

static const volatile __u32 slo_level2_channels = 2;

/* Per class, counted by the tuner program on every rank alike. */
struct slo_calls {
  __u64 colls;       /* collectives */
  __u64 bytes;       /* their msg_size, summed */
  __u64 level_plus1; /* (level applied + 1), summed: an epoch's change over its colls is the
                      * level (every call of an epoch sees the same state) */
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct slo_calls);
  __uint(max_entries, SLO_CLASSES);
  NCCLBPF_EPOCH_SOURCE(1);
} slo_calls SEC(".maps");

/* Every rank counts the same calls: the largest is the value. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct slo_calls);
  __uint(max_entries, SLO_CLASSES);
  NCCLBPF_AGREED_FROM(1, NCCLBPF_REDUCE_MAX);
} slo_calls_agreed SEC(".maps");

struct slo_class_state {
  __u64 level;
  __u64 over;
  __u64 under;
  __u64 last_ns;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct slo_class_state);
  __uint(max_entries, SLO_CLASSES);
  NCCLBPF_AGREED_STATE;
} slo_state SEC(".maps");

static __always_inline __u32 slo_class(__u64 n) {
  if (n < (1ull << 12)) return 0;
  if (n < (1ull << 14)) return 1;
  if (n < (1ull << 16)) return 2;
  if (n < (1ull << 18)) return 3;
  if (n < (1ull << 20)) return 4;
  if (n < (1ull << 22)) return 5;
  if (n < (1ull << 24)) return 6;
  return 7;
}

SEC("tuner")
int slo_enforcer(struct ncclbpf_tuner_ctx *ctx) {
  __u64 n = ctx->msg_size;
  __u32 k = slo_class(n);
  __u64 level = 0;
  struct slo_class_state *st = bpf_map_lookup_elem(&slo_state, &k);
  if (st && st->level < SLO_LEVELS) level = st->level;
  if (level >= 1) ctx->proto = NCCL_PROTO_LL;
  if (level >= 2) ctx->nchannels = slo_level2_channels;
  struct slo_calls *calls = bpf_map_lookup_elem(&slo_calls, &k);
  if (!calls) return 0;
  __sync_fetch_and_add(&calls->colls, 1);
  __sync_fetch_and_add(&calls->bytes, n);
  __sync_fetch_and_add(&calls->level_plus1, level + 1);
  return 0;
}

/* The class with at least 90% of the epoch's collectives, + 1 (0: none); see net_autotune.c. */
#define SLO_COUNT(b)                                                                           \
  do {                                                                                         \
    __u32 key = b;                                                                             \
    struct slo_calls *c = bpf_map_lookup_elem(&slo_calls_agreed, &key);                        \
    if (!c) return 0;                                                                          \
    cnt[b] = c->colls & 0xffffffff;                                                            \
    total += cnt[b];                                                                           \
  } while (0)

static __always_inline __u64 slo_dominant(void) {
  __u64 cnt[SLO_CLASSES];
  __u64 total = 0;
  SLO_COUNT(0);
  SLO_COUNT(1);
  SLO_COUNT(2);
  SLO_COUNT(3);
  SLO_COUNT(4);
  SLO_COUNT(5);
  SLO_COUNT(6);
  SLO_COUNT(7);
  if (!total) return 0;
  __u64 dom = 0;
#pragma clang loop unroll(full)
  for (__u32 b = 0; b < SLO_CLASSES; b++) {
    __u64 below = (cnt[b] * 10 - total * 9) >> 63; /* 1 when 10 * cnt < 9 * total */
    asm volatile("" : "+r"(below));                /* keep it arithmetic, not a branch */
    dom += (below ^ 1) * (b + 1);                  /* at most one class passes */
  }
  return dom;
}

SEC("tuner/epoch")
int slo_enforcer_epoch(struct ncclbpf_tuner_epoch_ctx *ctx) {
  __u64 epoch_colls = ctx->colls;
  asm volatile("" : "+r"(epoch_colls)); /* tested as 64 bits (PREVAIL, the differential
                                         * oracle, does not refine from a 32-bit test) */
  if (!epoch_colls) return 0;
  __u64 t = ctx->duration_max_ns / epoch_colls; /* per collective */
  asm volatile("" : "+r"(t)); /* divided here, where the verifier knows epoch_colls != 0 */
  __u64 dom = slo_dominant();
  if (dom == 0 || dom > SLO_CLASSES) return 0; /* no dominant class: learn nothing */
  __u32 k = dom - 1;
  struct slo_calls *c = bpf_map_lookup_elem(&slo_calls_agreed, &k);
  __u64 *budget_p = bpf_map_lookup_elem(&slo_budget_ns, &k);
  if (!c || !budget_p) return 0;
  __u64 n = c->colls & 0xffffffff;
  if (!n) return 0;
  __u64 used1 = c->level_plus1 / n;
  if (used1 == 0 || used1 > SLO_LEVELS || used1 * n != c->level_plus1)
    return 0; /* not one level for the whole epoch: nothing to learn */
  __u64 used = used1 - 1;
  __u64 budget = *budget_p;

  __u64 s[NCCLBPF_STATE_WORDS];
  ncclbpf_state_load(ctx, s);
  __u64 cls = dom - 1; /* bounded where the verifier sees it (see net_autotune.c) */
  asm volatile("" : "+r"(cls));
  __u64 *w = &s[(cls & (SLO_CLASSES - 1)) * 4];
  __u64 level = w[0], over = w[1], under = w[2];
  if (level >= SLO_LEVELS) level = 0;
  if (!budget) {
    level = over = under = 0; /* no budget: NCCL's choice */
  } else if (used == level) {
    if (t > budget) {
      under = 0;
      if (++over >= 2 && level < SLO_LEVELS - 1) {
        level++;
        over = 0;
      }
    } else if (t < budget - budget / 5) {
      over = 0;
      if (++under >= 4 && level > 0) {
        level--;
        under = 0;
      }
    } else {
      over = under = 0;
    }
  }
  if (over > 255) over = 255;
  if (under > 255) under = 255;
  w[0] = level;
  w[1] = over;
  w[2] = under;
  w[3] = t;
  ncclbpf_state_store(ctx, s);
  return 0;
}
