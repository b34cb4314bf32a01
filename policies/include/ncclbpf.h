/* ncclbpf.h: the one header a policy includes.
 *
 * A policy is restricted C compiled with
 *     clang -O2 -g -target bpf -mcpu=v3 -I policies/include -c policy.c -o policy.o
 * Each program sits in a section that names its hook: SEC("tuner"), SEC("net/isend"), ...
 * Programs are verified before they run: every map lookup must be NULL-checked, context fields
 * are read (or written, where allowed) at their exact offsets, loops must be bounded, and only
 * the helpers listed for a hook may be called.
 */
#ifndef NCCLBPF_H
#define NCCLBPF_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* libbpf-style BTF map definitions:
 *   struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64);
 *            __uint(max_entries, 16); } my_map SEC(".maps");                               */
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]

/* Map types (kernel numbering). */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6

/* Map scope: who may change a map, and so whether every rank of a communicator holds the same.
 * A tuner program (SEC("tuner"), "tuner/chunk", "tuner/init"; "tuner/epoch" for its state)
 * must decide the same on every rank, or the job hangs; the verifier rejects one whose
 * decision (a context field it writes) could depend on a rank-local value, directly, through
 * the stack, a lookup key or a branch.
 *   (default)       rank-local: programs write it (net hooks count into it); per-CPU maps and
 *                   writable globals (.data, .bss) are always rank-local. Tuner programs may
 *                   keep their own counters here, but not decide from them.
 *   NCCLBPF_AGREED  filled by the agreement between the ranks of a communicator: every rank
 *                   holds the same contents at each collective. No program writes it.
 *   NCCLBPF_CONFIG  configuration (thresholds, rules), the same on every rank: changed only by
 *                   staged updates that take effect at the same collective on every rank (and
 *                   filled at load, e.g. from a rules file). No program writes it. Constant
 *                   globals (.rodata) are configuration too.
 * Agreed maps and config maps other than .rodata are per communicator: a process's tuner
 * programs share its maps, and the runtime installs a communicator's own contents of them
 * (its view) right before its SEC("tuner") and "tuner/epoch" programs run. "tuner/chunk" and
 * "tuner/init" run without a view (they would read whichever communicator's contents were
 * installed last), so there the verifier counts those maps as rank-local: they decide from
 * their context, constants and .rodata only. .rodata comes with the object and never changes.
 * Put the macro among the members of the definition:
 *   struct { __uint(type, BPF_MAP_TYPE_ARRAY); __type(key, __u32); __type(value, __u64);
 *            __uint(max_entries, 4); NCCLBPF_CONFIG; } thresholds SEC(".maps");           */
#define NCCLBPF_SCOPE_LOCAL 1
#define NCCLBPF_SCOPE_AGREED 2
#define NCCLBPF_SCOPE_CONFIG 3
#define NCCLBPF_AGREED __uint(ncclbpf_scope, NCCLBPF_SCOPE_AGREED)
#define NCCLBPF_CONFIG __uint(ncclbpf_scope, NCCLBPF_SCOPE_CONFIG)

/* Epochs: the closed loop between what ranks observe and what they decide (docs/design/agreement.md).
 * At the end of each epoch (K collectives of the communicator, NCCL_BPF_AGREEMENT_EPOCH,
 * default 64), each rank's record holds, per source map, the *change* of every u64 word over
 * the epoch (wrapping difference of its contents at the epoch's end and the previous epoch's
 * end); the agreed map of source N holds, once epoch e is applied (from collective
 * (e+D)*K + 1 on, D = NCCL_BPF_AGREEMENT_DELAY, default 2, at most 16), the reduction over all
 * ranks of those changes for epoch e; the state map holds the epoch program's state[] after its
 * last run. Every epoch is applied (and the epoch program runs on it), but tuner programs are
 * run only from collective 2*D*K + 1 on, once the ranks are known to combine the same records;
 * before that, and after any mismatch between ranks, NCCL keeps its own choice.
 *   NCCLBPF_EPOCH_SOURCE(n)     on a rank-local ARRAY (not per-CPU, value_size a multiple of
 *                               8): the map is epoch source n (1..254) of its object; its
 *                               contents go into the rank's record. Programs count into it
 *                               as into any rank-local map (a counter that only grows gives
 *                               its epoch's increment; a value that is only stored gives the
 *                               difference to the previous epoch's, not the value).
 *   NCCLBPF_AGREED_FROM(n, op)  on an agreed ARRAY of the same value_size and max_entries as
 *                               source n of the same object: filled from it, each u64 word
 *                               reduced over the ranks with op (unsigned; sum wraps). One
 *                               source may fill several agreed maps (e.g. its sum and max).
 *   NCCLBPF_AGREED_STATE        on an agreed ARRAY of at most 256 bytes (value_size a multiple
 *                               of 8): receives the SEC("tuner/epoch") program's state[] after
 *                               each run, byte for byte (entry k holds bytes k*value_size ..
 *                               of state[]), so tuner programs can decide from it. At most one
 *                               per object.
 * No program writes an agreed map: the tuner/epoch program's state[] reaches the state map
 * through the runtime. */
