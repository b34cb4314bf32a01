// expect: uninit_register
#include "ncclbpf.h"
SEC("net/close") int prog(struct ncclbpf_net_ctx *ctx) {
  asm volatile("exit"); /* REJECT */
  return 0;
}
