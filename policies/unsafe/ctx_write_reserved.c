// expect: ctx_read_only
// `reserved` is readable (the runtime fills it with 0) but, like every net field, not writable.
#include "ncclbpf.h"
SEC("net/close") int prog(struct ncclbpf_net_ctx *ctx) {
  ctx->reserved = 1; /* REJECT */
  return 0;
}
