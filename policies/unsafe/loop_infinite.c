// expect: unbounded_loop
#include "ncclbpf.h"
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  asm volatile("r0 = 0\n r1 = 1\n if r1 != 0 goto -2\n exit" ::: "r0", "r1"); /* REJECT */
  return 0;
}
