// expect: map_out_of_bounds
// x in [2^64-16, 2^64-1] plus 24 wraps to [8, 23]: past the end of an 8-byte value.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r6 = *(u64 *)(r1 + 0)\n r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("r1 = -16\n if r6 < r1 goto .Lout\n r6 += 24\n r0 += r6");
  asm volatile("r0 = *(u8 *)(r0 + 0)"); /* REJECT */
  asm volatile("exit\n .Lout: r0 = 0\n exit");
}
