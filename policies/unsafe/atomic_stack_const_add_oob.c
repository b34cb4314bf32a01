// expect: map_out_of_bounds
// A spilled 0 is changed by an atomic add; the verifier must not keep believing the slot is 0,
// so the branch on the reloaded value reaches the out-of-bounds read.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("r1 = 0\n *(u64 *)(r10 - 16) = r1\n r2 = 64");
  asm volatile("lock *(u64 *)(r10 - 16) += r2");
  asm volatile("r1 = *(u64 *)(r10 - 16)\n r1 &= 0xff\n if r1 == 0 goto .Lout\n r0 += r1");
  asm volatile("r1 = *(u8 *)(r0 + 0)"); /* REJECT */
  asm volatile(".Lout: r0 = 0\n exit");
}
