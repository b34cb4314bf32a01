// expect: corrupt_spill
// A 32-bit atomic add on the low half of a spilled pointer.
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 16) = r1\n w2 = 4096");
  asm volatile("lock *(u32 *)(r10 - 16) += w2"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 16)\n r0 = *(u64 *)(r1 + 0)\n exit");
}
