/* Online tuning, per size class of a communicator: try NCCL's own choice and a few fixed
 * algorithm/protocol/channel candidates one after another, measure each, keep the fastest, try
 * again when the kept one slows down (contention, a changed network), and go back to it once the
 * slowdown is over.
 *
 * Size classes: clamp((floor(log2(msg_size)) - 10) / 2, 0, 7), i.e. 0 below 4 KiB, k in
 * [4^k KiB, 4^(k+1) KiB) for k = 1..6, 7 from 16 MiB.
 *
 * What is measured is an epoch (K collectives, NCCL_BPF_AGREEMENT_EPOCH): the SEC("tuner/epoch")
 * program learns only from an epoch in which one class had at least 90% of the collectives (the
 * dominant class), from t = the time per collective: by default the slowest rank's net busy
 * time for the epoch / K, the time its connections of the communicator had a request in
 * flight (the plugin's own measure, net v11+, every rank's record carries it), where every
 * rank has one, else its wall time for the epoch / K, which holds whatever the host does
 * between collectives (an application's compute, a benchmark's checks: time no choice
 * changes, which dilutes what a choice does change and adds its own noise; on the GPU
 * machine a 1.89x loopback flood measured 1.45x by wall time and was not seen:
 * bench/results/gpu-2026-12-03-autotune-stop28-wall.md). autotune_timing 2 asks for the wall
 * time; 1, where NCCL loads the library as its profiler too (NCCL 2.28+ does by itself when
 * the library is its net plugin; KernelCh events: the default mask) and it timed at least 7/8
 * of the class's collectives, for the slowest rank's GPU time of them (SEC("profiler/coll"))
 * per timed collective, which ranked Tree against Ring wrong at 4 ranks on the GPU machine
 * (the per-rank kernel span is not the collective's:
 * bench/results/gpu-2026-12-03-autotune-gpu-time.md against
 * gpu-2026-12-03-autotune-wall-time-2.md). The
 * candidate that epoch ran is read from the agreed calls (every call adds its candidate + 1), not from the
 * state: decisions during an epoch use the state of D epochs before (NCCL_BPF_AGREEMENT_DELAY).
 * Per class:
 *   exploring  each candidate in turn for four epochs that ran it: the first is discarded (the
 *              network settles on the new choice: new connections open there), the other three
 *              measured, and their median is the candidate's time (one stalled collective in an
 *              epoch does not decide); a candidate that ran as NCCL's own choice all epoch
 *              (NCCL cannot use it here, or it is NCCL's pick: the tuner program reads that
 *              from NCCL's cost table, which is the same on every rank) is skipped from its first
 *              epoch, so NCCL's choice is measured once, in slot 0, not again in every slot that
 *              falls back to it. A candidate far (more than 1/4) ahead of the best so far
 *              becomes the best; one far behind is dropped; one within 1/4 either way duels
 *              with the best; after the last candidate the class settles on the best (NCCL's
 *              own choice, candidate 0, is the first best: a later one must beat it), and its
 *              explored median is the reference.
 *   duel       the best so far and the challenger alternate, one epoch each (the state flips
 *              between them every epoch); every two adjacent epochs that ran the two are one
 *              comparison, whichever ran first (so each epoch is set against both of its
 *              neighbours, and a slow drift of the whole machine, which ranks candidates
 *              explored minutes apart by when they ran, weighs on both alike). The duel is
 *              sequential: it ends as soon as one side has won 6 comparisons more than the
 *              other, else after 31 (32 epochs), won by the side with more; a clear difference
 *              ends it in about 12 to 15 epochs, a close one takes longer. Replayed on the
 *              steady stretches of epochs of three GPU runs (bench/gpu/autotune_duel_power.py,
 *              the command in its docstring), a challenger 6 % faster wins 96.6 % of duels, one
 *              3 % faster 87.6 %, one 6 % slower 3.7 %, against 93.9 %, 78.9 % and 4.9 % for
 *              the rule before (only a challenger epoch right after a best epoch compared:
 *              margin 4 of at most 16 pairs, the same 32 epochs), in fewer epochs (14.9 against
 *              17.4 at 6 %). The loser is the runner-up
 *              when the two explored within 1/8 of each other. Two epochs a gap (pins, other
 *              classes' epochs) apart are never compared, nor two that ran the same side (the
 *              D epochs the explored candidate still runs when the duel starts). A duel costs
 *              at most 32 + D epochs, half of them on a choice within 1/4 of the best, per
 *              close candidate; one that cannot compare (its class dominant only in short
 *              bursts, so the flips do not alternate what runs) ends 64 epochs after it began,
 *              by the comparisons it had.
 *              Exploration then goes on with the next candidate (after a removed challenger's
 *              slot too).
 *   settled    t of the kept candidate is tracked twice: the reference (EWMA 1/32 of the
 *              epochs within 3/2 of it) and the recent time (EWMA 1/2 of t capped at twice the
 *              reference). The recent time above 3/2 of the reference in three epochs in a row
 *              starts a new exploration, and the kept candidate becomes the class's home (what
 *              it was before the slowdown): a slowdown that lasts is caught even where single
 *              epochs dip below 3/2 and even where it comes on in steps (the rule before, t
 *              itself over 3/2 of a reference of weight 1/8 three epochs in a row, took a 1.66x
 *              loopback flood into its reference and never explored:
 *              bench/results/gpu-2026-12-03-autotune-wall-time-2.md), and a single stall is
 *              not. The first epoch of the kept candidate after another ran (a pin, the D
 *              epochs after a probe) is not measured, as in exploring. Every 32 settled epochs
 *              within 3/2 of the reference, a probe:
 *   probing    the home (has the slowdown ended?), or else the close runner-up (did noise
 *              rank the two wrong?), duels with the kept candidate as in exploring (alternating
 *              epochs, adjacent epochs compared); when it wins by the margin (6 comparisons
 *              ahead; a closer end keeps the kept candidate), it is kept from then
 *              on (home is cleared; the reference stays and the EWMA follows the new choice;
 *              the old one is the runner-up unless it lost every pair), else the class goes
 *              back to its kept candidate.
 *              A probe costs at most 16 epochs of the other candidate per 32 + 32 + D, and
 *              none at all when there is neither a home nor a close second.
 * Every decision depends on agreed values only (the state, the config table, msg_size), so
 * every rank decides the same; the verifier checks it.
 *
 * Candidates (autotune_candidates, NCCLBPF_CONFIG, changed by staged updates): slot 0 is always
 * NCCL's choice (its entry is ignored); slot i (1..7) with valid 0 is the built-in candidate
 * below, valid 1 the entry itself, any other valid removes the slot. Built in: NCCL's choice,
 * Ring/Simple, Ring/LL, Ring/LL128, Tree/Simple, Tree/LL, Tree/LL128, Ring/Simple on 2 channels.
 *
 * Pins (autotune_pin, NCCLBPF_CONFIG, changed by staged updates): one u64 per class; 0 (the
 * default) lets the policy decide, c + 1 applies candidate c (0: NCCL's choice) to the class
 * from the staged collective on, on every rank alike, until the pin is set back to 0 (a slot
 * that holds no candidate applies NCCL's choice). The state is left as it is: an epoch with a
 * pinned collective in its class teaches nothing (the tuner program counts them in
 * autotune_calls; the epoch program skips such epochs, even where the pin names a candidate
 * the state would apply or is dueling), so unpinning returns the class to where it was. What for: an operator works around a bad choice without unloading the
 * policy, or compares candidates on the running communicator, in turn, against the policy's
 * own choice (bench/gpu/autotune.sh does, with `ncclbpf config --at-seq N PID... autotune_pin
 * CLASS=VALUE`).
 *
 * State (autotune_state, NCCLBPF_AGREED_STATE: state[4*c .. 4*c+3] for class c):
 *   [0] apply     the candidate the tuner program applies (0: NCCL's choice, no opinion)
 *   [1] ctl       phase (bits 0-7: 0 new, 1 exploring, 2 settled, 3 probing, 4 duel); bits 8-15:
 *                 exploring: the candidate being explored (duel: the challenger), else the
 *                 runner-up (0xff: none);
 *                 16-23: epochs the explored or probed candidate ran (duel, probing:
 *                 comparisons); 24-31: exploring and duel: best so far, else the kept candidate; 32-39: drift count
 *                 (duel and probing: the comparisons the challenger won); 40-47: explorations
 *                 started (saturating); 48-55: home (0xff: none); 56-63: exploring and duel:
 *                 the runner-up so far; probing: the challenger; settled: settled epochs
 *                 since the last probe
 *   [2] time_ns   exploring: the best candidate's time (bits 0-31); duel: that and the
 *                 challenger's (32-63); else the reference (the kept candidate's, bits 0-31)
 *                 and the recent time (32-63)
 *   [3] exploring: the candidate's first two measured t (bits 0-31, 32-63, ns, capped at
 *                 2^32 - 1); duel and probing: the last duel epoch's t (bits 0-31),
 *                 whether there is one (bit 32), its epoch (33-46, mod 2^14), whether the
 *                 challenger ran it (47) and the duel's first epoch (48-63, mod 2^16); settled: the agreed net bytes (all ranks'
 *                 completions, sent and received) of the last epoch measured for the class, for
 *                 observers (bits 0-62), and whether the next epoch follows a switch (63) */
