// expect: unbounded_access
// A 32-bit bound (if w1 > 7) says nothing about bit 32: the 64-bit offset can be 4 GiB,
// too large to add to a map value pointer.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r6 = *(u64 *)(r1 + 8)\n r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("r1 = 0x100000007 ll\n r6 &= r1\n if w6 > 7 goto .Lout");
  asm volatile("r0 += r6"); /* REJECT */
  asm volatile("r0 = *(u8 *)(r0 + 0)");
  asm volatile("exit\n .Lout: r0 = 0\n exit");
}
