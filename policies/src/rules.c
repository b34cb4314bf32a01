/* NCCL's tuner rules: the CSV file of NCCL's example tuner (nccl_tuner.conf), applied as that
 * tuner applies it. The tuner parses NCCL_TUNER_CONFIG_FILE (else ./nccl_tuner.conf) strictly
 * and writes the rules into tuner_rules, in file order, before the first decision
 * (tuner/src/rules.rs). The first rule that matches the collective (its type, min_bytes <= size
 * <= max_bytes, and nnodes, nranks, num_pipe_ops each equal or -1) decides algorithm, protocol
 * and, unless the rule says -1, the channel count. No match, or an empty table: no opinion, NCCL
 * keeps its own choice. Rules on regBuff are never installed (it is rank-local: see rules.rs),
 * and the table is config, the same on every rank. */
#include "ncclbpf.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __type(key, __u32);
  __type(value, struct ncclbpf_tuner_rule);
  __uint(max_entries, NCCLBPF_TUNER_RULES_MAX);
  NCCLBPF_CONFIG;
} tuner_rules SEC(".maps");

/* Non-zero when `have` differs from `want`, unless want is -1 (any). Computed without a branch:
 * the verifier follows every iteration of the loop below, and each branch in its body is paid
 * for NCCLBPF_TUNER_RULES_MAX times at load. */
static __always_inline __u32 differs(__s32 want, __u32 have) {
  __u32 w = want, plus1 = w + 1;                        /* 0 exactly when want == -1 */
  __u32 exact = 0u - ((plus1 | (0u - plus1)) >> 31);    /* all ones unless want == -1 */
  return (w ^ have) & exact;
}

SEC("tuner")
int rules(struct ncclbpf_tuner_ctx *ctx) {
  __u64 n = ctx->msg_size;
  __u32 coll = ctx->coll_type, nnodes = ctx->nnodes, nranks = ctx->nranks;
  __u32 pipe_ops = ctx->num_pipe_ops;
  /* The bound is hidden from the optimizer so that clang keeps the `i < limit` test instead of
   * rewriting it into an `i == NCCLBPF_TUNER_RULES_MAX` exit: our verifier follows either with
   * the constant, but PREVAIL (the differential oracle) bounds only the `<` form. */
  __u64 limit = NCCLBPF_TUNER_RULES_MAX;
  asm volatile("" : "+r"(limit));
#pragma clang loop unroll(disable)
  for (__u64 i = 0; i < limit; i++) {
    __u32 key = i;
    struct ncclbpf_tuner_rule *r = bpf_map_lookup_elem(&tuner_rules, &key);
    if (!r || !r->valid) break; /* the end of the table */
    if (n < r->min_bytes || n > r->max_bytes) continue;
    if ((r->coll ^ coll) | differs(r->nnodes, nnodes) | differs(r->nranks, nranks) |
        differs(r->num_pipe_ops, pipe_ops))
      continue;
    ctx->algo = r->algo;
    ctx->proto = r->proto;
    if (r->channels > 0) ctx->nchannels = r->channels; /* -1: NCCL's channel count */
    return 1;
  }
  return 0;
}
