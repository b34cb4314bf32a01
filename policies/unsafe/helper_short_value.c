// expect: uninit_stack
#include "ncclbpf.h"
struct pair { __u64 a, b; };
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u32); __type(value, struct pair); __uint(max_entries, 4); } h SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r5 = 0\n *(u32 *)(r10 - 4) = r5\n r1 = 5\n *(u64 *)(r10 - 16) = r1\n r2 = r10\n r2 += -4\n r3 = r10\n r3 += -16\n r1 = %[h] ll\n r4 = 0\n call 2\n r0 = 0\n exit" :: [h] "i"(&h) : "r0", "r1", "r2", "r3", "r4", "r5"); /* REJECT */
  return 0;
}
