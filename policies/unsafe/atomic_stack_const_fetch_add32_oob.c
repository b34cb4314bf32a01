// expect: stack_out_of_bounds
// A 32-bit atomic_fetch_add changes a spilled 0; the reloaded value then offsets a stack pointer.
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u64 *)(r10 - 8) = r1\n w2 = 200");
  /* w2 = atomic_fetch_add((u32 *)(r10 - 8), w2) */
  asm volatile(".byte 0xc3, 0x2a, 0xf8, 0xff, 0x01, 0x00, 0x00, 0x00");
  asm volatile("r1 = *(u32 *)(r10 - 8)\n r1 &= 0xff\n if r1 == 0 goto .Lout");
  asm volatile("r2 = r10\n r2 += -16\n r2 += r1\n r3 = 0");
  asm volatile("*(u8 *)(r2 + 0) = r3"); /* REJECT */
  asm volatile(".Lout: r0 = 0\n exit");
}
