// expect: map_read_only
// An atomic add on a read-only global.
#include "ncclbpf.h"
static const volatile __u64 budget = 100;
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  __sync_fetch_and_add((__u64 *)&budget, 1); /* REJECT */
  return 0;
}
