// expect: bad_subprog
// A subprogram ending in a conditional jump: its not-taken side falls into the next subprogram.
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) int first(void) {
  asm volatile("r0 = 0\n .Lagain: r0 += 1");
  asm volatile("if r0 < 3 goto .Lagain"); /* REJECT */
}
static __attribute__((noinline, naked, used)) int second(void) {
  asm volatile("r0 = 2\n exit");
}
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("call first\n call second\n r0 = 0\n exit");
}
