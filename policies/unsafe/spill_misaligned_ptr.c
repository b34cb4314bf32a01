// expect: pointer_leak
// An 8-byte pointer store at a misaligned stack offset cannot be tracked as a spill: reading the
// bytes back would hand out the address. The store is the violation.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("*(u64 *)(r10 - 12) = r1"); /* REJECT */
  asm volatile("r0 = *(u64 *)(r10 - 12)\n exit");
}
