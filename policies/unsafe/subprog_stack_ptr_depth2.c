// expect: uninit_register
// At call depth 2, the innermost subprogram returns a pointer into its own stack (offset by
// the index its caller passed); the middle frame passes it to a map lookup as the key.
#include "ncclbpf.h"
struct { __uint(type, BPF_MAP_TYPE_HASH); __type(key, __u64); __type(value, __u64); __uint(max_entries, 8); } m SEC(".maps");
static __attribute__((noinline, naked, used)) __u64 *inner(void) {
  asm volatile("r2 = 0\n *(u64 *)(r10 - 8) = r2\n *(u64 *)(r10 - 16) = r2\n r1 &= 8\n r0 = r10\n r0 += -16\n r0 += r1");
  asm volatile("exit");
}
static __attribute__((noinline, naked, used)) __u64 middle(void) {
  asm volatile("call inner\n r1 = 0 ll");
  asm volatile("r2 = r0\n call 1"); /* REJECT */
  asm volatile("r0 = 0\n exit");
}
SEC("net/complete") __attribute__((naked)) int prog(void) {
  asm volatile("r1 = 8\n call middle\n r0 = 0\n exit");
}
