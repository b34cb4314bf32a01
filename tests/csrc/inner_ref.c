/*
 * The reference inner net plugin: an in-process loopback transport that checks everything that
 * reaches it. This file is the net table of one ABI version; inner_ref_state.c holds the state,
 * log and exported API. Both are built once per ABI version (-DREF_NET_VERSION=N, N in 6..12)
 * into libinner-ref-vN.so, which exports exactly one table, ncclNetPlugin_vN, plus the
 * inner_ref_* functions below. Tests load it directly (dlopen) or behind the wrapper
 * (NCCL_BPF_NET_INNER); a test that dlopens the same path gets the same instance, so it can read
 * what the wrapper did.
 * docs/reference/reference-inner-plugin.md is the user's guide; the rules are here.
 *
 * Transport. listen() writes a 32-byte handle (magic, listener id, connect stage, dev, pid) into
 * NCCL's 128-byte buffer. connect() finds the listener in a global table; it answers "in
 * progress" (NULL comm) `connect_delay` times first, counting in the handle's stage field (so
 * a caller must hand back the same handle bytes on retries, as NCCL does). accept() pairs the
 * oldest connected send comm. Sends and receives of one connection match in posting order and
 * the bytes move with memcpy as soon as both sides are posted.
 *
 * Matching rule for receives. Only the oldest incomplete irecv of a connection takes data.
 *   n == 1: it takes the oldest queued send, whatever its tag; a differing tag is a violation
 *           (NCCL pairs n == 1 receives with sends strictly in order).
 *   n > 1:  each of its buffers takes the first queued send (in posting order) whose tag equals
 *           that buffer's tag; when several buffers share a tag, the lowest index fills first.
 *           Sends whose tag matches no unfilled buffer wait for a later receive.
 *   The irecv completes when all n buffers are filled. A send larger than its buffer is a
 *   violation, and test() of both requests returns ncclInvalidUsage (5).
 *
 * Handles. Every object the plugin returns (ctx, listen/send/recv comm, mhandle, request) is an
 * opaque 64-bit value 0x5EF0'kind'generation'slot, not a pointer: a caller that dereferences
 * one faults at once, and a stale or foreign value is told apart from a live one by its
 * generation. mhandles remember their comm and [ptr, ptr + size).
 *
 * Exported checks (all thread-safe; state is per loaded library, shared by all its users):
 *   int    inner_ref_version(void)                    the N of ncclNetPlugin_vN
 *   size_t inner_ref_log(char *out, size_t cap)       the call log, one "op args -> result"
 *                                                     line per call (test() only when it
 *                                                     reports done or an error); copies at most
 *                                                     cap-1 bytes + NUL, returns the full length
 *   int    inner_ref_violations(void)                 violations found since the last reset
 *   size_t inner_ref_violation_text(char *out, size_t cap)   one line per violation
 *   long   inner_ref_count(const char *name)          calls of an op ("isend", "test", ...,
 *                                                     "test_pending" for not-done polls),
 *                                                     "inject:<what>" for fired injections,
 *                                                     "prof_start"/"prof_stop", "violations"
 *   int    inner_ref_live(const char *kind)           live objects: "ctx", "listen", "send",
 *                                                     "recv", "mr", "req" (leak checks)
 *   int    inner_ref_inject(const char *what, int after_n)  arm a one-shot failure that fires
 *                                                     on the (after_n+1)-th later call of its op;
 *                                                     after_n < 0 disarms; returns 0, or -1 for
 *                                                     an unknown name. Names: isend_null,
 *                                                     irecv_null (success with *request = NULL),
 *                                                     test_error (test returns ncclRemoteError
 *                                                     once; the request is unchanged), hang (the
 *                                                     next isend never completes nor matches),
 *                                                     hang_recv, init_fail, connect_fail,
 *                                                     accept_fail, regmr_fail (ncclSystemError)
 *   int    inner_ref_config(const char *key, long v)  set a knob, returns 0 or -1 (unknown):
 *                                                     allow_null_mhandle (0), connect_delay (1),
 *                                                     done_after_tests (0: done at the first test
 *                                                     after the match), flush_null (0: iflush
 *                                                     returns a request), profiler_events (1:
 *                                                     start/stop events through the v10+ callback
 *                                                     for non-NULL phandles), maxrecvs (8, 1..8),
 *                                                     ndev (1, 1..4)
 *   void   inner_ref_expect_phandle(void *p)          non-NULL: every isend phandle and irecv
 *                                                     phandles[i] must be p (v10+)
 *   void   inner_ref_reset(void)                      clears log, violations, counters,
 *                                                     injections, expectations, config (back to
 *                                                     the environment's), virtual devices and the
 *                                                     "init ran" flag; live objects stay
 *   int    inner_ref_dump(const char *path)           writes log + violations to a file
 * Environment (read at load and on reset): INNER_REF_NDEV (1..4), INNER_REF_CONFIG
 * ("key=v,key=v"), INNER_REF_INJECT ("what:after_n,..."), INNER_REF_LOG_FILE (dump at unload).
 *
 * Violations recorded: an object handle not issued, of the wrong kind, or used after close /
 * dereg / completion (comm used after close, request tested after done); an mhandle of another
 * comm or not covering the buffer; NULL where the ABI forbids (out-pointers, arrays, mhandle);
 * n outside 1..maxRecvs; size/tag mismatches; negative int sizes; NCCL's 0x1 receive hint
 * reaching a v6-v8 irecv; a v11+ ctx init did not return; a phandle other than the expected
 * one; irecvConsumed for a request not reported done; a second v6-v10 init; a connect retry
 * without the handle state the previous call wrote.
 */
#define _GNU_SOURCE
#include "inner_ref_int.h"

#include <unistd.h>

