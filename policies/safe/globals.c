#include "ncclbpf.h"
static const volatile __u64 small_limit = 8192;
static volatile __u64 calls;
static volatile __u64 last_size = 1;
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __sync_fetch_and_add((__u64 *)&calls, 1);
  last_size = ctx->msg_size;
  if (ctx->msg_size < small_limit) ctx->proto = NCCL_PROTO_LL;
  return 0;
}
