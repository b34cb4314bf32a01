// expect: rank_local
// A tuner that copies its context (a struct copy: clang copies it in 8-byte words) and hands
// the copy to a helper function that decides from it: the word at nchannels also carries
// usable, rank-local.
#include "ncclbpf.h"
static __attribute__((noinline)) void decide(struct ncclbpf_tuner_ctx *out, const struct ncclbpf_tuner_ctx *c) {
  if (c->usable & NCCLBPF_USABLE_BIT(NCCL_ALGO_TREE, NCCL_PROTO_LL128))
    out->algo = NCCL_ALGO_TREE; /* REJECT */
}
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  struct ncclbpf_tuner_ctx copy = *ctx;
  decide(ctx, &copy);
  return 0;
}
