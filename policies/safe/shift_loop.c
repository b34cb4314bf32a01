#include "ncclbpf.h"
SEC("net/complete") int prog(struct ncclbpf_net_ctx *ctx) {
  __u64 x = ctx->bytes;
  __u32 bits = 0;
  while (x) {
    x >>= 1;
    bits++;
  }
  return bits;
}
