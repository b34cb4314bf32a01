// expect: ok
// Every kind of map an epoch involves, declared with raw ncclbpf_source / ncclbpf_reduce members
// (ncclbpf.h's macros expand to these): policy-object/tests/maps.rs checks what the loader reads.
#include "ncclbpf.h"

struct calls {
  __u64 colls, bytes, cand;
};

/* Agreed before its source: the order of declarations does not matter. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct calls);
  __uint(max_entries, 8);
  __uint(ncclbpf_scope, 2);
  __uint(ncclbpf_source, 1);
  __uint(ncclbpf_reduce, 2);
} calls_max SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct calls);
  __uint(max_entries, 8);
  __uint(ncclbpf_source, 1);
} calls SEC(".maps");

/* Two agreed maps from one source: the default reduction (sum) and min. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct calls);
  __uint(max_entries, 8);
  __uint(ncclbpf_scope, 2);
  __uint(ncclbpf_source, 1);
} calls_sum SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct calls);
  __uint(max_entries, 8);
  __uint(ncclbpf_scope, 2);
  __uint(ncclbpf_source, 1);
  __uint(ncclbpf_reduce, 3);
} calls_min SEC(".maps");

/* The highest source number; a source nobody reads. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 1);
  __uint(ncclbpf_scope, 1);
  __uint(ncclbpf_source, 254);
} spare SEC(".maps");

/* The state map: 8 entries of 32 bytes, all 256 bytes of state[]. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct { __u64 w[4]; });
  __uint(max_entries, 8);
  __uint(ncclbpf_scope, 2);
  __uint(ncclbpf_source, 255);
} state SEC(".maps");

/* Maps without a source keep working as before. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, __u32);
  __uint(max_entries, 2);
  __uint(ncclbpf_scope, 2);
} plain_agreed SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __type(key, __u32);
  __type(value, __u32);
  __uint(max_entries, 2);
} plain_hash SEC(".maps");

__u64 counter;

SEC("tuner") int prog(struct ncclbpf_tuner_ctx *ctx) {
  counter++;
  return 0;
}
