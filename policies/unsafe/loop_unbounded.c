// expect: unbounded_loop
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 s = 0;
  while (*(volatile __u32 *)&ctx->nchannels != 0) /* REJECT */
    s++;
  return s;
}
