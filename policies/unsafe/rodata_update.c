// expect: map_read_only
// bpf_map_update_elem on the .rodata map itself: lddw src 1 (map pointer, not a value pointer)
// with index 0, the object's only map. Raw encoding: no relocation produces it.
#include "ncclbpf.h"
static const volatile __u64 limit = 10;
SEC("tuner") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r1 = 99\n *(u64 *)(r10 - 16) = r1");
  asm volatile("r2 = r10\n r2 += -4\n r3 = r10\n r3 += -16\n r4 = 0");
  asm volatile("r5 = %[lim] ll" :: [lim] "i"(&limit));
  /* r1 = map[0] ll */
  asm volatile(".byte 0x18, 0x01 | (1 << 4), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0");
  asm volatile("call 2"); /* REJECT */
  asm volatile("r0 = 0\n exit");
}
