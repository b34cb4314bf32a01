// expect: uninit_register
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r0 = r3\n exit" ::: "r0"); /* REJECT */
  return 0;
}
