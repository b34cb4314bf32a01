// expect: ctx_variable_offset
// A write at a variable context offset: max_channels (read-only) or algo (writable).
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 *p = &ctx->max_channels;
  p[ctx->nranks & 1] = 1; /* REJECT */
  return 0;
}
