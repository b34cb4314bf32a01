// expect: ctx_out_of_bounds
// An 8-byte load at `reserved` (bytes 52..60) runs 4 bytes past the 56-byte net context (and
// is misaligned).
#include "ncclbpf.h"
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("r0 = *(u64 *)(r1 + 52)"); /* REJECT */
  asm volatile("exit");
}
