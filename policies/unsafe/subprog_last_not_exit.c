// expect: bad_subprog
// A subprogram whose last instruction is an ALU op: it runs on into the next subprogram.
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) int first(void) {
  asm volatile("r0 = 1");
  asm volatile("r0 += 2"); /* REJECT */
}
static __attribute__((noinline, naked, used)) int second(void) {
  asm volatile("r0 = 2\n exit");
}
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("call first\n call second\n r0 = 0\n exit");
}
