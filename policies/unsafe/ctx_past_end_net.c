// expect: ctx_out_of_bounds
// The word after the net context's last field (`reserved`, bytes 52..56): outside the context.
#include "ncclbpf.h"
SEC("net/isend") int prog(struct ncclbpf_net_ctx *ctx) {
  return ((volatile __u32 *)ctx)[14]; /* REJECT */
}