#include "ncclbpf.h"

#define AUTOTUNE_CLASSES 8
#define AUTOTUNE_CANDIDATES 8
#define AUTOTUNE_NEW 0
#define AUTOTUNE_EXPLORING 1
#define AUTOTUNE_SETTLED 2
#define AUTOTUNE_PROBING 3
#define AUTOTUNE_DUEL 4
#define AUTOTUNE_DUEL_MARGIN 6 /* comparisons won ahead, by either side, that end a duel */
#define AUTOTUNE_DUEL_MAX 31   /* comparisons at most (32 epochs); then the one with more wins */
#define AUTOTUNE_DUEL_EPOCHS 64 /* epochs at most, counted from its first */
#define AUTOTUNE_NEVER (~0ull)
#define AUTOTUNE_T_NONE 0xffffffffull /* no time (32 bits) */
#define AUTOTUNE_NONE 0xff            /* no slot */
#define AUTOTUNE_PROBE_EVERY 32       /* settled epochs between probes */
#define AUTOTUNE_AFTER_SWITCH (1ull << 63) /* settled, word 3: the next epoch follows a switch */
#define AUTOTUNE_REF_TWICE (1ull + (1ull << 32)) /* x * this: x in both halves of a word */

struct autotune_candidate {
  __s32 algo;      /* NCCL_ALGO_* or -1 */
  __s32 proto;     /* NCCL_PROTO_* or -1 */
  __u32 nchannels; /* 0 keeps NCCL's */
  __u32 valid;     /* 0: the built-in candidate of the slot; 1: this entry; other: no candidate */
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_candidate);
  __uint(max_entries, AUTOTUNE_CANDIDATES);
  NCCLBPF_CONFIG;
} autotune_candidates SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, AUTOTUNE_CLASSES);
  NCCLBPF_CONFIG;
} autotune_pin SEC(".maps");

