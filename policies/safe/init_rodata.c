/* tuner/init writing a constant from .rodata (comes with the object, the same on every rank;
 * the runtime runs tuner/init without the communicator's views of agreed and config maps). */
#include "ncclbpf.h"
static const volatile __u64 net_ring_simple_latency = 0x402c000000000000ull; /* 14.0 us */
SEC("tuner/init")
int init_rodata(struct ncclbpf_tuner_init_ctx *ctx) {
  ctx->hw_latencies[NCCL_HW_NET][NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = net_ring_simple_latency;
  return 0;
}
