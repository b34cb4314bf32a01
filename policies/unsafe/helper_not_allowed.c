// expect: helper_not_allowed
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  if (bpf_ktime_get_ns() & 1) /* REJECT */
    ctx->proto = NCCL_PROTO_SIMPLE;
  return 0;
}
