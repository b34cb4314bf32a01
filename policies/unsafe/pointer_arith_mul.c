// expect: pointer_arithmetic
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r1 *= 3\n r0 = 0\n exit" ::: "r0", "r1"); /* REJECT */
  return 0;
}
