// expect: pointer_leak
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("*(u64 *)(r1 + 40) = r1" ::: ); /* REJECT */
  return 0;
}
