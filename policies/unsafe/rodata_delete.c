// expect: map_read_only
// bpf_map_delete_elem on the .rodata map (lddw src 1, index 0).
#include "ncclbpf.h"
static const volatile __u32 port = 5201;
SEC("net/close") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r5 = %[p] ll" :: [p] "i"(&port));
  /* r1 = map[0] ll */
  asm volatile(".byte 0x18, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0");
  asm volatile("call 3"); /* REJECT */
  asm volatile("r0 = 0\n exit");
}
