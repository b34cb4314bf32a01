// expect: uninit_register
// A subprogram returns a pointer into its own frame, which is gone once it returns: r0 dies
// at the callee's exit, and the caller's load through it is refused.
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) int mk(void) {
  asm volatile("r1 = 5\n *(u64 *)(r10 - 8) = r1\n r0 = r10\n r0 += -8");
  asm volatile("exit");
}
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("call mk");
  asm volatile("r0 = *(u64 *)(r0 + 0)"); /* REJECT */
  asm volatile("exit");
}