#define NCCLBPF_REDUCE_SUM 1
#define NCCLBPF_REDUCE_MAX 2
#define NCCLBPF_REDUCE_MIN 3
#define NCCLBPF_SOURCE_STATE 255
#define NCCLBPF_EPOCH_SOURCE(n) __uint(ncclbpf_source, n)
#define NCCLBPF_AGREED_FROM(n, op)                                                               \
  __uint(ncclbpf_scope, NCCLBPF_SCOPE_AGREED);                                                  \
  __uint(ncclbpf_source, n);                                                                    \
  __uint(ncclbpf_reduce, op)
#define NCCLBPF_AGREED_STATE                                                                     \
  __uint(ncclbpf_scope, NCCLBPF_SCOPE_AGREED);                                                  \
  __uint(ncclbpf_source, NCCLBPF_SOURCE_STATE)

/* map_update_elem flags. */
#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_EXIST 2

/* ---------------------------------------------------------------- hooks and their contexts */

/* SEC("tuner"): called for every collective; write algo/proto/nchannels to decide.
 * -1 (or 0 for nchannels) leaves NCCL's own choice in place. */
struct ncclbpf_tuner_ctx {
  __u64 msg_size;     /* read:  bytes of the collective */
  __u64 comm_id;      /* read:  communicator hash */
  __u32 coll_type;    /* read:  NCCL_FUNC_* */
  __u32 nranks;       /* read */
  __u32 nnodes;       /* read */
  __u32 num_pipe_ops; /* read */
  __u32 reg_buff;     /* read: rank-local (each rank's own registration cache): a decision
                       * may not depend on it */
  __u32 max_channels; /* read:  what NCCL passes in *nChannels (0 in NCCL 2.28-2.30) */
  __s32 algo;         /* write: NCCL_ALGO_* or -1 */
  __s32 proto;        /* write: NCCL_PROTO_* or -1 */
  __u32 nchannels;    /* write: 0 keeps NCCL's channel count for this collective; n replaces
                       * it, and NCCL's scheduler caps it at the communicator's channels
                       * (CollNet and NVLS across nodes take it unchecked: there the plugin
                       * passes no count above 1) */
  /* From NCCL's cost table for this collective (tuner ABI v3 and later; filled only for
   * programs that read one of these three, so they cost nothing otherwise; `ncclbpf
   * decisions` passes no table). */
  __u32 usable;       /* read: rank-local: bit NCCLBPF_USABLE_BIT(a, p) set when NCCL can run
                       * algorithm a with protocol p for this collective; 0 when NCCL passes no
                       * table (ABI v2) or not 3 protocols. Only the table's cheapest entry is
                       * the same on every rank (NCCL's own choice depends on it); whether
                       * another entry is usable can depend on a rank's node (NVSwitches, local
                       * ranks), a failed NVLS bind or its own NCCL_ALGO/NCCL_PROTO, so a
                       * decision may not depend on it (count it into an epoch source and
                       * decide from the agreed result, as net_autotune does) */
  __s32 nccl_algo;    /* read:  NCCL's pick from the table: its first cheapest usable entry,
                       * the same on every rank; -1 when not known */
  __s32 nccl_proto;   /* read:  its protocol; -1 when not known */
};
#define NCCLBPF_USABLE_BIT(a, p) (1u << ((a) * NCCL_NUM_PROTOCOLS + (p)))

