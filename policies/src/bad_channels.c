/* A deliberately bad tuner: every collective on one channel. It verifies and is safe; it only
 * makes the job slow, which proves the tuner really steers NCCL (the GPU run expects bus
 * bandwidth to drop by most of it). Never ship it to a real job. */
#include "ncclbpf.h"

SEC("tuner")
int bad_channels(struct ncclbpf_tuner_ctx *ctx) {
  ctx->nchannels = 1;
  return 0;
}
