// expect: pointer_leak
// A subprogram returns a pointer into its own frame, which is gone once it returns.
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) int mk(void) {
  asm volatile("r1 = 5\n *(u64 *)(r10 - 8) = r1\n r0 = r10\n r0 += -8");
  asm volatile("exit"); /* REJECT */
}
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("call mk\n r0 = *(u64 *)(r0 + 0)\n exit");
}
