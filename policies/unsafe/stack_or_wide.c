// expect: pointer_arithmetic
// `&buf[i]` written as `|` with i < 16 on an 8-aligned buffer: bit 3 of i may meet a set bit
// of the address, so the `|` is not an add.
#include "ncclbpf.h"
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("r2 = *(u32 *)(r1 + 36)\n r2 &= 15\n r1 = 0\n *(u64 *)(r10 - 8) = r1\n *(u64 *)(r10 - 16) = r1\n r3 = r10\n r3 += -16");
  asm volatile("r3 |= r2"); /* REJECT */
  asm volatile("r0 = *(u8 *)(r3 + 0)\n exit");
}
