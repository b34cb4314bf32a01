// expect: bad_helper_arg
#include "ncclbpf.h"
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __u32 k = 0;
  return bpf_map_lookup_elem(ctx, &k) != 0; /* REJECT */
}
