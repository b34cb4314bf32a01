// expect: map_out_of_bounds
// cmpxchg over a spilled 0 with the expected value 0 stores the new value.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[2]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout\n r6 = r0");
  asm volatile("r1 = 0\n *(u64 *)(r10 - 16) = r1\n r0 = 0\n r2 = 32");
  /* r0 = cmpxchg_64(r10 - 16, r0, r2) */
  asm volatile(".byte 0xdb, 0x2a, 0xf0, 0xff, 0xf1, 0x00, 0x00, 0x00");
  asm volatile("r1 = *(u64 *)(r10 - 16)\n r1 &= 0xff\n if r1 == 0 goto .Lout\n r6 += r1");
  asm volatile("r1 = *(u64 *)(r6 + 0)"); /* REJECT */
  asm volatile(".Lout: r0 = 0\n exit");
}
