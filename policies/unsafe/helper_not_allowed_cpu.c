// expect: helper_not_allowed
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  ctx->nchannels = bpf_get_smp_processor_id(); /* REJECT */
  return 0;
}
