// expect: jump_out_of_range
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("goto +100"); /* REJECT */
  return 0;
}
