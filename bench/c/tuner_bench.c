/* getCollInfo cost as NCCL pays it: a C caller that dlopens the plugin library, takes
 * ncclTunerPlugin_v5 (what NCCL 2.28 loads), inits one context (8 ranks, 2 nodes) and times
 * getCollInfo over a mix of collectives and sizes (8 B ... 1 GiB), each call on a freshly
 * filled NCCL-shaped cost table (float[7][3], -1 where NCCL could not use a combination).
 *
 *   tuner_bench CONFIG...
 *
 * where each CONFIG is one of
 *   LABEL=plugin:LIB.so[:POLICY.o[:JIT[:RANKS]]]
 *                                          through the library; POLICY sets NCCL_BPF_TUNER_POLICY
 *                                          (none: unset), JIT NCCL_BPF_JIT (default 1), RANKS the
 *                                          communicator's ranks (default 8 on 2 nodes; 1: one
 *                                          rank on one node, which agrees with itself at every
 *                                          epoch, for policies that run the agreement)
 *   LABEL=native                           size_aware's logic written in C, called through a
 *                                          function pointer (the "native twin")
 *   LABEL=empty                            a function that returns at once, through the same
 *                                          pointer: the harness's own cost per call
 *
 * The plugin reads its policy from the environment once, at its first init, so every plugin
 * CONFIG must name its own copy of the library (a distinct file: dlopen returns one handle per
 * file): the environment is set, the copy opened and its context made, one CONFIG after the
 * other. The configurations are then timed interleaved, in rounds: each round runs every
 * configuration for ROUND_BATCHES batches of BATCH calls (the first batch after a switch is not
 * kept), so a shared, noisy machine slows all of them alike.
 *
 * Timing: clock_gettime(CLOCK_MONOTONIC) around each batch (the clock costs ~20 ns, a batch
 * ~1-25 us); a sample is the batch's time / BATCH. Prints one line per CONFIG
 *   RESULT LABEL p50=<ns> p99=<ns> mean=<ns> calls=<n> summary_calls=<n|-1>
 * where summary_calls adds up the counts of the plugin's finalize summary (-1 without one).
 *
 * Before anything is timed, every input runs once through each configuration and is checked:
 * without a policy the table and channel count must be left alone; with size_aware the result
 * must be the native twin's. At the end, with a policy, the finalize summary must count every
 * call. Any difference exits 1.
 *
 * Build: gcc -O2 -o tuner_bench bench/c/tuner_bench.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* From NCCL 2.28 src/include/plugin/tuner/tuner_v5.h and nccl_common.h. */
#define NCCL_NUM_ALGORITHMS 7 /* TREE RING COLLNET_DIRECT COLLNET_CHAIN NVLS NVLS_TREE PAT */
#define NCCL_NUM_PROTOCOLS 3  /* LL LL128 SIMPLE */
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_PAT 6
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_ALGO_PROTO_IGNORE -1.0f
#define NCCL_NUM_HW_LINKS 3
#define NCCL_NUM_COMPCAPS 4
#define NCCL_NUM_TUNING_SCALES 3

typedef int ncclResult_t;
typedef int ncclFunc_t; /* 0 Broadcast, 1 Reduce, 2 AllGather, 3 ReduceScatter, 4 AllReduce */
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

typedef struct {
  double baseLatencies[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
  double hwLatencies[NCCL_NUM_HW_LINKS][NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
  double llMaxBws[NCCL_NUM_COMPCAPS][NCCL_NUM_TUNING_SCALES];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS][NCCL_NUM_TUNING_SCALES];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS][NCCL_NUM_TUNING_SCALES];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS][NCCL_NUM_TUNING_SCALES];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS][NCCL_NUM_TUNING_SCALES];
} ncclTunerConstants_v5_t;

typedef ncclResult_t (*getCollInfo_fn)(void *context, ncclFunc_t collType, size_t nBytes,
                                       int numPipeOps, float **collCostTable, int numAlgo,
                                       int numProto, int regBuff, int *nChannels);

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                       ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t *nvlDomainInfo,
                       ncclTunerConstants_v5_t *constants);
  getCollInfo_fn getCollInfo;
  ncclResult_t (*finalize)(void *context);
} ncclTuner_v5_t;