/* What times an epoch (NCCLBPF_CONFIG, changed by staged updates): 0 (the default) the slowest
 * rank's net busy time per collective where every rank has one (net v11+), else its wall
 * time; 1 the slowest rank's GPU time per timed collective where the profiler timed at least
 * 7/8 of them (else as 0); 2 the slowest rank's wall time. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 1);
  NCCLBPF_CONFIG;
} autotune_timing SEC(".maps");

static const volatile struct autotune_candidate autotune_builtin[AUTOTUNE_CANDIDATES] = {
    {NCCL_ALGO_UNDEF, NCCL_PROTO_UNDEF, 0, 1}, {NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 0, 1},
    {NCCL_ALGO_RING, NCCL_PROTO_LL, 0, 1},     {NCCL_ALGO_RING, NCCL_PROTO_LL128, 0, 1},
    {NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 0, 1}, {NCCL_ALGO_TREE, NCCL_PROTO_LL, 0, 1},
    {NCCL_ALGO_TREE, NCCL_PROTO_LL128, 0, 1},  {NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 2, 1},
};

/* Per class, counted by the tuner program on every rank alike. */
struct autotune_calls {
  __u64 colls;      /* collectives */
  __u64 bytes;      /* their msg_size, summed */
  __u64 cand_plus1; /* (candidate applied + 1), summed: an epoch's change over its colls is
                     * the candidate (every call of an epoch sees the same state) */
  __u64 same;       /* collectives whose candidate ran as NCCL's own choice: NCCL cannot use
                     * it (not usable in its cost table) or it is NCCL's pick already */
  __u64 pinned;     /* collectives an autotune_pin decided: their epoch teaches nothing */
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_calls);
  __uint(max_entries, AUTOTUNE_CLASSES);
  NCCLBPF_EPOCH_SOURCE(1);
} autotune_calls SEC(".maps");

/* Every rank counts the same calls: the largest is the value. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_calls);
  __uint(max_entries, AUTOTUNE_CLASSES);
  NCCLBPF_AGREED_FROM(1, NCCLBPF_REDUCE_MAX);
} autotune_calls_agreed SEC(".maps");

/* Successful net completions of this rank (sends and receives). */
struct autotune_net {
  __u64 bytes;
  __u64 ops;
  __u64 latency_ns; /* summed */
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_net);
  __uint(max_entries, 1);
  NCCLBPF_EPOCH_SOURCE(2);
} autotune_net SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_net);
  __uint(max_entries, 1);
  NCCLBPF_AGREED_FROM(2, NCCLBPF_REDUCE_SUM);
} autotune_net_agreed SEC(".maps");

/* GPU time of this rank's collectives, per class, from the profiler (SEC("profiler/coll"):
 * the first channel's start to the last channel's end on the GPU's clock, docs/guide/profiler.md);
 * only when NCCL loads the library as its profiler too (NCCL_PROFILER_PLUGIN). */
