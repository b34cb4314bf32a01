// expect: pointer_arithmetic
#include "ncclbpf.h"
SEC("net/accept") int prog(struct ncclbpf_net_ctx *ctx) {
  asm volatile("w1 += 8\n r0 = 0\n exit" ::: "r0", "r1"); /* REJECT */
  return 0;
}
