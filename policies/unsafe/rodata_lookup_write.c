// expect: map_read_only
// Looking up the .rodata map through its map pointer gives a value that is still read-only.
#include "ncclbpf.h"
static const volatile __u64 limit = 10;
SEC("net/isend") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r5 = %[lim] ll" :: [lim] "i"(&limit));
  /* r1 = map[0] ll */
  asm volatile(".byte 0x18, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0");
  asm volatile("call 1\n if r0 == 0 goto .Lout\n r1 = 1");
  asm volatile("*(u64 *)(r0 + 0) = r1"); /* REJECT */
  asm volatile(".Lout: r0 = 0\n exit");
}
