// expect: stack_out_of_bounds
// An atomic or sets bits in a spilled 0 that then offsets a stack pointer past the frame.
#include "ncclbpf.h"
SEC("net/irecv") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u64 *)(r10 - 8) = r1\n r2 = 0x80");
  asm volatile("lock *(u64 *)(r10 - 8) |= r2");
  asm volatile("r1 = *(u64 *)(r10 - 8)\n r1 &= 0xff\n if r1 == 0 goto .Lout");
  asm volatile("r2 = r10\n r2 += -64\n r2 += r1");
  asm volatile("*(u8 *)(r2 + 0) = r1"); /* REJECT */
  asm volatile(".Lout: r0 = 0\n exit");
}
