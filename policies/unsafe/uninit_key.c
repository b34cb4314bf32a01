// expect: uninit_stack
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64); __uint(max_entries, 16); } h SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r5 = 1\n *(u32 *)(r10 - 8) = r5\n r2 = r10\n r2 += -8\n r1 = %[h] ll\n call 1\n r0 = 0\n exit" :: [h] "i"(&h) : "r0", "r1", "r2", "r3", "r4", "r5"); /* REJECT */
  return 0;
}
