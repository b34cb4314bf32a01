// expect: corrupt_spill
// atomic_fetch_add on a spilled pointer (raw encoding: clang 14 cannot assemble the fetch forms).
#include "ncclbpf.h"
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 8) = r1\n r2 = 24");
  /* r2 = atomic_fetch_add((u64 *)(r10 - 8), r2) */
  asm volatile(".byte 0xdb, 0x2a, 0xf8, 0xff, 0x01, 0x00, 0x00, 0x00"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 8)\n r0 = *(u64 *)(r1 + 0)\n exit");
}
