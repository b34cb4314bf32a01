// expect: div_by_zero
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  return 1000 / ctx->nranks; /* REJECT */
}
