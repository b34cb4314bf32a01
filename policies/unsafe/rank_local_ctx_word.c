// expect: rank_local
// A tuner that reads nchannels and usable in one 8-byte load (a memcpy of the pair) and
// decides from the upper half: usable, rank-local.
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u64 pair;
  __builtin_memcpy(&pair, &ctx->nchannels, sizeof pair);
  if ((pair >> 32) & NCCLBPF_USABLE_BIT(NCCL_ALGO_TREE, NCCL_PROTO_LL128))
    ctx->algo = NCCL_ALGO_TREE; /* REJECT */
  return 0;
}
