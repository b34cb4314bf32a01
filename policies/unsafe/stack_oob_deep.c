// expect: stack_out_of_bounds
#include "ncclbpf.h"
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  asm volatile("r1 = 7\n *(u64 *)(r10 - 520) = r1" ::: "r1"); /* REJECT */
  return 0;
}