struct autotune_gpu {
  __u64 ns;    /* summed */
  __u64 timed; /* collectives timed */
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_gpu);
  __uint(max_entries, AUTOTUNE_CLASSES);
  NCCLBPF_EPOCH_SOURCE(3);
} autotune_gpu SEC(".maps");

/* The slowest rank's (each word on its own: ranks time the same collectives). */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_gpu);
  __uint(max_entries, AUTOTUNE_CLASSES);
  NCCLBPF_AGREED_FROM(3, NCCLBPF_REDUCE_MAX);
} autotune_gpu_agreed SEC(".maps");

struct autotune_class_state {
  __u64 apply;
  __u64 ctl;
  __u64 time_ns;
  __u64 net_bytes;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct autotune_class_state);
  __uint(max_entries, AUTOTUNE_CLASSES);
  NCCLBPF_AGREED_STATE;
} autotune_state SEC(".maps");

static __always_inline __u32 autotune_class(__u64 n) {
  if (n < (1ull << 12)) return 0;
  if (n < (1ull << 14)) return 1;
  if (n < (1ull << 16)) return 2;
  if (n < (1ull << 18)) return 3;
  if (n < (1ull << 20)) return 4;
  if (n < (1ull << 22)) return 5;
  if (n < (1ull << 24)) return 6;
  return 7;
}

/* Whether slot i (1..7) holds a candidate. */
static __always_inline int autotune_usable(__u32 i) {
  struct autotune_candidate *c = bpf_map_lookup_elem(&autotune_candidates, &i);
  return !c || c->valid <= 1;
}

/* Whether i names a slot that holds a candidate (0, NCCL's choice, always does). */
static __always_inline int autotune_slot(__u64 i) {
  if (i >= AUTOTUNE_CANDIDATES) return 0;
  return i == 0 || autotune_usable(i);
}

/* The median of the two 32-bit times packed in `pair` and t. */
static __always_inline __u64 autotune_median(__u64 pair, __u64 t) {
  __u64 a = pair & 0xffffffff, b = pair >> 32;
  __u64 lo = a < b ? a : b, hi = a < b ? b : a;
  return t < lo ? lo : t > hi ? hi : t;
}

/* The candidate of slot i (1..7) into *out; 0 when the slot holds none. */
static __always_inline int autotune_candidate(__u32 i, struct autotune_candidate *out) {
  struct autotune_candidate *c = bpf_map_lookup_elem(&autotune_candidates, &i);
  if (c && c->valid == 1) {
    out->algo = c->algo;
    out->proto = c->proto;
    out->nchannels = c->nchannels;
    return 1;
  }
  if (c && c->valid != 0) return 0;
  i &= AUTOTUNE_CANDIDATES - 1;
  out->algo = autotune_builtin[i].algo;
  out->proto = autotune_builtin[i].proto;
  out->nchannels = autotune_builtin[i].nchannels;
  return 1;
}

/* 1 when candidate *c runs as NCCL's own choice for this collective: its (algorithm, protocol)
 * is not usable in NCCL's cost table (the tuner then leaves NCCL's choice), or it is NCCL's pick
 * with NCCL's channels. Partial choices (-1 in one field) and an unknown table count as
 * different. The table is the same on every rank (see ncclbpf.h), so is this. */
static __always_inline __u64 autotune_same(struct ncclbpf_tuner_ctx *ctx,
                                           struct autotune_candidate *c) {
  __u32 usable = ctx->usable;
  if (!usable || c->algo < 0 || c->algo > NCCL_ALGO_PAT || c->proto < 0 ||
      c->proto > NCCL_PROTO_SIMPLE)
    return 0;
  if (!(usable & NCCLBPF_USABLE_BIT(c->algo, c->proto))) return 1;
  return c->algo == ctx->nccl_algo && c->proto == ctx->nccl_proto && !c->nchannels;
}

SEC("tuner")
int net_autotune(struct ncclbpf_tuner_ctx *ctx) {
  __u64 n = ctx->msg_size;
  __u32 k = autotune_class(n);
  __u32 cand = 0;
  struct autotune_class_state *st = bpf_map_lookup_elem(&autotune_state, &k);
  if (st) cand = st->apply & (AUTOTUNE_CANDIDATES - 1);
  __u64 *pin = bpf_map_lookup_elem(&autotune_pin, &k);
  __u64 pinned = 0;
  if (pin && *pin) {
    cand = (*pin - 1) & (AUTOTUNE_CANDIDATES - 1);
    pinned = 1;
  }
  struct autotune_candidate c;
  __u64 same = 0;
  if (cand && autotune_candidate(cand, &c)) {
    ctx->algo = c.algo;
    ctx->proto = c.proto;
    if (c.nchannels) ctx->nchannels = c.nchannels;
    same = autotune_same(ctx, &c);
  } else {
    cand = 0;
  }
  struct autotune_calls *calls = bpf_map_lookup_elem(&autotune_calls, &k);
  if (!calls) return 0;
  __sync_fetch_and_add(&calls->colls, 1);
  __sync_fetch_and_add(&calls->bytes, n);
  __sync_fetch_and_add(&calls->cand_plus1, cand + 1);
  __sync_fetch_and_add(&calls->same, same);
  __sync_fetch_and_add(&calls->pinned, pinned);
  return 0;
}

