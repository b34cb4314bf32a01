// expect: bad_insn
// A 4-byte atomic add at a stack offset that is not 4-byte aligned.
#include "ncclbpf.h"
SEC("net/accept") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u64 *)(r10 - 8) = r1\n w2 = 1");
  asm volatile("lock *(u32 *)(r10 - 6) += w2"); /* REJECT */
  asm volatile("r0 = 0\n exit");
}
