// expect: pointer_leak
// A subprogram stores a pointer to its own frame into the caller's stack.
#include "ncclbpf.h"
static __attribute__((noinline, naked, used)) int keep(void) {
  asm volatile("r2 = r10\n r2 += -8\n *(u64 *)(r10 - 8) = r2");
  asm volatile("*(u64 *)(r1 + 0) = r2"); /* REJECT */
  asm volatile("r0 = 0\n exit");
}
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = r10\n r1 += -8\n call keep\n r1 = *(u64 *)(r10 - 8)\n r0 = *(u64 *)(r1 + 0)\n exit");
}
