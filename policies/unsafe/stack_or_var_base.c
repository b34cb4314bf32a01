// expect: pointer_arithmetic
// `|` on a stack pointer whose offset is already variable (fp-16 + 0 or 8). Safe here (the
// variable part is a multiple of 8), but the verifier takes `|` as an add only on a stack
// pointer at a constant offset, the one shape clang emits for `&buf[i]`: a refusal kept on
// purpose.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r2 = *(u32 *)(r1 + 16)\n r2 &= 7\n r4 = *(u32 *)(r1 + 20)\n r4 &= 8\n r1 = 0\n *(u64 *)(r10 - 8) = r1\n *(u64 *)(r10 - 16) = r1\n r3 = r10\n r3 += -16\n r3 += r4");
  asm volatile("r3 |= r2"); /* REJECT */
  asm volatile("r0 = *(u8 *)(r3 + 0)\n r0 &= 1\n exit");
}
