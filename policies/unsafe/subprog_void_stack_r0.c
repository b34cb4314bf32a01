// expect: uninit_register
// A void subprogram leaves a pointer into its own stack in r0 (its last use of r0 as scratch);
// the caller stores through it after the call: the callee's frame is gone by then.
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) void fill(void) {
  asm volatile("r0 = r10\n r0 += -16\n r2 = 7\n *(u64 *)(r0 + 0) = r2\n *(u64 *)(r0 + 8) = r2");
  asm volatile("exit");
}
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("call fill\n r1 = 1");
  asm volatile("*(u64 *)(r0 + 8) = r1"); /* REJECT */
  asm volatile("r0 = 0\n exit");
}
