// expect: pointer_arithmetic
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r0 = 0\n if r1 > 4096 goto +1\n r0 = 1\n exit" ::: "r0"); /* REJECT */
  return 0;
}
