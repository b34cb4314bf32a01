// expect: pointer_leak
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("*(u64 *)(r10 - 8) = r1\n r0 = *(u32 *)(r10 - 8)\n exit" ::: "r0"); /* REJECT */
  return 0;
}
