// expect: div_by_zero
// 32-bit modulo by a register whose 64-bit value was tested, not its low half.
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r2 = *(u64 *)(r1 + 8)\n r0 = *(u32 *)(r1 + 28)\n if r2 == 0 goto .Lout");
  /* w0 %= w2 (raw: the assemblers take no 32-bit mod) */
  asm volatile(".byte 0x9c, 0x20, 0, 0, 0, 0, 0, 0"); /* REJECT */
  asm volatile(".Lout: exit");
}