SEC("net/complete")
int net_autotune_complete(struct ncclbpf_net_ctx *ctx) {
  if (ctx->status) return 0;
  __u32 k = 0;
  struct autotune_net *v = bpf_map_lookup_elem(&autotune_net, &k);
  if (!v) return 0;
  __sync_fetch_and_add(&v->bytes, ctx->bytes);
  __sync_fetch_and_add(&v->ops, 1);
  __sync_fetch_and_add(&v->latency_ns, ctx->latency_ns);
  return 0;
}

SEC("profiler/coll")
int net_autotune_coll(struct ncclbpf_profiler_ctx *ctx) {
  if (!ctx->timed) return 0;
  __u32 k = autotune_class(ctx->bytes);
  struct autotune_gpu *v = bpf_map_lookup_elem(&autotune_gpu, &k);
  if (!v) return 0;
  __sync_fetch_and_add(&v->ns, ctx->duration_ns);
  __sync_fetch_and_add(&v->timed, 1);
  return 0;
}

/* The class with at least 90% of the epoch's collectives, + 1 (0: none). Each class's test is
 * computed as a 0 or 1 and added in, not branched on: the verifier then follows one path, not
 * one per combination of outcomes. Counts are taken as 32 bits (an epoch has K of them). */
#define AUTOTUNE_COUNT(b)                                                                      \
  do {                                                                                         \
    __u32 key = b;                                                                             \
    struct autotune_calls *c = bpf_map_lookup_elem(&autotune_calls_agreed, &key);              \
    if (!c) return 0;                                                                          \
    cnt[b] = c->colls & 0xffffffff;                                                            \
    total += cnt[b];                                                                           \
  } while (0)

static __always_inline __u64 autotune_dominant(void) {
  __u64 cnt[AUTOTUNE_CLASSES];
  __u64 total = 0;
  /* Written out: clang does not unroll a loop with an exit in its body. */
  AUTOTUNE_COUNT(0);
  AUTOTUNE_COUNT(1);
  AUTOTUNE_COUNT(2);
  AUTOTUNE_COUNT(3);
  AUTOTUNE_COUNT(4);
  AUTOTUNE_COUNT(5);
  AUTOTUNE_COUNT(6);
  AUTOTUNE_COUNT(7);
  if (!total) return 0;
  __u64 dom = 0;
#pragma clang loop unroll(full)
  for (__u32 b = 0; b < AUTOTUNE_CLASSES; b++) {
    __u64 below = (cnt[b] * 10 - total * 9) >> 63; /* 1 when 10 * cnt < 9 * total */
    asm volatile("" : "+r"(below));                /* keep it arithmetic, not a branch */
    dom += (below ^ 1) * (b + 1);                  /* at most one class passes */
  }
  return dom;
}

/* The next slot after `after` that holds a candidate, or AUTOTUNE_CANDIDATES. The bound is
 * hidden from the optimizer so that clang keeps the `j < limit` test (see rules.c). */
static __always_inline __u32 autotune_next(__u32 after) {
  __u32 limit = AUTOTUNE_CANDIDATES;
  asm volatile("" : "+r"(limit));
#pragma clang loop unroll(disable)
  for (__u32 j = after + 1; j < limit; j++)
    if (autotune_usable(j)) return j;
  return AUTOTUNE_CANDIDATES;
}

