// expect: bad_insn
// A helper call (bpf_map_lookup_elem, src 0) with a nonzero dst register field.
#include "ncclbpf.h"
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r0 = 0");
  /* opcode 0x85, dst r3, imm 5 (bpf_ktime_get_ns) */
  asm volatile(".byte 0x85, 0x03, 0, 0, 0x05, 0, 0, 0"); /* REJECT */
  asm volatile("exit");
}
