// expect: map_read_only
#include "ncclbpf.h"
static const volatile __u64 limit = 10;
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  *(volatile __u64 *)&limit = ctx->msg_size; /* REJECT */
  return 0;
}
