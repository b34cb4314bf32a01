/* GPU execution time of every collective, from the profiler: count, total and longest time and
 * bytes per collective type and power-of-two size, in a map that `ncclbpf maps PID` and the
 * exporter read while the job runs. (The plugin's own nccl_collective_duration_seconds has the
 * full histogram; this shows how a policy keeps its own cut of the same events.) */
#include "ncclbpf.h"

struct coll_time {
  __u64 count;
  __u64 total_ns;
  __u64 max_ns;
  __u64 bytes;
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __type(key, __u64); /* coll << 8 | log2(bytes) */
  __type(value, struct coll_time);
  __uint(max_entries, 1024);
} coll_times SEC(".maps");

static __always_inline __u64 log2_u64(__u64 v) {
  __u64 r = 0;
#pragma clang loop unroll(full)
  for (int i = 32; i > 0; i /= 2) {
    if (v >> i) {
      v >>= i;
      r += i;
    }
  }
  return r;
}

SEC("profiler/coll")
int coll_timer(struct ncclbpf_profiler_ctx *ctx) {
  if (!ctx->timed) return 0;
  __u64 key = ((__u64)ctx->coll << 8) | log2_u64(ctx->bytes);
  struct coll_time *t = bpf_map_lookup_elem(&coll_times, &key);
  if (!t) {
    struct coll_time zero = {};
    bpf_map_update_elem(&coll_times, &key, &zero, BPF_NOEXIST);
    t = bpf_map_lookup_elem(&coll_times, &key);
    if (!t) return 0;
  }
  __sync_fetch_and_add(&t->count, 1);
  __sync_fetch_and_add(&t->total_ns, ctx->duration_ns);
  __sync_fetch_and_add(&t->bytes, ctx->bytes);
  if (ctx->duration_ns > t->max_ns) t->max_ns = ctx->duration_ns;
  return 0;
}
