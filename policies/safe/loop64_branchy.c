// A 64-iteration loop with a data-dependent branch in its body (2^64 paths, one loop).
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 a = 0, b = 0;
  for (int i = 0; i < 64; i++) {
    if (ctx->msg_size & (1ull << (i & 31)))
      a++;
    else
      b += 2;
  }
  ctx->nchannels = a > b ? 2 : 1;
  return 0;
}
