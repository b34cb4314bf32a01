/* tuner/chunk: doubles NCCL's chunk for Simple collectives of 64 MiB and more, leaves the rest
 * alone; an LL chunk request under the grain is refused by the runtime (NCCL's chunk kept).
 * Decides from the context only, so every rank computes the same chunk. Tests getChunkSize. */
#include "ncclbpf.h"

SEC("tuner/chunk")
int chunk_double(struct ncclbpf_tuner_chunk_ctx *ctx) {
  if (ctx->proto == NCCL_PROTO_SIMPLE && ctx->msg_size >= (64ull << 20))
    ctx->chunk_size = ctx->chunk_size * 2;
  else if (ctx->proto == NCCL_PROTO_LL)
    ctx->chunk_size = 8; /* below LL's 16-byte grain */
  return 0;
}
