// expect: map_out_of_bounds
// Two paths spill different constants (0 and 1) to the same slot; after the join a branch on the
// filled value decides whether an out-of-bounds read happens. Pruning the second path against
// the first would miss it: the slot's value matters.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r6 = *(u32 *)(r1 + 20)\n r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("r1 = 0\n if r6 > 8 goto .Ljoin\n r1 = 1\n .Ljoin: *(u64 *)(r10 - 16) = r1");
  asm volatile("r2 = *(u64 *)(r10 - 16)\n if r2 == 0 goto .Lout");
  asm volatile("r0 = *(u64 *)(r0 + 8)"); /* REJECT */
  asm volatile("exit\n .Lout: r0 = 0\n exit");
}
