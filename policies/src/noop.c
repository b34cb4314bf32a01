/* The tuner without an opinion: leaves algorithm, protocol and channels to NCCL. A baseline for
 * what running a policy costs (BENCHMARKS.md), and a template. */
#include "ncclbpf.h"

SEC("tuner")
int noop(struct ncclbpf_tuner_ctx *ctx) {
  (void)ctx;
  return 0;
}
