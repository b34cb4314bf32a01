// A 64-iteration loop with data-dependent branches whose counters only reach the context:
// their values never decide anything, so states that differ only in them prune.
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 m = ctx->msg_size;
  __u32 a = 0, b = 0;
#pragma clang loop unroll(disable)
  for (int i = 0; i < 64; i++) {
    if (m & (1ull << i))
      a += 1;
    else
      b += 2;
    if ((m >> i) & 3)
      a ^= b;
  }
  ctx->nchannels = a;
  ctx->algo = b & 3;
  return 0;
}
