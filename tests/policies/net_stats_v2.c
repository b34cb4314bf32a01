/* Live-reload fixture: net_stats (policies/src/net_stats.c) with the same maps, so a reload
 * keeps their contents, plus two marks of the new version: completions also count under op 0
 * of net_op_counts (net_stats never does), and an isend program (net_stats has none) counts
 * under op 3. */
#include "ncclbpf.h"

struct conn_stats {
  __u64 send_bytes;
  __u64 recv_bytes;
  __u64 sends;
  __u64 recvs;
  __u64 errors;
  __u64 lat_hist[16];
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

static __always_inline void count_op(__u32 op) {
  __u64 *c = bpf_map_lookup_elem(&net_op_counts, &op);
  if (c) __sync_fetch_and_add(c, 1);
}

SEC("net/complete")
int on_complete_v2(struct ncclbpf_net_ctx *ctx) {
  __u32 op = ctx->op;
  count_op(op & 7);
  count_op(0);
  __u64 conn = ctx->conn_id;
  struct conn_stats *s = bpf_map_lookup_elem(&net_conn_stats, &conn);
  if (!s) {
    struct conn_stats zero = {};
    bpf_map_update_elem(&net_conn_stats, &conn, &zero, BPF_NOEXIST);
    s = bpf_map_lookup_elem(&net_conn_stats, &conn);
    if (!s) return 0;
  }
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
  return 0;
}

SEC("net/isend")
int on_isend_v2(struct ncclbpf_net_ctx *ctx) {
  count_op(NCCLBPF_OP_ISEND);
  return 0;
}
