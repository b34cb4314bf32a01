// expect: corrupt_spill
// cmpxchg on a spilled pointer replaces it with a scalar of the program's choice.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 8) = r1\n r0 = r1\n r2 = 0x1000");
  /* r0 = cmpxchg_64(r10 - 8, r0, r2) */
  asm volatile(".byte 0xdb, 0x2a, 0xf8, 0xff, 0xf1, 0x00, 0x00, 0x00"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 8)\n r0 = *(u64 *)(r1 + 0)\n exit");
}
