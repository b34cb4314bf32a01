// expect: invalid_mem_access
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __sync_fetch_and_add(&ctx->nchannels, 1); /* REJECT */
  return 0;
}
