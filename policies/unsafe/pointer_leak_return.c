// expect: pointer_leak
#include "ncclbpf.h"
SEC("net/irecv") long prog(struct ncclbpf_net_ctx *ctx) {
  return (long)ctx; /* REJECT */
}
