#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 n = ctx->nnodes;
  if (n == 0) return 0;
  __u64 per_node = ctx->msg_size / n;
  __u32 rem = ctx->nranks % n;
  if (per_node > (1 << 20) && rem == 0) ctx->nchannels = 16;
  return 0;
}
