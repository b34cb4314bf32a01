// expect: div_by_zero
// requires: v4
// Signed division (sdiv) by a value that may be 0.
#include "ncclbpf.h"
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  long a = (long)ctx->latency_ns, b = ctx->status;
  return (a / b) & 1; /* REJECT */
}
