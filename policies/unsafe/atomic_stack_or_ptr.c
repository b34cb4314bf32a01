// expect: corrupt_spill
// An atomic or on a spilled pointer sets address bits.
#include "ncclbpf.h"
SEC("net/connect") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 24) = r1\n r2 = 0x100");
  asm volatile("lock *(u64 *)(r10 - 24) |= r2"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 24)\n r0 = *(u64 *)(r1 + 8)\n exit");
}
