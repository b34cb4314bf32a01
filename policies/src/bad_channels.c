/* A deliberately bad tuner: every collective on one channel, Ring with the LL protocol. It
 * verifies and is safe; it only makes the job slow, which proves the tuner really steers NCCL.
 * One channel alone costs large messages a third of their bandwidth over our transport (NCCL
 * opens only two NET channels there, bench/results/gpu-2026-12-01-tuner.md); LL, which carries
 * 4 bytes of data in every 8 and is built for small messages, costs them most of the rest (the
 * GPU run measured 81-91% less bus bandwidth from 16 MiB, bench/results/gpu-2026-12-01-badch.md).
 * Never ship it to a real job. */
#include "ncclbpf.h"

SEC("tuner")
int bad_channels(struct ncclbpf_tuner_ctx *ctx) {
  ctx->algo = NCCL_ALGO_RING;
  ctx->proto = NCCL_PROTO_LL;
  ctx->nchannels = 1;
  return 0;
}
