// expect: corrupt_spill
// An atomic add on a stack slot that holds a spilled context pointer forges a new pointer.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 8) = r1\n r2 = 8");
  asm volatile("lock *(u64 *)(r10 - 8) += r2"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 8)\n r0 = *(u32 *)(r1 + 16)\n exit");
}