#if V <= 7
typedef int regmr_size_t;
#else
typedef size_t regmr_size_t;
#endif
#if V <= 8
typedef int xfer_size_t;
#else
typedef size_t xfer_size_t;
#endif
#if V >= 12
typedef net_vdev_props_v12_t vdev_props_t;
#define VDEV_MAX 8
#elif V >= 9
typedef net_vdev_props_v9_t vdev_props_t;
#define VDEV_MAX 4
#endif

/* ---------------------------------------------------------------- init, devices, properties */

static net_result_t init_core(void **ctx, uint64_t comm_id, net_comm_config_t *config,
                              net_logger_t log, net_prof_cb_t prof) {
  LOCK();
  bump("init");
  g_logger = log;
  if (V >= 10) g_prof = prof;
  if (fire("init_fail")) {
    logf_("init -> error (injected)");
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  char b[24];
  if (V >= 11) {
    if (!ctx) {
      violation("init: ctx out-pointer is NULL");
      UNLOCK();
      return NET_ERR_INTERNAL;
    }
    int s = alloc_slot(K_CTX);
    if (s < 0) {
      UNLOCK();
      return NET_ERR_SYSTEM;
    }
    g_ctx[s].comm_id = comm_id;
    g_ctx[s].traffic_class = config ? config->trafficClass : -2;
    uint64_t h = make_handle(K_CTX, s);
    *ctx = (void *)h;
    logf_("init commId=%#llx tc=%d log=%d prof=%d -> %s", (unsigned long long)comm_id,
          config ? config->trafficClass : -2, log != NULL, prof != NULL, nm(h, b));
    if (!config) violation("init: config is NULL");
  } else {
    if (++g_inits > 1)
      violation("init: called %d times (a v6-v10 plugin is initialised once per load)", g_inits);
    logf_("init log=%d prof=%d", log != NULL, prof != NULL);
  }
  if (log)
    log(3 /* INFO */, 0x10 /* NET */, __FILE__, __LINE__,
        "NET/RefNet : reference inner plugin v%d, %d device(s)", V, ndev_total());
  UNLOCK();
  return NET_OK;
}

#if V >= 11
static net_result_t ref_init(void **ctx, uint64_t comm_id, net_comm_config_t *config,
                             net_logger_t log, net_prof_cb_t prof) {
  return init_core(ctx, comm_id, config, log, prof);
}
static net_result_t ref_finalize(void *ctx) {
  LOCK();
  bump("finalize");
  int s;
  char b[24];
  logf_("finalize %s", nm((uint64_t)ctx, b));
  if (check_handle((uint64_t)ctx, K_CTX, &s, "finalize", "ctx") == H_OK) g_ctx[s].h.live = 0;
  UNLOCK();
  return NET_OK;
}
static net_result_t ref_set_net_attr(void *ctx, net_attr_t *a) {
  LOCK();
  bump("setNetAttr");
  int s;
  char b[24];
  check_handle((uint64_t)ctx, K_CTX, &s, "setNetAttr", "ctx");
  if (!a) {
    violation("setNetAttr: attr is NULL");
  } else {
    logf_("setNetAttr %s send=%d/%d/%d/%d recv=%d/%d/%d/%d op=%#x algo=%#x proto=%#x",
          nm((uint64_t)ctx, b), a->sendCommAttr.maxConcurrentPeers,
          a->sendCommAttr.minConcurrentPeers, a->sendCommAttr.maxFlowsPerPeer,
          a->sendCommAttr.minFlowsPerPeer, a->recvCommAttr.maxConcurrentPeers,
          a->recvCommAttr.minConcurrentPeers, a->recvCommAttr.maxFlowsPerPeer,
          a->recvCommAttr.minFlowsPerPeer, a->op, a->algo, a->proto);
  }
  UNLOCK();
  return NET_OK;
}
#elif V == 10
static net_result_t ref_init(net_logger_t log, net_prof_cb_t prof) {
  return init_core(NULL, 0, NULL, log, prof);
}
#else
static net_result_t ref_init(net_logger_t log) { return init_core(NULL, 0, NULL, log, NULL); }
#endif

static net_result_t ref_devices(int *ndev) {
  LOCK();
  bump("devices");
  if (!ndev) {
    violation("devices: ndev is NULL");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  *ndev = ndev_total();
  logf_("devices -> %d", *ndev);
  UNLOCK();
  return NET_OK;
}

static char *DEV_NAMES[] = {"ref0", "ref1", "ref2", "ref3"};

/* Fills the fields every version has; returns 0 when dev is unknown. */
#define FILL_COMMON(p, dev)                                                                        \
  do {                                                                                             \
    memset((p), 0, sizeof *(p));                                                                   \
    (p)->name = (dev) < g_cfg.ndev ? DEV_NAMES[dev] : g_vdev[(dev) - g_cfg.ndev].name;             \
    (p)->pciPath = NULL;                                                                           \
    (p)->guid = (uint64_t)(dev);                                                                   \
    (p)->ptrSupport = NET_PTR_HOST;                                                                \
    (p)->speed = 100000;                                                                           \
    (p)->port = 0;                                                                                 \
    (p)->latency = 0;                                                                              \
    (p)->maxComms = 65536;                                                                         \
    (p)->maxRecvs = (int)g_cfg.maxrecvs;                                                           \
  } while (0)

static net_result_t ref_get_properties(int dev, CAT(CAT(net_props_v, V), _t) * props) {
  LOCK();
  bump("getProperties");
  if (!props || dev < 0 || dev >= ndev_total()) {
    violation("getProperties: dev %d of %d, props %s", dev, ndev_total(), props ? "ok" : "NULL");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  FILL_COMMON(props, dev);
#if V >= 7
  props->netDeviceType = 0;
  props->netDeviceVersion = 0;
#endif
#if V >= 8
  props->regIsGlobal = 0;
#endif
#if V >= 9
  props->forceFlush = 0;
  if (dev < g_cfg.ndev) {
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
  } else {
    props->vProps.ndevs = g_vdev[dev - g_cfg.ndev].ndevs;
    for (int i = 0; i < props->vProps.ndevs; i++)
      props->vProps.devs[i] = g_vdev[dev - g_cfg.ndev].devs[i];
  }
  props->maxP2pBytes = (size_t)1 << 40;
  props->maxCollBytes = (size_t)512 << 20;
#endif
#if V >= 11
  props->maxMultiRequestSize = 1;
#endif
#if V >= 12
  props->railId = -1;
  props->planeId = -1;
#endif
  logf_("getProperties dev=%d -> %s", dev, props->name);
  UNLOCK();
  return NET_OK;
}

#if V >= 9
static net_result_t ref_make_vdevice(int *d, vdev_props_t *props) {
  LOCK();
  bump("makeVDevice");
  if (!d || !props) {
    violation("makeVDevice: %s is NULL", d ? "props" : "d");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (props->ndevs < 1 || props->ndevs > VDEV_MAX || g_nvdev >= 16) {
    violation("makeVDevice: ndevs %d outside 1..%d", props->ndevs, VDEV_MAX);
    UNLOCK();
    return NET_ERR_INVALID_ARGUMENT;
  }
  int idx = g_nvdev;
  char *name = g_vdev[idx].name;
  int off = snprintf(name, sizeof g_vdev[idx].name, "ref");
  for (int i = 0; i < props->ndevs; i++) {
    int pd = props->devs[i];
    if (pd < 0 || pd >= g_cfg.ndev) {
      violation("makeVDevice: devs[%d] = %d is not a physical device", i, pd);
      UNLOCK();
      return NET_ERR_INVALID_ARGUMENT;
    }
    g_vdev[idx].devs[i] = pd;
    off += snprintf(name + off, sizeof g_vdev[idx].name - (size_t)off, "%s%d", i ? "+" : "", pd);
  }
  g_vdev[idx].ndevs = props->ndevs;
  g_nvdev++;
  *d = (int)g_cfg.ndev + idx;
  logf_("makeVDevice ndevs=%d -> dev=%d %s", props->ndevs, *d, name);
  UNLOCK();
  return NET_OK;
}
#endif

/* ---------------------------------------------------------------- connection setup */

#define HANDLE_MAGIC 0x313054454E464552ull /* "REFNET01" */
typedef struct {
  uint64_t magic;
  uint64_t listener;
  uint32_t stage;
  int32_t dev;
  uint32_t pid; /* the loopback is in-process: a handle from another process is refused */
  uint32_t pad;
} wire_handle_t;
_Static_assert(sizeof(wire_handle_t) == 32, "handle bytes");

static int dev_ok(int dev, const char *op) {
  if (dev >= 0 && dev < ndev_total()) return 1;
  violation("%s: dev %d outside 0..%d", op, dev, ndev_total() - 1);
  return 0;
}

static net_result_t listen_core(void *ctx, int has_ctx, int dev, void *handle, void **lc) {
  LOCK();
  bump("listen");
  int s;
  if (has_ctx) check_handle((uint64_t)ctx, K_CTX, &s, "listen", "ctx");
  if (!handle || !lc) {
    violation("listen: %s is NULL", handle ? "listenComm" : "handle");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  *lc = NULL;
  if (!dev_ok(dev, "listen")) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  s = alloc_slot(K_LISTEN);
  if (s < 0) {
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  g_listen[s].dev = dev;
  g_listen[s].ctx = (uint64_t)ctx;
  uint64_t h = make_handle(K_LISTEN, s);
  wire_handle_t w = {HANDLE_MAGIC, h, 0, dev, (uint32_t)getpid(), 0};
  memcpy(handle, &w, sizeof w);
  *lc = (void *)h;
  char b[24], c[24];
  logf_("listen ctx=%s dev=%d -> %s", has_ctx ? nm((uint64_t)ctx, c) : "-", dev, nm(h, b));
  UNLOCK();
  return NET_OK;
}

static net_result_t connect_core(void *ctx, int has_ctx, int dev, net_comm_config_t *cfg,
                                 int has_cfg, void *handle, void **sc, net_dev_handle_t **dc) {
  LOCK();
  bump("connect");
  int s;
  char b[24], c[24];
  if (has_ctx) check_handle((uint64_t)ctx, K_CTX, &s, "connect", "ctx");
  if (!handle || !sc) {
    violation("connect: %s is NULL", handle ? "sendComm" : "handle");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  *sc = NULL;
  if (!dev_ok(dev, "connect")) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (fire("connect_fail")) {
    logf_("connect dev=%d -> error (injected)", dev);
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  wire_handle_t w;
  memcpy(&w, handle, sizeof w);
  if (w.magic != HANDLE_MAGIC) {
    violation("connect: the handle bytes are not what listen wrote (magic %#llx)",
              (unsigned long long)w.magic);
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (w.pid != (uint32_t)getpid()) {
    logf_("connect dev=%d -> refused (a handle of process %u: the loopback is in-process)", dev,
          w.pid);
    if (g_logger)
      g_logger(2 /* WARN */, 0x10 /* NET */, __FILE__, __LINE__,
               "NET/RefNet : connect to a handle of process %u refused: the reference plugin "
               "connects only within one process",
               w.pid);
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  int ls;
  int st = resolve(w.listener, K_LISTEN, &ls);
  if (st == H_STALE) {
    logf_("connect dev=%d -> refused (listener closed)", dev);
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  if (check_handle(w.listener, K_LISTEN, &ls, "connect", "handle's listener") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  listen_t *L = &g_listen[ls];
  if (w.stage == 0) {
    if (L->connecting)
      violation("connect: retried without the state the previous call wrote into the handle "
                "(NCCL passes the same handle bytes on every retry)");
    L->connecting = 1;
  }
  const char *tc = "-";
  char tcb[16];
  if (has_cfg) {
    snprintf(tcb, sizeof tcb, "%d", cfg ? cfg->trafficClass : -2);
    tc = tcb;
    if (!cfg) violation("connect: config is NULL");
  }
  if ((long)w.stage < g_cfg.connect_delay || L->aq_n >= AQ) {
    w.stage++;
    memcpy(handle, &w, sizeof w);
    logf_("connect ctx=%s dev=%d tc=%s %s -> in progress", has_ctx ? nm((uint64_t)ctx, c) : "-",
          dev, tc, nm(w.listener, b));
    UNLOCK();
    return NET_OK;
  }
  s = alloc_slot(K_SEND);
  if (s < 0) {
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  g_send[s].dev = dev;
  g_send[s].ctx = (uint64_t)ctx;
  uint64_t h = make_handle(K_SEND, s);
  L->aq[L->aq_n++] = h;
  L->connecting = 0;
  *sc = (void *)h;
  char d[24];
  logf_("connect ctx=%s dev=%d tc=%s %s%s -> %s", has_ctx ? nm((uint64_t)ctx, c) : "-", dev, tc,
        nm(w.listener, b), dc && *dc ? " devcomm-requested" : "", nm(h, d));
  UNLOCK();
  return NET_OK;
}

static net_result_t accept_core(void *lc, void **rc, net_dev_handle_t **dc) {
  LOCK();
  bump("accept");
  int ls;
  if (check_handle((uint64_t)lc, K_LISTEN, &ls, "accept", "listenComm") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (!rc) {
    violation("accept: recvComm is NULL");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  *rc = NULL;
  if (fire("accept_fail")) {
    logf_("accept -> error (injected)");
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  listen_t *L = &g_listen[ls];
  while (L->aq_n > 0) {
    uint64_t sh = L->aq[0];
    memmove(L->aq, L->aq + 1, sizeof(uint64_t) * (size_t)--L->aq_n);
    int ss;
    if (resolve(sh, K_SEND, &ss) != H_OK) continue; /* closed before accept */
    int rs = alloc_slot(K_RECV);
    if (rs < 0) {
      UNLOCK();
      return NET_ERR_SYSTEM;
    }
    g_recv[rs].dev = L->dev;
    g_recv[rs].ctx = L->ctx;
    uint64_t rh = make_handle(K_RECV, rs);
    g_recv[rs].peer = sh;
    g_send[ss].peer = rh;
    *rc = (void *)rh;
    char a[24], b[24], c[24];
    logf_("accept %s%s -> %s (peer %s)", nm((uint64_t)lc, a), dc && *dc ? " devcomm-requested" : "",
          nm(rh, b), nm(sh, c));
    UNLOCK();
    return NET_OK;
  }
  UNLOCK();
  return NET_OK;
}

#if V >= 11
static net_result_t ref_listen(void *ctx, int dev, void *handle, void **lc) {
  return listen_core(ctx, 1, dev, handle, lc);
}
static net_result_t ref_connect(void *ctx, int dev, void *handle, void **sc,
                                net_dev_handle_t **dc) {
  return connect_core(ctx, 1, dev, NULL, 0, handle, sc, dc);
}
#else
static net_result_t ref_listen(int dev, void *handle, void **lc) {
  return listen_core(NULL, 0, dev, handle, lc);
}
#if V == 10
static net_result_t ref_connect(int dev, net_comm_config_t *cfg, void *handle, void **sc,
                                net_dev_handle_t **dc) {
  return connect_core(NULL, 0, dev, cfg, 1, handle, sc, dc);
}
#elif V >= 7
static net_result_t ref_connect(int dev, void *handle, void **sc, net_dev_handle_t **dc) {
  return connect_core(NULL, 0, dev, NULL, 0, handle, sc, dc);
}
#else
static net_result_t ref_connect(int dev, void *handle, void **sc) {
  return connect_core(NULL, 0, dev, NULL, 0, handle, sc, NULL);
}
#endif
#endif
#if V >= 7
static net_result_t ref_accept(void *lc, void **rc, net_dev_handle_t **dc) {
  return accept_core(lc, rc, dc);
}
#else
static net_result_t ref_accept(void *lc, void **rc) { return accept_core(lc, rc, NULL); }
#endif

/* Resolves a send or recv comm; on failure records the violation. */
static int any_comm(uint64_t v, int *kind, int *slot, const char *op) {
  if (resolve(v, K_SEND, slot) == H_OK) {
    *kind = K_SEND;
    return 1;
  }
  if (resolve(v, K_RECV, slot) == H_OK) {
    *kind = K_RECV;
    return 1;
  }
  int k = (int)((v >> 44) & 0xF);
  check_handle(v, k == K_RECV ? K_RECV : K_SEND, slot, op, "comm");
  return 0;
}

static void retire_reqs_of(uint64_t comm) {
  for (int i = 0; i < MAX_REQ; i++)
    if (g_req[i].h.live && g_req[i].comm == comm) g_req[i].h.live = 0;
}

static net_result_t close_core(void *c, int k, const char *op) {
  LOCK();
  bump(op);
  int s;
  char b[24];
  logf_("%s %s", op, nm((uint64_t)c, b));
  if (check_handle((uint64_t)c, k, &s, op, "comm") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  hdr_at(k, s)->live = 0;
  int ps;
  if (k == K_SEND && resolve(g_send[s].peer, K_RECV, &ps) == H_OK) g_recv[ps].peer = 0;
  if (k == K_RECV && resolve(g_recv[s].peer, K_SEND, &ps) == H_OK) g_send[ps].peer = 0;
  if (k != K_LISTEN) retire_reqs_of((uint64_t)c);
  UNLOCK();
  return NET_OK;
}
static net_result_t ref_close_send(void *c) { return close_core(c, K_SEND, "closeSend"); }
static net_result_t ref_close_recv(void *c) { return close_core(c, K_RECV, "closeRecv"); }
static net_result_t ref_close_listen(void *c) { return close_core(c, K_LISTEN, "closeListen"); }

/* ---------------------------------------------------------------- memory registration */

static net_result_t reg_core(void *comm, void *data, size_t size, int type, int dmabuf,
                             uint64_t offset, int fd, void **mh, const char *op) {
  LOCK();
  bump(op);
  int k, s;
  char b[24], c[24];
  if (!mh) {
    violation("%s: mhandle out-pointer is NULL", op);
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (!any_comm((uint64_t)comm, &k, &s, op)) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (fire("regmr_fail")) {
    logf_("%s %s -> error (injected)", op, nm((uint64_t)comm, b));
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  if (type != NET_PTR_HOST && !(dmabuf && type == NET_PTR_CUDA)) {
    /* ptrSupport is HOST only: CUDA registration is refused, as NCCL's Socket does */
    logf_("%s %s ptr=%p size=%zu type=%d -> refused", op, nm((uint64_t)comm, b), data, size, type);
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  int ms = alloc_slot(K_MR);
  if (ms < 0) {
    UNLOCK();
    return NET_ERR_SYSTEM;
  }
  mr_t *m = &g_mr[ms];
  m->comm = (uint64_t)comm;
  m->ptr = (uintptr_t)data;
  m->size = size;
  m->type = type;
  m->dmabuf = dmabuf;
  m->offset = offset;
  m->fd = fd;
  uint64_t h = make_handle(K_MR, ms);
  *mh = (void *)h;
  if (dmabuf)
    logf_("%s %s ptr=%p size=%zu type=%d offset=%llu fd=%d -> %s", op, nm((uint64_t)comm, c),
          data, size, type, (unsigned long long)offset, fd, nm(h, b));
  else
    logf_("%s %s ptr=%p size=%zu type=%d -> %s", op, nm((uint64_t)comm, c), data, size, type,
          nm(h, b));
  UNLOCK();
  return NET_OK;
}

static net_result_t ref_reg_mr(void *comm, void *data, regmr_size_t size, int type, void **mh) {
  if ((long long)size < 0) {
    LOCK();
    violation("regMr: negative size %lld", (long long)size);
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  return reg_core(comm, data, (size_t)size, type, 0, 0, -1, mh, "regMr");
}
static net_result_t ref_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
                                      uint64_t offset, int fd, void **mh) {
  return reg_core(comm, data, size, type, 1, offset, fd, mh, "regMrDmaBuf");
}

static net_result_t ref_dereg_mr(void *comm, void *mh) {
  LOCK();
  bump("deregMr");
  int k, s, ms;
  char b[24], c[24];
  logf_("deregMr %s %s", nm((uint64_t)comm, c), nm((uint64_t)mh, b));
  int cok = any_comm((uint64_t)comm, &k, &s, "deregMr");
  if (check_handle((uint64_t)mh, K_MR, &ms, "deregMr", "mhandle") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (cok && g_mr[ms].comm != (uint64_t)comm)
    violation("deregMr: mhandle %s was registered on another comm than %s", nm((uint64_t)mh, b),
              nm((uint64_t)comm, c));
  g_mr[ms].h.live = 0;
  UNLOCK();
  return NET_OK;
}

/* Checks that mh was issued for comm and covers [data, data + size). */
static void check_mh(uint64_t comm, void *mh, void *data, size_t size, const char *op, int i) {
  char b[24], c[24];
  if (!mh) {
    if (!g_cfg.allow_null_mhandle) violation("%s: mhandle[%d] is NULL", op, i);
    return;
  }
  int ms;
  if (check_handle((uint64_t)mh, K_MR, &ms, op, "mhandle") != H_OK) return;
  mr_t *m = &g_mr[ms];
  if (m->comm != comm) {
    char d[24];
    violation("%s: mhandle %s belongs to comm %s, used on %s", op, nm((uint64_t)mh, b),
              nm(m->comm, d), nm(comm, c));
    return;
  }
  uintptr_t p = (uintptr_t)data;
  if (p < m->ptr || p + size > m->ptr + m->size || p + size < p)
    violation("%s: buffer %p+%zu lies outside mhandle %s (%#lx+%zu)", op, data, size,
              nm((uint64_t)mh, b), (unsigned long)m->ptr, m->size);
}

#if V >= 7 /* v6 has no getDeviceMr slot */
static net_result_t ref_get_device_mr(void *comm, void *mh, void **dptr) {
  LOCK();
  bump("getDeviceMr");
  int k, s, ms;
  char b[24], c[24];
  logf_("getDeviceMr %s %s", nm((uint64_t)comm, c), nm((uint64_t)mh, b));
  any_comm((uint64_t)comm, &k, &s, "getDeviceMr");
  check_handle((uint64_t)mh, K_MR, &ms, "getDeviceMr", "mhandle");
  if (!dptr) violation("getDeviceMr: dptr_mhandle is NULL");
  else *dptr = NULL; /* host memory: no device-side handle */
  UNLOCK();
  return NET_OK;
}
#endif

/* ---------------------------------------------------------------- data path */

static void prof_start(req_t *r, int i, int op, size_t len) {
  if (!g_prof || !g_cfg.profiler_events || !r->ph[i]) return;
  r->pdesc[i].type = 1;
  r->pdesc[i].op = op;
  r->pdesc[i].len = len;
  r->eh[i] = NULL;
  bump("prof_start");
  g_prof(&r->eh[i], 0 /* start */, r->ph[i], (3 << 16) | 1, &r->pdesc[i]);
}

static void prof_stop(req_t *r) {
  for (int i = 0; i < r->n; i++) {
    if (!r->eh[i]) continue;
    bump("prof_stop");
    g_prof(&r->eh[i], 1 /* stop */, NULL, 0, NULL);
    r->eh[i] = NULL;
  }
}

static void finish(req_t *r, net_result_t err) {
  r->complete = 1;
  if (err != NET_OK) r->err = err;
  r->polls_left = (int)g_cfg.done_after_tests;
}

/* Moves data from the queued sends of sendComm ss into the oldest receives of its peer. */
static void progress(int ss) {
  send_t *S = &g_send[ss];
  int rs;
  if (!S->peer || resolve(S->peer, K_RECV, &rs) != H_OK) return;
  recv_t *R = &g_recv[rs];
  while (R->rq_n > 0 && S->sq_n > 0) {
    int qs;
    if (resolve(R->rq[0], K_REQ, &qs) != H_OK) { /* retired */
      memmove(R->rq, R->rq + 1, sizeof(uint64_t) * (size_t)--R->rq_n);
      continue;
    }
    req_t *rr = &g_req[qs];
    int pick = -1, buf = -1;
    for (int j = 0; j < S->sq_n && pick < 0; j++) {
      int ps;
      if (resolve(S->sq[j], K_REQ, &ps) != H_OK) continue;
      req_t *sr = &g_req[ps];
      if (sr->hung) {
        if (rr->n == 1) break; /* strict order: everything waits behind it */
        continue;
      }
      if (rr->n == 1) {
        pick = j;
        buf = 0;
        if (sr->tag[0] != rr->tag[0])
          violation("tag mismatch: send tag %d matched (in order) a receive with tag %d",
                    sr->tag[0], rr->tag[0]);
        break;
      }
      for (int i = 0; i < rr->n; i++)
        if (!rr->filled[i] && rr->tag[i] == sr->tag[0]) {
          pick = j;
          buf = i;
          break;
        }
    }
    if (pick < 0) return;
    int ps;
    resolve(S->sq[pick], K_REQ, &ps);
    req_t *sr = &g_req[ps];
    memmove(S->sq + pick, S->sq + pick + 1, sizeof(uint64_t) * (size_t)(S->sq_n - pick - 1));
    S->sq_n--;
    char a[24], b[24];
    if (sr->size[0] > rr->size[buf]) {
      violation("size mismatch: send %s of %zu bytes into receive %s buffer %d of %zu bytes",
                nm(make_handle(K_REQ, ps), a), sr->size[0], nm(make_handle(K_REQ, qs), b), buf,
                rr->size[buf]);
      finish(sr, NET_ERR_INVALID_USAGE);
      rr->err = NET_ERR_INVALID_USAGE;
      rr->got[buf] = 0;
    } else {
      if (sr->size[0]) memcpy(rr->data[buf], sr->data[0], sr->size[0]);
      rr->got[buf] = sr->size[0];
      finish(sr, NET_OK);
    }
    rr->filled[buf] = 1;
    if (++rr->nfilled == rr->n) {
      finish(rr, rr->err);
      memmove(R->rq, R->rq + 1, sizeof(uint64_t) * (size_t)--R->rq_n);
    }
  }
}

static void check_phandle(void *ph, const char *op, int i) {
  if (g_expect_ph && ph != g_expect_ph)
    violation("%s: phandle[%d] %p is not the expected %p", op, i, ph, g_expect_ph);
}

static net_result_t isend_core(void *comm, void *data, size_t size, int tag, void *mh, void *ph,
                               int has_ph, void **request) {
  LOCK();
  bump("isend");
  int s;
  char a[24], b[24], c[24];
  if (!request) {
    violation("isend: request out-pointer is NULL");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (check_handle((uint64_t)comm, K_SEND, &s, "isend", "sendComm") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  check_mh((uint64_t)comm, mh, data, size, "isend", 0);
  if (!data && size) violation("isend: data is NULL for %zu bytes", size);
  if (has_ph) check_phandle(ph, "isend", 0);
  if (fire("isend_null") || g_send[s].sq_n >= SQ) {
    *request = NULL;
    logf_("isend %s size=%zu tag=%d -> NULL (try again)", nm((uint64_t)comm, a), size, tag);
    UNLOCK();
    return NET_OK;
  }
  int q = alloc_slot(K_REQ);
  if (q < 0) {
    *request = NULL;
    UNLOCK();
    return NET_OK;
  }
  req_t *r = &g_req[q];
  r->op = R_SEND;
  r->n = 1;
  r->comm = (uint64_t)comm;
  r->data[0] = data;
  r->size[0] = size;
  r->tag[0] = tag;
  r->ph[0] = ph;
  r->hung = fire("hang");
  uint64_t h = make_handle(K_REQ, q);
  g_send[s].sq[g_send[s].sq_n++] = h;
  *request = (void *)h;
  if (has_ph)
    logf_("isend %s size=%zu tag=%d mh=%s ph=%p -> %s", nm((uint64_t)comm, a), size, tag,
          nm((uint64_t)mh, c), ph, nm(h, b));
  else
    logf_("isend %s size=%zu tag=%d mh=%s -> %s", nm((uint64_t)comm, a), size, tag,
          nm((uint64_t)mh, c), nm(h, b));
  prof_start(r, 0, R_SEND, size);
  progress(s);
  UNLOCK();
  return NET_OK;
}

static net_result_t irecv_core(void *comm, int n, void **data, const size_t *sizes, int *tags,
                               void **mhs, void **phs, int has_ph, void **request) {
  LOCK();
  bump("irecv");
  int s;
  char a[24], b[24];
  if (!request) {
    violation("irecv: request out-pointer is NULL");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  int hint = *request == NET_RECV_HINT;
  if (hint && V <= 8)
    violation("irecv: NCCL's 0x1 receive-completion hint reached a v%d plugin (v6-v8 never "
              "get it)",
              V);
  *request = NULL;
  if (check_handle((uint64_t)comm, K_RECV, &s, "irecv", "recvComm") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (n < 1 || n > g_cfg.maxrecvs) {
    violation("irecv: n = %d outside 1..%ld (maxRecvs)", n, g_cfg.maxrecvs);
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (!data || !sizes || !tags || !mhs) {
    violation("irecv: %s array is NULL", !data ? "data" : !sizes ? "sizes" : !tags ? "tags" : "mhandles");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  for (int i = 0; i < n; i++) {
    check_mh((uint64_t)comm, mhs[i], data[i], sizes[i], "irecv", i);
    if (!data[i] && sizes[i]) violation("irecv: data[%d] is NULL for %zu bytes", i, sizes[i]);
    if (has_ph && phs) check_phandle(phs[i], "irecv", i);
  }
  if (has_ph && !phs && g_expect_ph) violation("irecv: phandles array is NULL");
  if (fire("irecv_null") || g_recv[s].rq_n >= RQ) {
    logf_("irecv %s n=%d -> NULL (try again)", nm((uint64_t)comm, a), n);
    UNLOCK();
    return NET_OK;
  }
  int q = alloc_slot(K_REQ);
  if (q < 0) {
    UNLOCK();
    return NET_OK;
  }
  req_t *r = &g_req[q];
  r->op = R_RECV;
  r->n = n;
  r->comm = (uint64_t)comm;
  char line[900];
  int off = snprintf(line, sizeof line, "irecv %s n=%d%s", nm((uint64_t)comm, a), n,
                     hint ? " hint" : "");
  for (int i = 0; i < n; i++) {
    r->data[i] = data[i];
    r->size[i] = sizes[i];
    r->tag[i] = tags[i];
    r->ph[i] = has_ph && phs ? phs[i] : NULL;
    char ph[40] = "";
    if (has_ph) snprintf(ph, sizeof ph, " ph=%p", r->ph[i]);
    if (off < (int)sizeof line)
      off += snprintf(line + off, sizeof line - (size_t)off, " [size=%zu tag=%d mh=%s%s]",
                      sizes[i], tags[i], nm((uint64_t)mhs[i], b), ph);
  }
  r->hung = fire("hang_recv");
  uint64_t h = make_handle(K_REQ, q);
  g_recv[s].rq[g_recv[s].rq_n++] = h;
  *request = (void *)h;
  logf_("%s -> %s", line, nm(h, b));
  for (int i = 0; i < n; i++) prof_start(r, i, R_RECV, sizes[i]);
  int ps;
  if (resolve(g_recv[s].peer, K_SEND, &ps) == H_OK) progress(ps);
  UNLOCK();
  return NET_OK;
}

static net_result_t ref_isend_impl(void *comm, void *data, xfer_size_t size, int tag, void *mh,
                                   void *ph, int has_ph, void **request) {
  if ((long long)size < 0) {
    LOCK();
    violation("isend: negative size %lld", (long long)size);
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  return isend_core(comm, data, (size_t)size, tag, mh, ph, has_ph, request);
}

static net_result_t ref_irecv_impl(void *comm, int n, void **data, xfer_size_t *sizes, int *tags,
                                   void **mhs, void **phs, int has_ph, void **request) {
  size_t sz[MAXR];
  if (sizes && n >= 1 && n <= MAXR) {
    for (int i = 0; i < n; i++) {
      if ((long long)sizes[i] < 0) {
        LOCK();
        violation("irecv: negative size %lld in buffer %d", (long long)sizes[i], i);
        UNLOCK();
        return NET_ERR_INTERNAL;
      }
      sz[i] = (size_t)sizes[i];
    }
  }
  return irecv_core(comm, n, data, sizes ? sz : NULL, tags, mhs, phs, has_ph, request);
}

#if V >= 10
static net_result_t ref_isend(void *comm, void *data, size_t size, int tag, void *mh, void *ph,
                              void **request) {
  return ref_isend_impl(comm, data, size, tag, mh, ph, 1, request);
}
static net_result_t ref_irecv(void *comm, int n, void **data, size_t *sizes, int *tags,
                              void **mhs, void **phs, void **request) {
  return ref_irecv_impl(comm, n, data, sizes, tags, mhs, phs, 1, request);
}
#else
static net_result_t ref_isend(void *comm, void *data, xfer_size_t size, int tag, void *mh,
                              void **request) {
  return ref_isend_impl(comm, data, size, tag, mh, NULL, 0, request);
}
static net_result_t ref_irecv(void *comm, int n, void **data, xfer_size_t *sizes, int *tags,
                              void **mhs, void **request) {
  return ref_irecv_impl(comm, n, data, sizes, tags, mhs, NULL, 0, request);
}
#endif

static net_result_t ref_iflush(void *comm, int n, void **data, int *sizes, void **mhs,
                               void **request) {
  LOCK();
  bump("iflush");
  int s;
  char a[24], b[24];
  if (!request) {
    violation("iflush: request out-pointer is NULL");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  *request = NULL;
  if (check_handle((uint64_t)comm, K_RECV, &s, "iflush", "recvComm") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  if (n < 1 || n > g_cfg.maxrecvs || !data || !sizes || !mhs) {
    violation("iflush: n = %d or a NULL array", n);
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  for (int i = 0; i < n; i++) check_mh((uint64_t)comm, mhs[i], data[i], (size_t)(sizes[i] < 0 ? 0 : sizes[i]), "iflush", i);
  if (g_cfg.flush_null) {
    logf_("iflush %s n=%d size0=%d -> NULL (done)", nm((uint64_t)comm, a), n, sizes[0]);
    UNLOCK();
    return NET_OK;
  }
  int q = alloc_slot(K_REQ);
  if (q < 0) {
    UNLOCK();
    return NET_OK;
  }
  req_t *r = &g_req[q];
  r->op = R_FLUSH;
  r->n = n;
  r->comm = (uint64_t)comm;
  finish(r, NET_OK);
  uint64_t h = make_handle(K_REQ, q);
  *request = (void *)h;
  logf_("iflush %s n=%d size0=%d -> %s", nm((uint64_t)comm, a), n, sizes[0], nm(h, b));
  UNLOCK();
  return NET_OK;
}

static net_result_t ref_test(void *request, int *done, int *sizes) {
  LOCK();
  bump("test");
  int q;
  char a[24];
  if (!done) {
    violation("test: done is NULL");
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  *done = 0;
  if (check_handle((uint64_t)request, K_REQ, &q, "test", "request") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  req_t *r = &g_req[q];
  if (fire("test_error")) {
    logf_("test %s -> error 6 (injected)", nm((uint64_t)request, a));
    UNLOCK();
    return NET_ERR_REMOTE;
  }
  int ss, rs;
  if (r->op == R_SEND && resolve(r->comm, K_SEND, &ss) == H_OK) progress(ss);
  if (r->op == R_RECV && resolve(r->comm, K_RECV, &rs) == H_OK &&
      resolve(g_recv[rs].peer, K_SEND, &ss) == H_OK)
    progress(ss);
  if (!r->complete || r->hung || r->polls_left > 0) {
    if (r->complete && !r->hung) r->polls_left--;
    bump("test_pending");
    UNLOCK();
    return NET_OK;
  }
  *done = 1;
  char line[400];
  int off = snprintf(line, sizeof line, "test %s done", nm((uint64_t)request, a));
  if (sizes) {
    for (int i = 0; i < (r->op == R_FLUSH ? 0 : r->n); i++) {
      size_t v = r->op == R_SEND ? r->size[0] : r->got[i];
      sizes[i] = (int)v;
      if (off < (int)sizeof line)
        off += snprintf(line + off, sizeof line - (size_t)off, "%s%zu", i ? "," : " sizes=", v);
    }
  }
  if (r->err != NET_OK && off < (int)sizeof line)
    snprintf(line + off, sizeof line - (size_t)off, " -> error %d", r->err);
  logf_("%s", line);
  bump("test_done");
  prof_stop(r);
  if (r->op == R_RECV && V >= 7 && resolve(r->comm, K_RECV, &rs) == H_OK) {
    recv_t *R = &g_recv[rs];
    if (R->cq_n == CQ) { /* nobody consumes: forget the oldest */
      memmove(R->cq, R->cq + 1, sizeof(uint64_t) * (CQ - 1));
      memmove(R->cq_nbuf, R->cq_nbuf + 1, sizeof(int) * (CQ - 1));
      R->cq_n--;
    }
    R->cq[R->cq_n] = (uint64_t)request;
    R->cq_nbuf[R->cq_n++] = r->n;
  }
  net_result_t err = r->err;
  r->h.live = 0;
  UNLOCK();
  return err;
}

#if V >= 7
static net_result_t ref_irecv_consumed(void *comm, int n, void *request) {
  LOCK();
  bump("irecvConsumed");
  int s;
  char a[24], b[24];
  logf_("irecvConsumed %s n=%d %s", nm((uint64_t)comm, a), n, nm((uint64_t)request, b));
  if (check_handle((uint64_t)comm, K_RECV, &s, "irecvConsumed", "recvComm") != H_OK) {
    UNLOCK();
    return NET_ERR_INTERNAL;
  }
  recv_t *R = &g_recv[s];
  for (int i = 0; i < R->cq_n; i++) {
    if (R->cq[i] != (uint64_t)request) continue;
    if (R->cq_nbuf[i] != n)
      violation("irecvConsumed: n = %d for a receive of %d buffers", n, R->cq_nbuf[i]);
    memmove(R->cq + i, R->cq + i + 1, sizeof(uint64_t) * (size_t)(R->cq_n - i - 1));
    memmove(R->cq_nbuf + i, R->cq_nbuf + i + 1, sizeof(int) * (size_t)(R->cq_n - i - 1));
    R->cq_n--;
    UNLOCK();
    return NET_OK;
  }
  int q;
  if (resolve((uint64_t)request, K_REQ, &q) == H_OK)
    violation("irecvConsumed: request %s has not been reported done", nm((uint64_t)request, b));
  else
    violation("irecvConsumed: request %s is not a done receive of this comm awaiting it",
              nm((uint64_t)request, b));
  UNLOCK();
  return NET_OK;
}
#endif

/* ---------------------------------------------------------------- the table */

EXPORT const CAT(CAT(net_v, V), _t) CAT(ncclNetPlugin_v, V) = {
    .name = "RefNet",
    .init = ref_init,
    .devices = ref_devices,
    .getProperties = ref_get_properties,
    .listen = ref_listen,
    .connect = ref_connect,
    .accept = ref_accept,
    .regMr = ref_reg_mr,
    .regMrDmaBuf = ref_reg_mr_dmabuf,
    .deregMr = ref_dereg_mr,
    .isend = ref_isend,
    .irecv = ref_irecv,
    .iflush = ref_iflush,
    .test = ref_test,
    .closeSend = ref_close_send,
    .closeRecv = ref_close_recv,
    .closeListen = ref_close_listen,
#if V >= 7
    .getDeviceMr = ref_get_device_mr,
    .irecvConsumed = ref_irecv_consumed,
#endif
#if V >= 9
    .makeVDevice = ref_make_vdevice,
#endif
#if V >= 11
    .finalize = ref_finalize,
    .setNetAttr = ref_set_net_attr,
#endif
};

