// expect: rank_local
// Writable globals (.bss) belong to this process: a tuner may keep counters there but not
// decide from them.
#include "ncclbpf.h"
static volatile __u64 calls;
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 n = calls;
  calls = n + 1;
  ctx->nchannels = (n & 1) + 1; /* REJECT */
  return 0;
}