SEC("tuner/epoch")
int net_autotune_epoch(struct ncclbpf_tuner_epoch_ctx *ctx) {
  __u64 epoch_colls = ctx->colls;
  asm volatile("" : "+r"(epoch_colls)); /* tested as 64 bits (PREVAIL, the differential
                                         * oracle, does not refine from a 32-bit test) */
  if (!epoch_colls) return 0;
  __u32 zero = 0;
  __u64 *timing = bpf_map_lookup_elem(&autotune_timing, &zero);
  __u64 mode = timing ? *timing : 0;
  /* The net's busy time where every rank measured one (the time its connections of the
   * communicator had a request in flight: what the collectives took on the wire, not the
   * host's time between them), unless wall time is asked for. */
  __u64 span = mode != 2 && ctx->net_busy_min_ns ? ctx->net_busy_max_ns : ctx->duration_max_ns;
  __u64 t = span / epoch_colls; /* per collective */
  asm volatile("" : "+r"(t)); /* divided here, where the verifier knows epoch_colls != 0 */
  __u64 dom = autotune_dominant();
  if (dom == 0 || dom > AUTOTUNE_CLASSES) return 0; /* no dominant class: learn nothing */
  __u32 k = dom - 1;
  struct autotune_calls *c = bpf_map_lookup_elem(&autotune_calls_agreed, &k);
  if (!c) return 0;
  __u64 n = c->colls & 0xffffffff;
  if (!n) return 0;
  __u64 used1 = c->cand_plus1 / n;
  if (used1 == 0 || used1 > AUTOTUNE_CANDIDATES || used1 * n != c->cand_plus1)
    return 0; /* not one candidate for the whole epoch: nothing to learn */
  __u64 used = used1 - 1;
  /* With autotune_timing 1, the GPU's time of the class's collectives, where the profiler
   * timed (nearly) all of them: free of what the host does between collectives (the
   * application's own work, its waits). A collective or two may fall in the next epoch's
   * figures (the profiler reports a collective once the GPU has run it); the mean per timed
   * one is taken. */
  struct autotune_gpu *g = mode == 1 ? bpf_map_lookup_elem(&autotune_gpu_agreed, &k) : 0;
  if (g) {
    __u64 timed = g->timed & 0xffffffff;
    asm volatile("" : "+r"(timed));
    if (timed && timed + n / 8 >= n) {
      t = g->ns / timed;
      asm volatile("" : "+r"(t));
    }
  }
  struct autotune_net *net = bpf_map_lookup_elem(&autotune_net_agreed, &zero);
  __u64 net_bytes = net ? net->bytes : 0;

  __u64 s[NCCLBPF_STATE_WORDS];
  ncclbpf_state_load(ctx, s);
  /* The class indexes the copy of the state: bounded where the verifier sees it (clang would
   * otherwise reload the 32-bit key, whose bounds a 4-byte stack slot does not keep). */
  __u64 cls = dom - 1;
  asm volatile("" : "+r"(cls));
  __u64 *w = &s[(cls & (AUTOTUNE_CLASSES - 1)) * 4];
  __u64 apply = w[0] & (AUTOTUNE_CANDIDATES - 1), ctl = w[1], time = w[2], first = w[3];
  __u64 phase = ctl & 0xff, idx = (ctl >> 8) & 0xff, seen = (ctl >> 16) & 0xff;
  __u64 best = (ctl >> 24) & 0xff, drift = (ctl >> 32) & 0xff, rounds = (ctl >> 40) & 0xff;
  __u64 home = (ctl >> 48) & 0xff, aux = (ctl >> 56) & 0xff;
  if (c->pinned) {
    /* An operator's (or a benchmark's) pin decided: nothing to learn. A settled class only
     * notes that its next epoch follows a switch (below). */
    if (phase == AUTOTUNE_SETTLED) {
      w[3] |= AUTOTUNE_AFTER_SWITCH;
      ncclbpf_state_store(ctx, s);
    }
    return 0;
  }
  __u64 t32 = t > 0xffffffff ? 0xffffffff : t;
  __u64 ep = ctx->epoch; /* agreed: the epoch just combined */
#define AUTOTUNE_EXPLORE_AGAIN                                                                  \
  do {                                                                                          \
    phase = AUTOTUNE_EXPLORING;                                                                 \
    idx = seen = best = drift = apply = 0;                                                      \
    aux = AUTOTUNE_NONE;                                                                        \
    time = AUTOTUNE_NEVER;                                                                      \
    if (rounds < 255) rounds++;                                                                 \
  } while (0)
  int again = 0;
  __u64 after_switch = 0; /* settled: the next epoch follows a switch (word 3, bit 63) */
  if (phase < AUTOTUNE_EXPLORING || phase > AUTOTUNE_DUEL) { /* new (or unknown): explore */
    home = AUTOTUNE_NONE;
    AUTOTUNE_EXPLORE_AGAIN;
  }
  /* Slots a staged config update removed: a kept one is explored again, a probed one ends
   * its probe, and a home or runner-up there is forgotten. */
  if (phase >= AUTOTUNE_SETTLED && best && !autotune_slot(best)) again = 1;
  if (!autotune_slot(home)) home = AUTOTUNE_NONE;
  if ((phase == AUTOTUNE_EXPLORING || phase == AUTOTUNE_DUEL) && !autotune_slot(aux))
    aux = AUTOTUNE_NONE;
  if ((phase == AUTOTUNE_SETTLED || phase == AUTOTUNE_PROBING) && !autotune_slot(idx))
    idx = AUTOTUNE_NONE;
  if (phase == AUTOTUNE_PROBING && !again && !autotune_slot(aux)) {
    phase = AUTOTUNE_SETTLED;
    apply = best;
    seen = drift = aux = 0;
    time = (time & 0xffffffff) * AUTOTUNE_REF_TWICE;
  }
  int advance = 0; /* on to the next candidate, or settle after the last */
  if (phase == AUTOTUNE_EXPLORING) {
    /* A candidate that ran as NCCL's own choice all epoch (not usable, or NCCL's pick) would
     * measure slot 0 again: skipped from its first epoch on; so is one whose slot was removed
     * (the tuner program runs NCCL's choice there, so it would never run). */
    int skip = (used == idx && idx && c->same >= n) || (idx && !autotune_slot(idx));
    if (used == idx && !skip) {
      ++seen; /* the first epoch that ran it is discarded (new connections open there) */
      if (seen == 2) first = t32;
      if (seen == 3) first = (first & 0xffffffff) | t32 << 32;
    }
    if (skip || (used == idx && seen >= 4)) { /* measured three times: the median counts */
      advance = 1;
      if (!skip) {
        __u64 m = autotune_median(first, t32);
        __u64 bt = time & 0xffffffff;
        if (bt != AUTOTUNE_T_NONE && m <= bt + bt / 4 && bt <= m + m / 4) {
          /* Within 1/4 of the best so far, either way: the two duel. */
          phase = AUTOTUNE_DUEL;
          apply = best;
          time = bt | m << 32;
          seen = drift = 0;
          first = (ep & 0xffff) << 48; /* the duel's first epoch */
          advance = 0;
        } else if (m < bt) {
          /* Far ahead: the new best, and the runner-up of the old one is far behind it. */
          best = idx;
          time = m | AUTOTUNE_T_NONE << 32;
          aux = AUTOTUNE_NONE;
        }
      }
    }
  } else if ((phase == AUTOTUNE_DUEL || phase == AUTOTUNE_PROBING) && !again) {
    __u64 ch = phase == AUTOTUNE_DUEL ? idx : aux; /* the challenger */
    __u64 start = first & 0xffff000000000000ull;
    /* Every two adjacent epochs of the duel (by the agreed epoch numbers) that ran the two
     * sides are one comparison, whichever ran first: the challenger wins it when its epoch was
     * faster. Never two epochs a gap (pins, other classes' epochs) apart. Word 3 keeps the
     * last duel epoch: its t, whether it is there (bit 32), its epoch (33-46) and whether the
     * challenger ran it (47). */
    int removed = !autotune_slot(ch);
    __u64 side = used == ch; /* 1: the challenger ran this epoch */
    if (removed) { /* the challenger's slot was removed: the best stays */
      seen = AUTOTUNE_DUEL_MAX;
      drift = 0;
    } else if (used == best || used == ch) {
      __u64 last = first & 0xffffffff;
      if (((first >> 32) & 1) && ((ep - (first >> 33)) & 0x3fff) == 1 &&
          ((first >> 47) & 1) != side) {
        ++seen;
        drift += side ? t32 < last : last < t32;
      }
      first = start | side << 47 | (ep & 0x3fff) << 33 | 1ull << 32 | t32;
    } else {
      first = start;
    }
    apply = apply == best ? ch : best; /* the next one runs the other (D epochs on) */
    /* Sequential: a clear lead ends the duel early, a close one goes on to DUEL_MAX
     * comparisons; one that cannot compare (the class dominant only now and then, so that the
     * flips do not alternate what runs) ends after DUEL_EPOCHS, by the comparisons it had. */
    __u64 lost = seen - drift;
    __u64 over = seen >= AUTOTUNE_DUEL_MAX || drift >= lost + AUTOTUNE_DUEL_MARGIN ||
                 lost >= drift + AUTOTUNE_DUEL_MARGIN ||
                 ((ep - (start >> 48)) & 0xffff) >= AUTOTUNE_DUEL_EPOCHS;
    /* A duel of exploration goes to the side with more wins; a probe changes the kept choice
     * only by a clear lead (the margin): the kept one already won its duel, and a probe that
     * ends on a close majority would swap two near-equal choices back and forth. */
    __u64 won = phase == AUTOTUNE_DUEL ? drift > lost : drift >= lost + AUTOTUNE_DUEL_MARGIN;
    if (over && phase == AUTOTUNE_DUEL) {
      __u64 bt = time & 0xffffffff, ct = time >> 32;
      __u64 loser = won ? best : idx, lt = won ? bt : ct;
      if (won) {
        best = idx;
        bt = ct;
      }
      /* The loser is the runner-up (probed now and then) when the two explored within 1/8 of
       * each other: a close second that noise may still rank wrong. */
      __u64 lo = bt < lt ? bt : lt, hi = bt < lt ? lt : bt;
      if (!removed && hi <= lo + lo / 8)
        aux = loser;
      else if (won)
        aux = AUTOTUNE_NONE;
      time = bt | AUTOTUNE_T_NONE << 32;
      phase = AUTOTUNE_EXPLORING;
      first = 0;
      advance = 1;
    } else if (over) {
      /* A probe's end: a challenger that won takes the class (the reference stays, and the
       * EWMA follows it), and the old one is the runner-up unless it lost every pair; one
       * that lost leaves it all as it was. */
      if (won) {
        idx = lost ? best : AUTOTUNE_NONE;
        best = ch;
        if (ch == home) home = AUTOTUNE_NONE;
      }
      phase = AUTOTUNE_SETTLED;
      apply = best;
      seen = drift = aux = first = 0;
      time = (time & 0xffffffff) * AUTOTUNE_REF_TWICE; /* the recent time starts over */
    }
  } else if (phase == AUTOTUNE_SETTLED && !again && (used != apply || (first >> 63))) {
    /* Another candidate ran (the D epochs after a probe, a pin), or this is the kept one's
     * first epoch after that: the first is not measured, as in exploring (the network settles
     * on the switched choice; on the GPU machine the first epoch of the policy's blocks
     * between pinned ones was the slow one that fed drift). */
    after_switch = used != apply;
  } else if (phase == AUTOTUNE_SETTLED && !again) {
    /* Two averages of t: the reference (weight 1/32, of the epochs within 3/2 of it: slow, so
     * that a slowdown that comes on in steps is not taken in before it is seen) and the recent
     * time (1/2, of t capped at twice the reference, so that one stalled epoch moves it by at
     * most half the reference). Drift is the recent time above 3/2 of the reference in three
     * epochs in a row: a slowdown that lasts (3 epochs at 2x, 5 at 1.66x, whatever the
     * epoch-to-epoch noise around it), not a single stall. */
    __u64 ref = time & 0xffffffff, recent = time >> 32;
    __u64 capped = t32 < 2 * ref ? t32 : 2 * ref;
    recent = (recent + capped) / 2;
    if (recent > 0xffffffff) recent = 0xffffffff;
    if (recent > ref + ref / 2) {
      if (++drift >= 3) { /* slower by half, lasting: explore again */
        if (home == AUTOTUNE_NONE) home = best; /* what to come back to once it is over */
        again = 1;
      }
    } else {
      drift = 0;
    }
    if (t32 <= ref + ref / 2) {
      ref = ref - ref / 32 + t32 / 32;
      if (++aux >= AUTOTUNE_PROBE_EVERY) {
        /* A probe: the choice kept before a slowdown (has it recovered?), else a close
         * runner-up (was it ranked right?), duels with the kept one. */
        __u64 target = AUTOTUNE_NONE;
        if (idx != best && autotune_slot(idx)) target = idx;
        if (home != best && autotune_slot(home)) target = home;
        aux = 0;
        if (target != AUTOTUNE_NONE) {
          phase = AUTOTUNE_PROBING;
          aux = target;
          apply = best;
          seen = drift = 0;
          first = (ep & 0xffff) << 48; /* the duel's first epoch */
        }
      }
    }
    time = (ref & 0xffffffff) | recent << 32;
  }
  if (advance) {
    __u32 next = autotune_next(idx);
    if (next < AUTOTUNE_CANDIDATES) {
      idx = apply = next;
      seen = 0;
    } else {
      /* Settled on the best; the runner-up, if any, is probed now and then. */
      idx = aux;
      phase = AUTOTUNE_SETTLED;
      apply = best;
      time = (time & 0xffffffff) * AUTOTUNE_REF_TWICE; /* the reference, and the recent time */
      if (home == best) home = AUTOTUNE_NONE;
      seen = drift = aux = 0;
    }
  }
  if (again) AUTOTUNE_EXPLORE_AGAIN;
  w[0] = apply & (AUTOTUNE_CANDIDATES - 1);
  w[1] = (phase & 0xff) | (idx & 0xff) << 8 | (seen & 0xff) << 16 | (best & 0xff) << 24 |
         (drift & 0xff) << 32 | (rounds & 0xff) << 40 | (home & 0xff) << 48 | (aux & 0xff) << 56;
  w[2] = time;
  w[3] = phase == AUTOTUNE_SETTLED ? (net_bytes & ~AUTOTUNE_AFTER_SWITCH) | after_switch << 63
                                    : first;
  ncclbpf_state_store(ctx, s);
  return 0;
}
