/* Traffic per connection and per communicator, from the net hooks: bytes and completed
 * operations each way, and failures. `ncclbpf maps PID` (or the exporter) reads both maps while
 * the job runs. Connections are forgotten when they close; communicators are kept. */
#include "ncclbpf.h"

struct traffic {
  __u64 send_bytes;
  __u64 recv_bytes;
  __u64 sends;
  __u64 recvs;
  __u64 errors;
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __type(key, __u64); /* conn_id */
  __type(value, struct traffic);
  __uint(max_entries, 4096);
} conn_traffic SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __type(key, __u64); /* comm_id (0: NCCL gave none, net ABI before v11) */
  __type(value, struct traffic);
  __uint(max_entries, 1024);
} comm_traffic SEC(".maps");

static __always_inline struct traffic *entry(void *map, __u64 *key) {
  struct traffic *t = bpf_map_lookup_elem(map, key);
  if (t) return t;
  struct traffic zero = {};
  bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
  return bpf_map_lookup_elem(map, key);
}

static __always_inline void count(struct traffic *t, struct ncclbpf_net_ctx *ctx) {
  if (ctx->status) {
    __sync_fetch_and_add(&t->errors, 1);
  } else if (ctx->op == NCCLBPF_OP_COMPLETE_SEND) {
    __sync_fetch_and_add(&t->send_bytes, ctx->bytes);
    __sync_fetch_and_add(&t->sends, 1);
  } else {
    __sync_fetch_and_add(&t->recv_bytes, ctx->bytes);
    __sync_fetch_and_add(&t->recvs, 1);
  }
}

SEC("net/complete")
int conn_counter_complete(struct ncclbpf_net_ctx *ctx) {
  __u64 conn = ctx->conn_id, comm = ctx->comm_id;
  struct traffic *t = entry(&conn_traffic, &conn);
  if (t) count(t, ctx);
  t = entry(&comm_traffic, &comm);
  if (t) count(t, ctx);
  return 0;
}

SEC("net/close")
int conn_counter_close(struct ncclbpf_net_ctx *ctx) {
  __u64 conn = ctx->conn_id;
  bpf_map_delete_elem(&conn_traffic, &conn);
  return 0;
}