/* SEC("tuner/chunk"): NCCL >= 2.30 (tuner ABI v6) asks for the chunk size once the algorithm,
 * protocol and channels are fixed. Write chunk_size to change NCCL's (0 keeps it); NCCL clamps
 * it to its buffer's maximum and rounds it down to the protocol's grain (LL 16 B, LL128 1920 B,
 * Simple 512 B), and the runtime keeps NCCL's value for anything below that grain. Every rank
 * of the communicator must compute the same chunk size for the same collective (sender and
 * receiver step through the buffer in chunks): decide from these fields, constants and .rodata
 * only. It runs per collective without the communicator's view of agreed and config maps (see
 * "Map scope" above): the verifier rejects a chunk size that depends on one (on its values;
 * whether an array entry exists depends on the key alone and may be tested), as on any
 * rank-local map. */
struct ncclbpf_tuner_chunk_ctx {
  __u64 msg_size;   /* read:  bytes of the collective */
  __u64 comm_id;    /* read */
  __u32 coll_type;  /* read:  NCCL_FUNC_* */
  __s32 algo;       /* read:  NCCL_ALGO_* chosen */
  __s32 proto;      /* read:  NCCL_PROTO_* chosen */
  __u32 nchannels;  /* read:  channels of this collective */
  __u32 nranks;     /* read */
  __u32 nnodes;     /* read */
  __u64 chunk_size; /* read/write: NCCL's chunk size in bytes */
};

/* SEC("tuner/init"): runs once per communicator at init (tuner ABI v5+, NCCL >= 2.28) on
 * NCCL's cost-model constants, before NCCL builds its tuning model from them. The tables are
 * IEEE-754 doubles, which BPF cannot compute with: read and write their bit patterns, written
 * as NCCLBPF_F64(4.0) (clang folds it to a constant). Latencies are in µs, bandwidths in GB/s.
 * The runtime keeps NCCL's value for any written entry that is not a finite number in
 * [0, 1e6]. NCCL computes these per rank: a policy must write the same values on every rank
 * (constants, .rodata, or values from these read-only fields, which are the same on every
 * rank). It runs at init without the communicator's view of agreed and config maps (see
 * "Map scope" above; the agreement has not run yet either): the verifier rejects a constant
 * that depends on one, as on any rank-local map. */
#define NCCLBPF_NUM_ALGOS 7
#define NCCLBPF_NUM_PROTOS 3
#define NCCLBPF_NUM_HW 3       /* NCCL_HW_NVLINK 0, NCCL_HW_PCI 1, NCCL_HW_NET 2 */
#define NCCLBPF_NUM_COMPCAPS 4 /* Volta 0, Ampere 1, Hopper 2, Blackwell 3 */
#define NCCLBPF_NUM_SCALES 3   /* 1 node 0, 2 nodes 1, 4+ nodes 2 */
#define NCCL_HW_NVLINK 0
#define NCCL_HW_PCI 1
#define NCCL_HW_NET 2
#define NCCLBPF_F64(x) (((union { double d; __u64 u; }){.d = (x)}).u)
struct ncclbpf_tuner_init_ctx {
  __u64 comm_id;                  /* read */
  __u32 nranks;                   /* read */
  __u32 nnodes;                   /* read */
  __s32 nvl_domains;              /* read: NVL domain info (0 when NCCL gives none) */
  __s32 min_ranks_per_nvl_domain; /* read */
  __s32 max_ranks_per_nvl_domain; /* read */
  __u32 reserved;
  /* read/write: ncclTunerConstants_v5_t, in NCCL's order */
  __u64 base_latencies[NCCLBPF_NUM_ALGOS][NCCLBPF_NUM_PROTOS];
  __u64 hw_latencies[NCCLBPF_NUM_HW][NCCLBPF_NUM_ALGOS][NCCLBPF_NUM_PROTOS];
  __u64 ll_max_bws[NCCLBPF_NUM_COMPCAPS][NCCLBPF_NUM_SCALES];
  __u64 per_ch_max_ring_ll128_bws[NCCLBPF_NUM_COMPCAPS][NCCLBPF_NUM_SCALES];
  __u64 per_ch_max_tree_ll128_bws[NCCLBPF_NUM_COMPCAPS][NCCLBPF_NUM_SCALES];
  __u64 per_ch_max_tree_bws[NCCLBPF_NUM_COMPCAPS][NCCLBPF_NUM_SCALES];
  __u64 per_ch_max_nvls_tree_bws[NCCLBPF_NUM_COMPCAPS][NCCLBPF_NUM_SCALES];
};

