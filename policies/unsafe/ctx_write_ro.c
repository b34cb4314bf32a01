// expect: ctx_read_only
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  ctx->msg_size = 0; /* REJECT */
  return 0;
}
