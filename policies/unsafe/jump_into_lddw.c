// expect: jump_into_lddw
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r0 = 0\n if r0 == 0 goto +1\n r1 = 0x1234567890 ll\n r0 = 0\n exit" ::: "r0", "r1"); /* REJECT */
  return 0;
}
