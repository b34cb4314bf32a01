// expect: corrupt_spill
// A 2-byte store into a spilled map value pointer, then the pointer reloaded and written through.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout\n *(u64 *)(r10 - 16) = r0\n r2 = 0x1000");
  asm volatile("*(u16 *)(r10 - 14) = r2"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 16)\n r2 = 1\n *(u64 *)(r1 + 0) = r2");
  asm volatile(".Lout: r0 = 0\n exit");
}
