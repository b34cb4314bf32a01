// expect: corrupt_spill
// The upper half of a spilled pointer overwritten, then the lower half (the address bits) read.
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 8) = r1\n w2 = 0");
  asm volatile("*(u32 *)(r10 - 4) = w2"); /* REJECT */
  asm volatile("r0 = *(u32 *)(r10 - 8)\n exit");
}
