/* Staged-reload fixture: every collective on three channels (the base policy of the test uses
 * one), so the decision at which a process switched shows in the channel count. */
#include "ncclbpf.h"

SEC("tuner")
int three_channels(struct ncclbpf_tuner_ctx *ctx) {
  ctx->nchannels = 3;
  return 0;
}
