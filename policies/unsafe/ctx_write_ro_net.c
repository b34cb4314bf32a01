// expect: ctx_read_only
#include "ncclbpf.h"
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  ctx->status = 0; /* REJECT */
  return 0;
}
