// expect: corrupt_spill
// One byte of a spilled context pointer overwritten, then the pointer reloaded and dereferenced.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 8) = r1");
  /* *(u8 *)(r10 - 8) = 0x40 (clang 14 cannot assemble ST with an immediate) */
  asm volatile(".byte 0x72, 0x0a, 0xf8, 0xff, 0x40, 0, 0, 0"); /* REJECT */
  asm volatile("r1 = *(u64 *)(r10 - 8)\n r0 = *(u64 *)(r1 + 0)\n exit");
}
