// expect: too_large
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile(".rept 5000\n r0 = 0\n .endr" ::: "r0"); /* REJECT */
  return 0;
}
