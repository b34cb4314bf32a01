// expect: corrupt_spill
// An atomic xor (fetch form) on a spilled map value pointer.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/irecv") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1\n if r0 == 0 goto .Lout\n *(u64 *)(r10 - 16) = r0\n r2 = 64");
  /* r2 = atomic_fetch_xor((u64 *)(r10 - 16), r2) */
  asm volatile(".byte 0xdb, 0x2a, 0xf0, 0xff, 0xa1, 0x00, 0x00, 0x00"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 16)\n r0 = *(u64 *)(r1 + 0)\n .Lout: r0 = 0\n exit");
}
