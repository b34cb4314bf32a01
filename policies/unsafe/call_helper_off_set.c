// expect: bad_insn
// A helper call with a nonzero offset field.
#include "ncclbpf.h"
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("r0 = 0");
  /* opcode 0x85, off 4, imm 8 (bpf_get_smp_processor_id) */
  asm volatile(".byte 0x85, 0x00, 0x04, 0x00, 0x08, 0, 0, 0"); /* REJECT */
  asm volatile("exit");
}
