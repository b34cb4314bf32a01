// expect: pointer_arithmetic
// `|` on a stack pointer at fp-12: only 4-aligned, so `| i` is an add only for i < 4, and the
// verifier takes `|` as an add only at offsets that are multiples of 8.
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r2 = *(u32 *)(r1 + 32)\n r2 &= 3\n r1 = 0\n *(u64 *)(r10 - 16) = r1\n r3 = r10\n r3 += -12");
  asm volatile("r3 |= r2"); /* REJECT */
  asm volatile("r0 = *(u8 *)(r3 + 0)\n exit");
}
