/* The same cost model on every rank. NCCL hands tuners its cost-model constants at init; it
 * then picks rows of them by what each rank sees of its own host: the CPU vendor selects the
 * row of llMaxBws for multi-node communicators (Intel row 0, AMD row 1), and POWER CPUs get
 * Tree/Simple's PCI latency set to Ring's. Ranks on different hosts then estimate different
 * costs for the same collective and can pick different algorithms: a hang (NCCL issue #1136).
 * This program makes those host-dependent entries equal, so every rank computes the same
 * costs whatever its CPU: the multi-node LL bandwidths of the Intel and AMD rows both take the
 * lower (AMD) values, and PCI Tree/Simple latency is Ring/Simple's everywhere. (NCCL's network
 * post overhead also depends on the CPU vendor and is not one of these constants: set
 * NCCL_NET_OVERHEAD to one value on every rank as well.) */
#include "ncclbpf.h"

SEC("tuner/init")
int uniform_constants(struct ncclbpf_tuner_init_ctx *ctx) {
  /* llMaxBws[row][scale]: scale 1 = 2 nodes, 2 = 4+ nodes (single-node rows are by GPU). */
  ctx->ll_max_bws[0][1] = NCCLBPF_F64(22.5);
  ctx->ll_max_bws[1][1] = NCCLBPF_F64(22.5);
  ctx->ll_max_bws[0][2] = NCCLBPF_F64(19.0);
  ctx->ll_max_bws[1][2] = NCCLBPF_F64(19.0);
  ctx->hw_latencies[NCCL_HW_PCI][NCCL_ALGO_TREE][NCCL_PROTO_SIMPLE] = NCCLBPF_F64(5.7);
  ctx->hw_latencies[NCCL_HW_PCI][NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = NCCLBPF_F64(5.7);
  return 0;
}
