// expect: corrupt_spill
// 32-bit xchg on a spilled pointer returns its low half as a scalar.
#include "ncclbpf.h"
SEC("net/irecv") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 32) = r1\n w0 = 0");
  /* w0 = xchg32_32(r10 - 32, w0) */
  asm volatile(".byte 0xc3, 0x0a, 0xe0, 0xff, 0xe1, 0x00, 0x00, 0x00"); /* REJECT */
  asm volatile("exit");
}
