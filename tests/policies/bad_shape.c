/* Live-reload fixture: net_conn_stats with another value size than net_stats' (a map whose
 * shape changed), and a harmless irecv program with a map of its own. The whole reload must be
 * rejected, and reload_fresh never created. */
#include "ncclbpf.h"

struct small { __u64 bytes; __u64 count; };

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __type(key, __u64);
  __type(value, struct small);
  __uint(max_entries, 4096);
} net_conn_stats SEC(".maps");

struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64); __uint(max_entries, 1); } reload_fresh SEC(".maps");

SEC("net/complete")
int small_complete(struct ncclbpf_net_ctx *ctx) {
  __u64 conn = ctx->conn_id;
  struct small *s = bpf_map_lookup_elem(&net_conn_stats, &conn);
  if (s) __sync_fetch_and_add(&s->count, 1);
  return 0;
}

SEC("net/irecv")
int fresh_irecv(struct ncclbpf_net_ctx *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&reload_fresh, &k);
  if (v) __sync_fetch_and_add(v, 1);
  return 0;
}