/* SEC("tuner/epoch"): runs once per epoch of a communicator, on every rank alike, right after
 * the records of epoch `epoch` were combined into the agreed maps (at collective
 * (epoch+D)*K, before that collective is decided). It reads the agreed maps (and config maps,
 * both in the communicator's view) and these fields, and updates state[], which the runtime keeps for the communicator and
 * copies into the object's NCCLBPF_AGREED_STATE map for the tuner programs. Its writes to
 * state[] must come out the same on every rank: the verifier holds them to the rule of tuner
 * decisions (no rank-local map, clock or CPU id, directly or through a branch). state[] words
 * are written whole (8 bytes at a time). */
#define NCCLBPF_STATE_WORDS 32
struct ncclbpf_tuner_epoch_ctx {
  __u64 comm_id;         /* read */
  __u64 epoch;           /* read: the epoch whose records were just combined */
  __u32 nranks;          /* read: records combined */
  __u32 colls;           /* read: collectives per epoch (K) */
  __u64 duration_max_ns; /* read: the slowest rank's wall time for the epoch (agreed) */
  __u64 duration_min_ns; /* read: the fastest rank's */
  __u64 bytes;           /* read: bytes of the epoch's collectives (msg_size summed; the same
                          * everywhere) */
  __u64 state[NCCLBPF_STATE_WORDS]; /* read/write: the communicator's agreed state, kept from
                                     * the last run (zero at first) */
  __u64 net_busy_max_ns; /* read: the most any rank's net connections of the communicator had a
                          * request in flight during the epoch (agreed) */
  __u64 net_busy_min_ns; /* read: the least (0: some rank has none, e.g. net v7-v10) */
};

/* state[] is read and written at constant indices (the verifier takes context fields at
 * constant offsets only). A program that indexes its state by a computed value (a bucket, a
 * candidate) copies it to the stack, works there, and copies it back. */
static __always_inline void ncclbpf_state_load(const struct ncclbpf_tuner_epoch_ctx *ctx,
                                               __u64 *s) {
#pragma clang loop unroll(full)
  for (int i = 0; i < NCCLBPF_STATE_WORDS; i++) s[i] = ctx->state[i];
}
static __always_inline void ncclbpf_state_store(struct ncclbpf_tuner_epoch_ctx *ctx,
                                                const __u64 *s) {
#pragma clang loop unroll(full)
  for (int i = 0; i < NCCLBPF_STATE_WORDS; i++) ctx->state[i] = s[i];
}

/* SEC("net/connect"), SEC("net/accept"), SEC("net/isend"), SEC("net/irecv"),
 * SEC("net/complete"), SEC("net/close"): called around every net operation; read-only. */
struct ncclbpf_net_ctx {
  __u64 conn_id;    /* connection id, the same on both ends */
  __u64 bytes;      /* isend/irecv: posted size; complete: transferred size */
  __u64 comm_id;    /* communicator hash (0 when NCCL gives none) */
  __u32 op;         /* NCCLBPF_OP_* */
  __u32 peer_port;
  __u32 dev;
  __u32 nstreams;
  __u64 latency_ns; /* complete: time from post to completion */
  __s32 status;     /* complete/close: 0 or the ncclResult_t */
  __u32 reserved;   /* read: always 0 (readable so that a copy of the whole context verifies) */
};

#define NCCLBPF_OP_CONNECT 1
#define NCCLBPF_OP_ACCEPT 2
#define NCCLBPF_OP_ISEND 3
#define NCCLBPF_OP_IRECV 4
#define NCCLBPF_OP_COMPLETE_SEND 5
#define NCCLBPF_OP_COMPLETE_RECV 6
#define NCCLBPF_OP_CLOSE 7

/* SEC("profiler/coll"), SEC("profiler/p2p"), SEC("profiler/proxy_op"),
 * SEC("profiler/proxy_step"), SEC("profiler/kernel_ch"), SEC("profiler/net"): called at the end
 * of each event of that type NCCL's profiler reports (the event mask asks NCCL for the types
 * whose hooks have a program); read-only. The maps they write are rank-local: a tuner program
 * may not decide from them (it sees them only through the agreement's epochs). */
