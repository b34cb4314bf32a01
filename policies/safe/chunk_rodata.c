/* tuner/chunk deciding from the context and .rodata only (what every rank holds alike: the
 * runtime runs it without the communicator's views of agreed and config maps). An agreed
 * array's lookup may be tested: whether an array entry exists depends on the key alone. */
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); NCCLBPF_AGREED; } agreed_seen SEC(".maps");
static const volatile __u64 big_msg = 64ull << 20;
static const volatile __u64 big_chunk = 1ull << 20;
SEC("tuner/chunk")
int chunk_rodata(struct ncclbpf_tuner_chunk_ctx *ctx) {
  __u32 k = 0;
  if (!bpf_map_lookup_elem(&agreed_seen, &k)) return 0;
  if (ctx->proto == NCCL_PROTO_SIMPLE && ctx->msg_size >= big_msg)
    ctx->chunk_size = big_chunk * ctx->nchannels;
  return 0;
}