_Static_assert(sizeof(ncclTuner_v5_t) == 32, "v5 table is 4 pointers");
_Static_assert(sizeof(ncclTunerConstants_v5_t) == 1152, "v5 constants are 1152 bytes");

#define NRANKS 8
#define NNODES 2
#define BATCH 64
#define SAMPLES 20000     /* kept batches per configuration */
#define ROUND_BATCHES 9   /* batches per configuration and round, the first not kept */
#define WARMUP_ROUNDS 100
#define MAX_CONFIGS 32
#define NINPUTS 4096 /* a power of two */
#define MIN_LOG2 3   /* 8 B */
#define MAX_LOG2 30  /* 1 GiB */
#define NSIZES (MAX_LOG2 - MIN_LOG2 + 1)
#define NENTRIES (NCCL_NUM_ALGORITHMS * NCCL_NUM_PROTOCOLS)

/* ---- the inputs: collective, size, and the table NCCL would have filled for them ---- */

struct input {
  ncclFunc_t coll;
  size_t bytes;
  const float *costs; /* NENTRIES floats */
};

static float templates[3][NSIZES][NENTRIES]; /* [allreduce, allgather, reducescatter] */
static struct input inputs[NINPUTS];

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* Latency (us) + bytes / bandwidth (GB/s) per (algo, proto), shaped like NCCL's model for 8
 * ranks on 2 nodes without CollNet or NVLS: Tree and Ring usable with every protocol, PAT only
 * for all-gather / reduce-scatter with Simple, the rest -1. */
static void fill_templates(void) {
  static const double lat[3] = {6.0, 9.0, 14.0};  /* LL, LL128, Simple */
  static const double bw[3] = {3.0, 11.0, 20.0};
  for (int c = 0; c < 3; c++)
    for (int s = 0; s < NSIZES; s++) {
      double n = (double)(1ull << (MIN_LOG2 + s));
      float *t = templates[c][s];
      for (int i = 0; i < NENTRIES; i++) t[i] = NCCL_ALGO_PROTO_IGNORE;
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) {
        double ring = lat[p] * (2 * NRANKS - 2) / 4 + n * (2.0 * (NRANKS - 1) / NRANKS) / (bw[p] * 1e3);
        double tree = lat[p] * 2 * 3 + n * 2.0 / (bw[p] * 0.9 * 1e3);
        if (c != 0) ring /= 2; /* one pass */
        t[NCCL_ALGO_RING * NCCL_NUM_PROTOCOLS + p] = (float)ring;
        if (c == 0) t[NCCL_ALGO_TREE * NCCL_NUM_PROTOCOLS + p] = (float)tree;
      }
      if (c != 0)
        t[NCCL_ALGO_PAT * NCCL_NUM_PROTOCOLS + NCCL_PROTO_SIMPLE] =
            (float)(lat[2] * 3 + n / (bw[2] * 1e3));
    }
}

/* Sizes log-uniform over 8 B ... 1 GiB (any multiple of 8 within a power of two); 60% all-reduce,
 * 20% all-gather, 20% reduce-scatter, in a fixed pseudo-random order. */
static void fill_inputs(int period) {
  static const ncclFunc_t colls[3] = {4, 2, 3};
  for (int i = 0; i < NINPUTS; i++) {
    if (period > 0 && i >= period) {
      inputs[i] = inputs[i % period];
      continue;
    }
    int s = (int)(next_rand() % NSIZES);
    uint64_t base = 1ull << (MIN_LOG2 + s);
    uint64_t extra = (next_rand() % base) & ~7ull;
    if (s == NSIZES - 1) extra = 0; /* stay at or under 1 GiB */
    int r = (int)(next_rand() % 10), c = r < 6 ? 0 : r < 8 ? 1 : 2;
    inputs[i].coll = colls[c];
    inputs[i].bytes = base + extra;
    inputs[i].costs = templates[c][s];
  }
}

