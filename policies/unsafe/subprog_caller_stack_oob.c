// expect: stack_out_of_bounds
// The callee reads one element past the caller's two-element stack array.
#include "ncclbpf.h"
static __attribute__((noinline)) __u64 third(volatile __u64 *p) {
  return p[2]; /* REJECT */
}
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  volatile __u64 buf[2];
  buf[0] = ctx->msg_size;
  buf[1] = ctx->comm_id;
  return third(buf) & 1;
}
