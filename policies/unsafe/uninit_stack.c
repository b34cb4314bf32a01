// expect: uninit_stack
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r0 = *(u64 *)(r10 - 8)\n exit" ::: "r0"); /* REJECT */
  return 0;
}
