// expect: map_out_of_bounds
// The offset comes through a stack spill from one of two paths (0 or 16); the 16 path is out of
// bounds for a 16-byte value.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[2]); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("r6 = *(u64 *)(r1 + 8)\n r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = 0\n if r6 > 4096 goto .Ljoin\n r1 = 16\n .Ljoin: *(u64 *)(r10 - 16) = r1");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("r2 = *(u64 *)(r10 - 16)\n r0 += r2");
  asm volatile("r0 = *(u64 *)(r0 + 0)"); /* REJECT */
  asm volatile("exit\n .Lout: r0 = 0\n exit");
}
