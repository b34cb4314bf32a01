/* tuner/init writing one good and three bad constants: the runtime takes 2.0 and keeps NCCL's
 * values for NaN, a negative latency and an absurd bandwidth (tests the range check). */
#include "ncclbpf.h"

SEC("tuner/init")
int init_bad_values(struct ncclbpf_tuner_init_ctx *ctx) {
  ctx->base_latencies[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = NCCLBPF_F64(2.0);
  ctx->base_latencies[NCCL_ALGO_TREE][NCCL_PROTO_LL] = 0x7ff8000000000000ull; /* NaN */
  ctx->hw_latencies[NCCL_HW_NET][NCCL_ALGO_RING][NCCL_PROTO_LL] = NCCLBPF_F64(-1.0);
  ctx->ll_max_bws[2][0] = NCCLBPF_F64(1e9);
  return 0;
}
