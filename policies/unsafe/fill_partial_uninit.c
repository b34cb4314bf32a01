// expect: uninit_stack
// Four bytes written, eight read: the upper half of the slot was never written.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("w2 = 7\n *(u32 *)(r10 - 8) = w2");
  asm volatile("r0 = *(u64 *)(r10 - 8)"); /* REJECT */
  asm volatile("exit");
}
