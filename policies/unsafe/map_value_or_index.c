// expect: pointer_arithmetic
// `|` on a map value: values are laid out by the runtime (hash slots, per-CPU copies), not
// 8-aligned by any rule the verifier knows, so the `|` is not an add.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64[2]); __uint(max_entries, 4); } m SEC(".maps");
SEC("net/close") __attribute__((naked)) int prog(void) {
  asm volatile("r6 = *(u32 *)(r1 + 32)\n r6 &= 7\n r1 = 0\n *(u32 *)(r10 - 4) = r1\n r2 = r10\n r2 += -4\n r1 = m ll\n call 1\n if r0 == 0 goto +3");
  asm volatile("r0 |= r6"); /* REJECT */
  asm volatile("r0 = *(u8 *)(r0 + 0)\n exit");
  asm volatile("r0 = 0\n exit");
}
