// expect: div_by_zero
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  ctx->nchannels = ctx->msg_size % ctx->nnodes; /* REJECT */
  return 0;
}