/* ---- the native twin of policies/src/size_aware.c, plus the plugin's table writing ---- */

struct native_ctx {
  uint64_t nranks, nnodes;
  uint64_t thresholds[4]; /* the tuner_thresholds map: 0 = default */
  struct {
    uint64_t calls, bytes;
  } counts[3]; /* the tuner_decisions map */
};

static struct native_ctx native;

static int usable(const float *t, int a, int p, int np) { return t[a * np + p] >= 0.0f; }

/* decide::apply: a full pair is forced if usable; a protocol (or algorithm) alone takes the
 * cheapest usable entry of that column (row); anything else leaves the table alone. */
static int native_apply(float *t, int na, int np, int algo, int proto) {
  int best = -1;
  if (algo >= 0 && algo < na && proto >= 0 && proto < np) {
    if (usable(t, algo, proto, np)) best = algo * np + proto;
  } else if (algo >= 0 && algo < na && proto == -1) {
    for (int p = 0; p < np; p++)
      if (usable(t, algo, p, np) && (best < 0 || t[algo * np + p] < t[best])) best = algo * np + p;
  } else if (proto >= 0 && proto < np && algo == -1) {
    for (int a = 0; a < na; a++)
      if (usable(t, a, proto, np) && (best < 0 || t[a * np + proto] < t[best])) best = a * np + proto;
  }
  if (best < 0) return 0;
  t[best] = 0.0f;
  return 1;
}

__attribute__((noinline)) static ncclResult_t native_get_coll_info(
    void *vctx, ncclFunc_t coll, size_t n, int pipe, float **table, int na, int np, int reg,
    int *nch) {
  struct native_ctx *c = vctx;
  (void)coll, (void)pipe, (void)reg, (void)nch; /* size_aware leaves channels to NCCL */
  uint64_t small = 16 * 1024, large = 4 << 20, v;
  if ((v = __atomic_load_n(&c->thresholds[0], __ATOMIC_RELAXED))) small = v;
  if ((v = __atomic_load_n(&c->thresholds[1], __ATOMIC_RELAXED))) large = v;
  int algo, proto, key;
  if (n <= small && c->nnodes >= 4) {
    algo = NCCL_ALGO_TREE;
    proto = NCCL_PROTO_LL;
    key = 0;
  } else if (n <= large) {
    algo = NCCL_ALGO_TREE;
    proto = NCCL_PROTO_SIMPLE;
    key = 1;
  } else {
    algo = NCCL_ALGO_RING;
    proto = NCCL_PROTO_SIMPLE;
    key = 2;
  }
  __atomic_fetch_add(&c->counts[key].calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->counts[key].bytes, n, __ATOMIC_RELAXED);
  if (table && na > 0 && np > 0) native_apply((float *)table, na, np, algo, proto);
  return 0;
}

__attribute__((noinline)) static ncclResult_t empty_get_coll_info(
    void *vctx, ncclFunc_t coll, size_t n, int pipe, float **table, int na, int np, int reg,
    int *nch) {
  (void)vctx, (void)coll, (void)n, (void)pipe, (void)table, (void)na, (void)np, (void)reg,
      (void)nch;
  __asm__ volatile("" ::: "memory");
  return 0;
}

/* ---- the logger: warnings to stderr, the finalize summary kept ---- */

static char summary[4096];
static long summary_calls = -1;

static void logger(int level, unsigned long flags, const char *file, int line, const char *fmt,
                   ...) {
  (void)flags, (void)file, (void)line;
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (level <= 2) fprintf(stderr, "tuner_bench: plugin: %s\n", buf);
  const char *s = strstr(buf, "TUNER/BPF comm ");
  if (s) {
    snprintf(summary, sizeof summary, "%s", s);
    /* "comm 0x...: algo A proto P[ (not applied)]: N, ..." or "...: no decisions" */
    summary_calls = 0;
    for (const char *p = strstr(s, ": "); p; p = strstr(p + 2, ": ")) {
      char *end;
      long n = strtol(p + 2, &end, 10);
      if (end != p + 2) summary_calls += n;
    }
  }
}

