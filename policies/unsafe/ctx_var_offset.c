// expect: ctx_variable_offset
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 i = ctx->nranks & 3;
  return ((volatile __u32 *)ctx)[4 + i]; /* REJECT */
}
