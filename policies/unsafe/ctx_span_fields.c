// expect: ctx_out_of_bounds
// An 8-byte read across two 4-byte fields (op, peer_port).
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r0 = *(u64 *)(r1 + 24)"); /* REJECT */
  asm volatile("exit");
}
