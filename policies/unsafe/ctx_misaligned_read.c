// expect: ctx_out_of_bounds
// A 4-byte read at offset 2, inside msg_size but not at a field (or narrow-load) boundary.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r0 = *(u32 *)(r1 + 2)"); /* REJECT */
  asm volatile("exit");
}
