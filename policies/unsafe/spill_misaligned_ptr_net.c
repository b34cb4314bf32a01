// expect: pointer_leak
// A map value pointer stored across two stack slots (fp-21 .. fp-14), read back as an aligned word.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u64 *)(r10 - 8) = r1\n *(u64 *)(r10 - 16) = r1\n *(u64 *)(r10 - 24) = r1");
  asm volatile("r2 = r10\n r2 += -8");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout");
  asm volatile("*(u64 *)(r10 - 21) = r0"); /* REJECT */
  asm volatile("r0 = *(u64 *)(r10 - 16)\n exit");
  asm volatile(".Lout: r0 = 0\n exit");
}
