// expect: ctx_out_of_bounds
#include "ncclbpf.h"
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  return *(volatile __u32 *)&ctx->reserved; /* REJECT */
}
