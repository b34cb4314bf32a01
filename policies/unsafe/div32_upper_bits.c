// expect: div_by_zero
// d != 0 as a 64-bit value, but its low 32 bits (the 32-bit divisor) can still be 0.
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 d = ctx->msg_size;
  if (d == 0) return 0;
  ctx->nchannels = ctx->nranks / (__u32)d; /* REJECT */
  return 0;
}
