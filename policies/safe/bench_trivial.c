/* Benchmark: the smallest useful decision (size threshold). */
#include "ncclbpf.h"
SEC("tuner") int bench_trivial(struct ncclbpf_tuner_ctx *ctx) {
  if (ctx->msg_size > 65536) ctx->proto = NCCL_PROTO_SIMPLE;
  return 0;
}
