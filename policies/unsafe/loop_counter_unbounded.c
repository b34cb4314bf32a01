// expect: unbounded_loop
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 n = ctx->msg_size, s = 0;
  for (volatile __u64 i = 0; i < n; i++)
    s += i; /* REJECT */
  return s;
}
