// expect: map_out_of_bounds
// xchg stores a new value over a spilled 0 (and returns the 0): the slot is not 0 any more.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("r1 = 0\n *(u64 *)(r10 - 16) = r1\n r1 = 40");
  /* r1 = xchg_64(r10 - 16, r1) */
  asm volatile(".byte 0xdb, 0x1a, 0xf0, 0xff, 0xe1, 0x00, 0x00, 0x00");
  asm volatile("r2 = *(u64 *)(r10 - 16)\n r2 &= 0xff\n if r2 == 0 goto .Lout\n r0 += r2");
  asm volatile("r1 = *(u64 *)(r0 + 0)"); /* REJECT */
  asm volatile(".Lout: r0 = 0\n exit");
}
