// expect: bad_insn
// A call with the register-source bit set (opcode 0x8d, "callx"): not an instruction here.
#include "ncclbpf.h"
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r0 = 0\n r2 = 1");
  /* opcode 0x8d, dst r2, imm 1 */
  asm volatile(".byte 0x8d, 0x02, 0, 0, 0x01, 0, 0, 0"); /* REJECT */
  asm volatile("r0 = 0\n exit");
}
