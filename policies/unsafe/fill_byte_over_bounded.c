// expect: map_out_of_bounds
// A spilled index in [0, 3] has its low byte overwritten by an unknown byte: the fill is not
// the spilled register any more, whatever its bounds were.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[4]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r6 = *(u32 *)(r1 + 20)\n r7 = r6\n r7 &= 3\n *(u64 *)(r10 - 16) = r7");
  asm volatile("*(u8 *)(r10 - 16) = w6");
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("r1 = *(u64 *)(r10 - 16)\n r1 &= 0xff\n r1 <<= 3\n r0 += r1");
  asm volatile("r0 = *(u64 *)(r0 + 0)"); /* REJECT */
  asm volatile("exit\n .Lout: r0 = 0\n exit");
}
