// expect: rank_local
// A tuner that picks Tree/LL128 wherever NCCL's table says it could run it: only the table's
// cheapest entry (nccl_algo, nccl_proto) is the same on every rank, not which others are usable.
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  if (ctx->usable & NCCLBPF_USABLE_BIT(NCCL_ALGO_TREE, NCCL_PROTO_LL128))
    ctx->algo = NCCL_ALGO_TREE; /* REJECT */
  return 0;
}
