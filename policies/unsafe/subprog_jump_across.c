// expect: bad_subprog
// A jump from one subprogram into the middle of another (skipping its frame set-up).
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) int first(void) {
  asm volatile("r0 = 1");
  asm volatile("if r1 != 0 goto .Linside"); /* REJECT */
  asm volatile("exit");
}
static __attribute__((noinline, naked, used)) int second(void) {
  asm volatile("r0 = 2\n *(u64 *)(r10 - 8) = r0");
  asm volatile(".Linside: r0 += 1\n exit");
}
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("call first\n call second\n r0 = 0\n exit");
}
