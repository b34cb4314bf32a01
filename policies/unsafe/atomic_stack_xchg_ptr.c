// expect: corrupt_spill
// xchg on a spilled pointer hands the pointer back as a scalar (and the program returns it).
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 8) = r1\n r0 = 0");
  /* r0 = xchg_64(r10 - 8, r0) */
  asm volatile(".byte 0xdb, 0x0a, 0xf8, 0xff, 0xe1, 0x00, 0x00, 0x00"); /* REJECT */
  asm volatile("exit");
}
