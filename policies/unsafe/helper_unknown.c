// expect: unknown_helper
#include "ncclbpf.h"
static long (*bogus)(void) = (void *)9999;
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  return bogus(); /* REJECT */
}
