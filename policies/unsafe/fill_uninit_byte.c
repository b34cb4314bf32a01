// expect: uninit_stack
// One byte written, a 2-byte fill over it and the next (unwritten) byte.
#include "ncclbpf.h"
SEC("net/irecv") __attribute__((naked)) int prog(void) {
  asm volatile("w2 = 7\n *(u8 *)(r10 - 16) = w2");
  asm volatile("r0 = *(u16 *)(r10 - 16)"); /* REJECT */
  asm volatile("exit");
}
