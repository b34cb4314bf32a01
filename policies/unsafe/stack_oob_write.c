// expect: stack_out_of_bounds
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r1 = 7\n *(u64 *)(r10 + 8) = r1" ::: "r1"); /* REJECT */
  return 0;
}
