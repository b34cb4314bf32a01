// expect: uninit_stack
// An atomic add reads its slot: the slot was never written.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r2 = 1");
  asm volatile("lock *(u64 *)(r10 - 8) += r2"); /* REJECT */
  asm volatile("r0 = *(u64 *)(r10 - 8)\n exit");
}
