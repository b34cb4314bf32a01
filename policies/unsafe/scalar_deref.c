// expect: invalid_mem_access
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  return *(volatile __u64 *)(long)ctx->msg_size; /* REJECT */
}