/* ---- timing ---- */

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

enum check { CHECK_NONE, CHECK_SIZE_AWARE, CHECK_COUNTS };

struct config {
  const char *label;
  getCollInfo_fn fn;
  void *ctx;
  ncclTuner_v5_t *tuner; /* NULL for native / empty */
  enum check check;
  long calls;
  int nsamples;
  double *samples;
};

static struct config configs[MAX_CONFIGS];
static int nconfigs;

static void set_env(const char *name, const char *value) {
  if (value && *value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

/* LABEL=plugin:LIB[:POLICY[:JIT]] | LABEL=native | LABEL=empty */
static int parse_config(char *arg, struct config *c, int index) {
  char *eq = strchr(arg, '=');
  if (!eq) return -1;
  *eq = 0;
  c->label = arg;
  char *kind = eq + 1;
  if (strcmp(kind, "native") == 0) {
    c->fn = native_get_coll_info;
    c->ctx = &native;
    c->check = CHECK_SIZE_AWARE;
    return 0;
  }
  if (strcmp(kind, "empty") == 0) {
    c->fn = empty_get_coll_info;
    return 0;
  }
  if (strncmp(kind, "plugin:", 7) != 0) return -1;
  char *lib = kind + 7, *policy = NULL, *jit = NULL, *ranks = NULL;
  if ((policy = strchr(lib, ':'))) {
    *policy++ = 0;
    if ((jit = strchr(policy, ':'))) {
      *jit++ = 0;
      if ((ranks = strchr(jit, ':'))) *ranks++ = 0;
    }
  }
  size_t nranks = ranks ? strtoul(ranks, NULL, 10) : NRANKS;
  if (nranks == 0) return -1;
  size_t nnodes = nranks < NNODES ? nranks : NNODES;
  set_env("NCCL_BPF_TUNER_POLICY", policy);
  set_env("NCCL_BPF_JIT", jit);
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "tuner_bench: dlopen: %s\n", dlerror());
    return -2;
  }
  c->tuner = dlsym(h, "ncclTunerPlugin_v5");
  if (!c->tuner) {
    fprintf(stderr, "tuner_bench: no ncclTunerPlugin_v5 in %s\n", lib);
    return -2;
  }
  for (int i = 0; i < index; i++)
    if (configs[i].tuner == c->tuner) {
      fprintf(stderr, "tuner_bench: %s: the same library as %s; give each configuration its own "
                      "copy (the policy is read once per library)\n", c->label, configs[i].label);
      return -2;
    }
  ncclNvlDomainInfo_v5_t nvl = {(int)nnodes, (int)(nranks / nnodes), (int)(nranks / nnodes)};
  static ncclTunerConstants_v5_t consts; /* NCCL pre-fills these; zeros do here */
  if (c->tuner->init(&c->ctx, 0x5eed0000ull + index, nranks, nnodes, logger, &nvl, &consts) != 0) {
    fprintf(stderr, "tuner_bench: %s: init failed\n", c->label);
    return -2;
  }
  c->fn = c->tuner->getCollInfo;
  c->check = !policy || !*policy ? CHECK_NONE
             : strstr(policy, "size_aware") ? CHECK_SIZE_AWARE
                                            : CHECK_COUNTS;
  return 0;
}

static int check_config(struct config *c) {
  float table[NENTRIES], want[NENTRIES];
  for (int i = 0; i < NINPUTS; i++) {
    int nch = 0, want_nch = 0;
    memcpy(want, inputs[i].costs, sizeof want);
    memcpy(table, inputs[i].costs, sizeof table);
    if (c->check == CHECK_SIZE_AWARE)
      native_get_coll_info(&native, inputs[i].coll, inputs[i].bytes, 1, (float **)want,
                           NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &want_nch);
    c->fn(c->ctx, inputs[i].coll, inputs[i].bytes, 1, (float **)table, NCCL_NUM_ALGORITHMS,
          NCCL_NUM_PROTOCOLS, 0, &nch);
    c->calls++;
    if (c->check != CHECK_COUNTS && (memcmp(want, table, sizeof table) != 0 || want_nch != nch)) {
      fprintf(stderr, "tuner_bench: %s: input %d (coll %d, %zu B) decided otherwise\n", c->label,
              i, inputs[i].coll, inputs[i].bytes);
      return -1;
    }
  }
  return 0;
}

