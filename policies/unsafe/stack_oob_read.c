// expect: stack_out_of_bounds
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  volatile char buf[16];
  buf[0] = 1;
  return buf[ctx->comm_id & 1023]; /* REJECT */
}
