// expect: ctx_out_of_bounds
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  return ((volatile __u64 *)ctx)[200]; /* REJECT */
}