static double run_batch(struct config *c, int base) {
  float table[NENTRIES];
  float *tp = table;
  int nch;
  double t0 = now_ns();
  for (int k = 0; k < BATCH; k++) {
    const struct input *in = &inputs[(base + k) & (NINPUTS - 1)];
    memcpy(table, in->costs, sizeof table); /* NCCL fills the table before every call */
    nch = 0;
    c->fn(c->ctx, in->coll, in->bytes, 1, (float **)tp, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0,
          &nch);
    __asm__ volatile("" : : "r"(tp), "r"(nch) : "memory");
  }
  double t1 = now_ns();
  c->calls += BATCH;
  return (t1 - t0) / BATCH;
}

int main(int argc, char **argv) {
  int period = 0;
  if (argc > 2 && strcmp(argv[1], "--period") == 0) {
    period = atoi(argv[2]);
    argv += 2;
    argc -= 2;
  }
  if (argc < 2 || argc - 1 > MAX_CONFIGS || period < 0 || period > NINPUTS) {
    fprintf(stderr, "usage: %s [--period N] CONFIG... (at most %d; see the top of tuner_bench.c)\n",
            argv[0], MAX_CONFIGS);
    return 2;
  }
  fill_templates();
  fill_inputs(period);
  native.nranks = NRANKS;
  native.nnodes = NNODES;
  nconfigs = argc - 1;
  for (int i = 0; i < nconfigs; i++) {
    int r = parse_config(argv[i + 1], &configs[i], i);
    if (r == -1) fprintf(stderr, "tuner_bench: bad configuration '%s'\n", argv[i + 1]);
    if (r) return r == -1 ? 2 : 1;
    configs[i].samples = calloc(SAMPLES, sizeof(double));
  }
  for (int i = 0; i < nconfigs; i++)
    if (check_config(&configs[i])) return 1;

  /* Rounds: each configuration in turn (starting one further each round), ROUND_BATCHES
   * batches at a time; the first batch after a switch warms it up again and is not kept. */
  int kept = ROUND_BATCHES - 1, rounds = (SAMPLES + kept - 1) / kept, pos = 0;
  for (int r = -WARMUP_ROUNDS; r < rounds; r++)
    for (int j = 0; j < nconfigs; j++) {
      struct config *c = &configs[(j + (r + WARMUP_ROUNDS)) % nconfigs];
      for (int b = 0; b < ROUND_BATCHES; b++) {
        double ns = run_batch(c, pos);
        pos += BATCH;
        if (r >= 0 && b > 0 && c->nsamples < SAMPLES) c->samples[c->nsamples++] = ns;
      }
    }

  int failed = 0;
  for (int i = 0; i < nconfigs; i++) {
    struct config *c = &configs[i];
    double sum = 0;
    for (int k = 0; k < c->nsamples; k++) sum += c->samples[k];
    qsort(c->samples, c->nsamples, sizeof(double), cmp_double);
    summary_calls = -1;
    if (c->tuner && c->tuner->finalize(c->ctx) != 0) {
      fprintf(stderr, "tuner_bench: %s: finalize failed\n", c->label);
      return 1;
    }
    if (c->tuner && c->check != CHECK_NONE && summary_calls != c->calls) {
      fprintf(stderr, "tuner_bench: %s: the summary counts %ld calls of %ld: %s\n", c->label,
              summary_calls, c->calls, summary);
      failed = 1;
    }
    printf("RESULT %s p50=%.1f p99=%.1f mean=%.1f calls=%ld summary_calls=%ld\n", c->label,
           c->samples[c->nsamples / 2], c->samples[c->nsamples * 99 / 100], sum / c->nsamples,
           c->calls, summary_calls);
  }
  return failed;
}
