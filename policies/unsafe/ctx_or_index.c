// expect: pointer_arithmetic
// `|` on the context pointer: the context's address is the runtime's, with no alignment the
// verifier may count on (and a variable context offset is refused anyway).
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r2 = *(u32 *)(r1 + 32)\n r2 &= 7");
  asm volatile("r1 |= r2"); /* REJECT */
  asm volatile("r0 = *(u8 *)(r1 + 0)\n exit");
}
