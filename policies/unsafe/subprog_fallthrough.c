// expect: bad_subprog
// The main program has no exit before its callee's first instruction: it falls into the callee.
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) int sub(void) {
  asm volatile("r0 = 1\n exit");
}
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("call sub");
  asm volatile("r0 += 1"); /* REJECT */
}
