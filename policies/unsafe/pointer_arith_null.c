// expect: pointer_arithmetic
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[2]); __uint(max_entries, 4); } arr SEC(".maps");
SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  asm volatile("r5 = 0\n *(u32 *)(r10 - 4) = r5\n r2 = r10\n r2 += -4\n r1 = %[m] ll\n call 1\n r0 += 8\n if r0 == 0 goto +1\n r0 = *(u64 *)(r0 + 0)\n r0 = 0\n exit" :: [m] "i"(&arr) : "r0", "r1", "r2", "r3", "r4", "r5"); /* REJECT */
  return 0;
}
