// expect: corrupt_spill
// A 32-bit atomic and clears the low bits of a spilled pointer.
#include "ncclbpf.h"
SEC("net/accept") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 8) = r1\n w2 = -4096");
  asm volatile("lock *(u32 *)(r10 - 8) &= w2"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 8)\n r0 = *(u64 *)(r1 + 0)\n exit");
}
