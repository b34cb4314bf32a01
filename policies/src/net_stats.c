/* Net accounting: bytes, messages and a log2 latency histogram per connection, plus
 * per-operation totals. Feeds Prometheus metrics and counter-aware tuner policies. */
#include "ncclbpf.h"

struct conn_stats {
  __u64 send_bytes;
  __u64 recv_bytes;
  __u64 sends;
  __u64 recvs;
  __u64 errors;
  __u64 lat_hist[16]; /* completions by log2(latency in µs), last bucket open-ended */
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __type(key, __u64);
  __type(value, struct conn_stats);
  __uint(max_entries, 4096);
} net_conn_stats SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __type(key, __u32);
  __type(value, __u64);
  __uint(max_entries, 8);
} net_op_counts SEC(".maps");

static __always_inline struct conn_stats *stats_for(__u64 conn) {
  struct conn_stats *s = bpf_map_lookup_elem(&net_conn_stats, &conn);
  if (s) return s;
  struct conn_stats zero = {};
  bpf_map_update_elem(&net_conn_stats, &conn, &zero, BPF_NOEXIST);
  return bpf_map_lookup_elem(&net_conn_stats, &conn);
}

static __always_inline void count_op(__u32 op) {
  __u64 *c = bpf_map_lookup_elem(&net_op_counts, &op);
  if (c) __sync_fetch_and_add(c, 1);
}

SEC("net/complete")
int on_complete(struct ncclbpf_net_ctx *ctx) {
  __u32 op = ctx->op;
  count_op(op & 7);
  struct conn_stats *s = stats_for(ctx->conn_id);
  if (!s) return 0;
  if (ctx->status) {
    __sync_fetch_and_add(&s->errors, 1);
    return 0;
  }
  if (op == NCCLBPF_OP_COMPLETE_SEND) {
    __sync_fetch_and_add(&s->send_bytes, ctx->bytes);
    __sync_fetch_and_add(&s->sends, 1);
  } else {
    __sync_fetch_and_add(&s->recv_bytes, ctx->bytes);
    __sync_fetch_and_add(&s->recvs, 1);
  }
  __u64 us = ctx->latency_ns / 1000;
  __u32 b = 0;
#pragma clang loop unroll(disable)
  for (int i = 0; i < 15; i++) {
    if (us < 2) break;
    us >>= 1;
    b++;
  }
  __sync_fetch_and_add(&s->lat_hist[b & 15], 1);
  return 0;
}

SEC("net/close")
int on_close(struct ncclbpf_net_ctx *ctx) {
  __u64 conn = ctx->conn_id;
  count_op(NCCLBPF_OP_CLOSE);
  bpf_map_delete_elem(&net_conn_stats, &conn);
  return 0;
}