struct ncclbpf_profiler_ctx {
  __u64 comm_id;     /* communicator hash */
  __u64 seq;         /* coll: NCCL's sequence number (per collective); proxy_step: the step */
  __u64 bytes;       /* coll/p2p: bytes of the operation; proxy_op: steps x chunk; proxy_step: bytes moved */
  __u64 duration_ns; /* coll/p2p/kernel_ch: GPU execution time; others: host time start to stop */
  __u64 start_ns;    /* coll/p2p/kernel_ch: GPU globaltimer at the start; others: host clock */
  __u32 event;       /* NCCLBPF_PROF_* */
  __u32 coll;        /* NCCL's ncclFunc_t (15: other or not known) */
  __s32 algo;        /* NCCL_ALGO_* (-1: not known) */
  __s32 proto;       /* NCCL_PROTO_* (-1: not known) */
  __u32 channel;
  __s32 peer;        /* p2p and proxy events: the peer rank; coll: the root (-1: none) */
  __u32 rank;
  __u32 nranks;
  __u32 nchannels;
  __s32 state;       /* the last state NCCL recorded for the event (-1: none) */
  __u32 is_send;
  __u32 timed;       /* 1 when duration_ns was measured */
  __u64 user_tag;    /* coll/p2p: the caller's per-call profiler tag (NCCL 2.31+; 0: none) */
  __u32 symmetric;   /* coll: 1 for a symmetric-memory kernel (algo and proto are -1) */
  __u32 reserved;
};

#define NCCLBPF_PROF_COLL 1
#define NCCLBPF_PROF_P2P 2
#define NCCLBPF_PROF_PROXY_OP 3
#define NCCLBPF_PROF_PROXY_STEP 4
#define NCCLBPF_PROF_KERNEL_CH 5
#define NCCLBPF_PROF_NET 6

/* ncclFunc_t */
#define NCCL_FUNC_BROADCAST 0
#define NCCL_FUNC_REDUCE 1
#define NCCL_FUNC_ALLGATHER 2
#define NCCL_FUNC_REDUCESCATTER 3
#define NCCL_FUNC_ALLREDUCE 4

/* Algorithms and protocols (indices into NCCL's cost table). */
#define NCCL_ALGO_UNDEF -1
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6
#define NCCL_PROTO_UNDEF -1
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_NUM_PROTOCOLS 3

/* ---------------------------------------------------------------- tables the tuner fills */

/* One rule of a rules table (policies/src/rules.c): the tuner fills an ARRAY map named
 * `tuner_rules` with these from NCCL_TUNER_CONFIG_FILE (the CSV format of NCCL's example tuner,
 * see tuner/src/rules.rs) before the first decision. Rules sit in entries 0, 1, ... in file
 * order; the first entry with valid == 0 ends the table. Layout pinned by tests on both sides
 * (56 bytes: min_bytes 0, max_bytes 8, valid 16, coll 20, algo 24, proto 28, channels 32,
 * nnodes 36, nranks 40, num_pipe_ops 44, reg_buff 48, reserved 52). */
#define NCCLBPF_TUNER_RULES_MAX 512
struct ncclbpf_tuner_rule {
  __u64 min_bytes;    /* the rule applies to min_bytes <= msg_size <= max_bytes */
  __u64 max_bytes;
  __u32 valid;        /* 1: a rule; 0: the end of the table */
  __u32 coll;         /* NCCL_FUNC_* */
  __s32 algo;         /* NCCL_ALGO_* */
  __s32 proto;        /* NCCL_PROTO_* */
  __s32 channels;     /* 1..64, or -1: NCCL's channel count */
  __s32 nnodes;       /* -1: any */
  __s32 nranks;       /* -1: any */
  __s32 num_pipe_ops; /* -1: any */
  __s32 reg_buff;     /* always -1: rules on regBuff are skipped (it is rank-local) */
  __u32 reserved;     /* 0 */
};

/* ---------------------------------------------------------------- helpers
 * Allowed at every hook: map_lookup_elem, map_update_elem, map_delete_elem.
 * Net hooks only: ktime_get_ns, get_smp_processor_id (a tuner must decide the same on every
 * rank, so it may not read clocks or CPU numbers). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static __u32 (*bpf_get_smp_processor_id)(void) = (void *)8;

#endif
