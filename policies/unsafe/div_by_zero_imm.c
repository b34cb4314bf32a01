// expect: div_by_zero
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r0 = 5\n r0 /= 0\n exit" ::: "r0"); /* REJECT */
  return 0;
}
