// expect: pointer_arithmetic
// A NULL check on the low 32 bits of a lookup result: a non-NULL pointer can have them all zero.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } arr SEC(".maps");
SEC("net/irecv") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4");
  asm volatile("r1 = %[arr] ll" :: [arr] "i"(&arr));
  asm volatile("call 1");
  asm volatile("if w0 == 0 goto .Lout"); /* REJECT */
  asm volatile("r0 = *(u64 *)(r0 + 0)\n exit\n .Lout: r0 = 0\n exit");
}
