/*
 * The reference inner plugin's state and check API: object tables and opaque handles, the call
 * log, violations, counters, configuration and failure injection, and the exported inner_ref_*
 * functions (documented in inner_ref.c's header). Compiled into every libinner-ref-vN.so.
 */
#define _GNU_SOURCE
#include "inner_ref_int.h"

const char *KIND_NAME[] = {"?", "ctx", "listen", "send", "recv", "mr", "req"};
static const char KIND_CH[] = "?clsrmq";

/* ---------------------------------------------------------------- state and handles */



ctx_t g_ctx[MAX_CTX];
listen_t g_listen[MAX_COMM];
send_t g_send[MAX_COMM];
recv_t g_recv[MAX_COMM];
mr_t g_mr[MAX_MR];
req_t g_req[MAX_REQ];
static int g_cursor[K_END];
static uint64_t g_serial[K_END];

pthread_mutex_t g_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

int cap_of(int k) {
  switch (k) {
  case K_CTX: return MAX_CTX;
  case K_MR: return MAX_MR;
  case K_REQ: return MAX_REQ;
  default: return MAX_COMM;
  }
}

hdr_t *hdr_at(int k, int slot) {
  switch (k) {
  case K_CTX: return &g_ctx[slot].h;
  case K_LISTEN: return &g_listen[slot].h;
  case K_SEND: return &g_send[slot].h;
  case K_RECV: return &g_recv[slot].h;
  case K_MR: return &g_mr[slot].h;
  default: return &g_req[slot].h;
  }
}

uint64_t make_handle(int k, int slot) {
  return H_BASE | ((uint64_t)k << 44) | ((uint64_t)(hdr_at(k, slot)->gen & 0xFFFFFFF) << 16) |
         (uint64_t)slot;
}

/* Allocates a slot of kind k (zeroed apart from its header); -1 when full. */
int alloc_slot(int k) {
  int cap = cap_of(k);
  for (int i = 0; i < cap; i++) {
    int s = (g_cursor[k] + i) % cap;
    hdr_t *h = hdr_at(k, s);
    if (h->live) continue;
    uint32_t gen = (h->gen + 1) & 0xFFFFFFF;
    if (gen == 0) gen = 1;
    size_t sz = k == K_CTX ? sizeof(ctx_t)
                : k == K_LISTEN ? sizeof(listen_t)
                : k == K_SEND ? sizeof(send_t)
                : k == K_RECV ? sizeof(recv_t)
                : k == K_MR ? sizeof(mr_t)
                : sizeof(req_t);
    memset(h, 0, sz); /* the header is the first member of every record */
    h->gen = gen;
    h->live = 1;
    h->serial = ++g_serial[k];
    g_cursor[k] = (s + 1) % cap;
    return s;
  }
  return -1;
}


/* Resolves a handle of kind k to its slot; the status says why not. */
int resolve(uint64_t v, int k, int *slot) {
  if ((v & 0xFFFF000000000000ull) != H_BASE) return H_FOREIGN;
  if ((int)((v >> 44) & 0xF) != k) return H_KIND;
  int s = (int)(v & 0xFFFF);
  uint32_t gen = (uint32_t)((v >> 16) & 0xFFFFFFF);
  if (s >= cap_of(k)) return H_UNISSUED;
  hdr_t *h = hdr_at(k, s);
  if (gen == 0 || gen > h->gen) return H_UNISSUED;
  if (gen < h->gen || !h->live) return H_STALE;
  *slot = s;
  return H_OK;
}

/* A printable name: kind letter + serial for a live handle, else the raw value. */
const char *nm(uint64_t v, char *buf) {
  for (int k = 1; k < K_END; k++) {
    int s;
    if (resolve(v, k, &s) == H_OK) {
      snprintf(buf, 24, "%c%llu", KIND_CH[k], (unsigned long long)hdr_at(k, s)->serial);
      return buf;
    }
  }
  snprintf(buf, 24, "%#llx", (unsigned long long)v);
  return buf;
}

/* ---------------------------------------------------------------- log, violations, counters */

static text_t g_log, g_viol;
static int g_nviol;
net_logger_t g_logger;
net_prof_cb_t g_prof;

static void text_add(text_t *t, const char *fmt, va_list ap) {
  char line[1024];
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  line[n] = 0;
  if (t->truncated) return;
  if (t->len + (size_t)n + 32 > LOG_CAP) {
    static const char m[] = "... log truncated\n";
    n = sizeof m - 1;
    memcpy(line, m, sizeof m);
    t->truncated = 1;
  }
  if (t->len + (size_t)n + 1 > t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 65536;
    while (nc < t->len + (size_t)n + 1) nc *= 2;
    char *p = realloc(t->p, nc);
    if (!p) return;
    t->p = p;
    t->cap = nc;
  }
  memcpy(t->p + t->len, line, (size_t)n + 1);
  t->len += (size_t)n;
}

void logf_(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  text_add(&g_log, fmt, ap);
  va_end(ap);
}

#define NCOUNT 64
static struct {
  const char *name;
  long n;
} g_count[NCOUNT];

void bump(const char *name) {
  for (int i = 0; i < NCOUNT; i++) {
    if (!g_count[i].name) {
      g_count[i].name = name;
      g_count[i].n = 1;
      return;
    }
    if (!strcmp(g_count[i].name, name)) {
      g_count[i].n++;
      return;
    }
  }
}

static void text_add_str(text_t *t, const char *m) {
  size_t n = strlen(m);
  if (t->truncated || t->len + n + 2 > LOG_CAP) return;
  if (t->len + n + 2 > t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 4096;
    while (nc < t->len + n + 2) nc *= 2;
    char *p = realloc(t->p, nc);
    if (!p) return;
    t->p = p;
    t->cap = nc;
  }
  memcpy(t->p + t->len, m, n);
  t->p[t->len + n] = '\n';
  t->p[t->len + n + 1] = 0;
  t->len += n + 1;
}

void violation(const char *fmt, ...) {
  char msg[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  g_nviol++;
  bump("violations");
  logf_("VIOLATION %s", msg);
  text_add_str(&g_viol, msg);
  if (g_logger)
    g_logger(2 /* WARN */, 0x10 /* NET */, __FILE__, __LINE__, "NET/RefNet : violation: %s", msg);
}

/* One violation for a handle that did not resolve; returns the status again. */
int check_handle(uint64_t v, int k, int *slot, const char *op, const char *what) {
  int st = resolve(v, k, slot);
  char b[24];
  switch (st) {
  case H_OK: break;
  case H_FOREIGN: violation("%s: %s %s was not issued by this plugin", op, what, nm(v, b)); break;
  case H_KIND: {
    int kk = (int)((v >> 44) & 0xF);
    violation("%s: %s %s is a %s handle, not a %s", op, what, nm(v, b),
              kk > 0 && kk < K_END ? KIND_NAME[kk] : "?", KIND_NAME[k]);
    break;
  }
  case H_UNISSUED: violation("%s: %s %s was never issued", op, what, nm(v, b)); break;
  case H_STALE:
    violation("%s: %s %s used after %s", op, what, nm(v, b),
              k == K_REQ ? "test() reported it done"
              : k == K_MR ? "deregMr"
              : k == K_CTX ? "finalize"
                           : "close");
    break;
  }
  return st;
}

/* ---------------------------------------------------------------- config and injection */

ref_config_t g_cfg;

static const char *INJECT_NAMES[] = {"isend_null",   "irecv_null",  "test_error",
                                     "hang",         "hang_recv",   "init_fail",
                                     "connect_fail", "accept_fail", "regmr_fail"};
#define NINJ (int)(sizeof INJECT_NAMES / sizeof INJECT_NAMES[0])
static struct {
  int armed, skip;
} g_inj[NINJ];
void *g_expect_ph;
int g_inits; /* v6-v10 init calls since load/reset */
int g_nvdev;
ref_vdev_t g_vdev[16];

static int set_config(const char *key, long v) {
#define KEY(k)                                                                                     \
  if (!strcmp(key, #k)) {                                                                          \
    g_cfg.k = v;                                                                                   \
    return 0;                                                                                      \
  }
  KEY(allow_null_mhandle)
  KEY(connect_delay)
  KEY(done_after_tests)
  KEY(flush_null)
  KEY(profiler_events)
  if (!strcmp(key, "maxrecvs")) {
    g_cfg.maxrecvs = v < 1 ? 1 : v > MAXR ? MAXR : v;
    return 0;
  }
  if (!strcmp(key, "ndev")) {
    g_cfg.ndev = v < 1 ? 1 : v > 4 ? 4 : v;
    return 0;
  }
#undef KEY
  return -1;
}

static int set_inject(const char *what, int after_n) {
  for (int i = 0; i < NINJ; i++) {
    if (!strcmp(INJECT_NAMES[i], what)) {
      g_inj[i].armed = after_n >= 0;
      g_inj[i].skip = after_n;
      return 0;
    }
  }
  return -1;
}

/* Parses "a<sep>N,b<sep>N" and applies each pair. */
static void parse_pairs(const char *s, char sep, int (*apply)(const char *, long)) {
  if (!s) return;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *e = strchr(tok, sep);
    long v = 0;
    if (e) {
      *e = 0;
      v = strtol(e + 1, NULL, 0);
    }
    apply(tok, v);
  }
}

static int inject_apply(const char *w, long n) { return set_inject(w, (int)n); }

static void reset_locked(void) {
  g_log.len = 0;
  g_log.truncated = 0;
  if (g_log.p) g_log.p[0] = 0;
  g_viol.len = 0;
  g_viol.truncated = 0;
  if (g_viol.p) g_viol.p[0] = 0;
  g_nviol = 0;
  memset(g_count, 0, sizeof g_count);
  memset(g_inj, 0, sizeof g_inj);
  g_expect_ph = NULL;
  g_inits = 0;
  g_nvdev = 0;
  g_cfg.allow_null_mhandle = 0;
  g_cfg.connect_delay = 1;
  g_cfg.done_after_tests = 0;
  g_cfg.flush_null = 0;
  g_cfg.profiler_events = 1;
  g_cfg.maxrecvs = MAXR;
  g_cfg.ndev = 1;
  const char *nd = getenv("INNER_REF_NDEV");
  if (nd) set_config("ndev", strtol(nd, NULL, 0));
  parse_pairs(getenv("INNER_REF_CONFIG"), '=', set_config);
  parse_pairs(getenv("INNER_REF_INJECT"), ':', inject_apply);
}

/* True when the armed injection `what` fires on this call. */
int fire(const char *what) {
  for (int i = 0; i < NINJ; i++) {
    if (strcmp(INJECT_NAMES[i], what) || !g_inj[i].armed) continue;
    if (g_inj[i].skip > 0) {
      g_inj[i].skip--;
      return 0;
    }
    g_inj[i].armed = 0;
    char name[64];
    snprintf(name, sizeof name, "inject:%s", what);
    /* counter names must outlive the table: keep the interned copies */
    static char interned[NINJ][64];
    snprintf(interned[i], sizeof interned[i], "%s", name);
    bump(interned[i]);
    logf_("inject %s", what);
    return 1;
  }
  return 0;
}

int ndev_total(void) { return (int)g_cfg.ndev + g_nvdev; }

__attribute__((constructor)) static void on_load(void) {
  LOCK();
  reset_locked();
  UNLOCK();
}

EXPORT int inner_ref_dump(const char *path);
__attribute__((destructor)) static void on_unload(void) {
  const char *p = getenv("INNER_REF_LOG_FILE");
  if (p && *p) inner_ref_dump(p);
}

/* ---------------------------------------------------------------- the check API */

static size_t copy_text(const text_t *t, char *out, size_t cap) {
  size_t n = t->len;
  if (out && cap) {
    size_t m = n < cap - 1 ? n : cap - 1;
    if (m) memcpy(out, t->p, m);
    out[m] = 0;
  }
  return n;
}

EXPORT int inner_ref_version(void) { return V; }

EXPORT size_t inner_ref_log(char *out, size_t cap) {
  LOCK();
  size_t n = copy_text(&g_log, out, cap);
  UNLOCK();
  return n;
}

EXPORT int inner_ref_violations(void) {
  LOCK();
  int n = g_nviol;
  UNLOCK();
  return n;
}

EXPORT size_t inner_ref_violation_text(char *out, size_t cap) {
  LOCK();
  size_t n = copy_text(&g_viol, out, cap);
  UNLOCK();
  return n;
}

EXPORT long inner_ref_count(const char *name) {
  long n = 0;
  LOCK();
  for (int i = 0; name && i < NCOUNT && g_count[i].name; i++)
    if (!strcmp(g_count[i].name, name)) n = g_count[i].n;
  UNLOCK();
  return n;
}

EXPORT int inner_ref_live(const char *kind) {
  int k = 0, n = 0;
  for (int i = 1; i < K_END; i++)
    if (kind && !strcmp(kind, KIND_NAME[i])) k = i;
  if (!k) return -1;
  LOCK();
  for (int s = 0; s < cap_of(k); s++) n += hdr_at(k, s)->live != 0;
  UNLOCK();
  return n;
}

EXPORT int inner_ref_inject(const char *what, int after_n) {
  if (!what) return -1;
  LOCK();
  int r = set_inject(what, after_n);
  if (r == 0) logf_("armed %s after %d", what, after_n);
  UNLOCK();
  return r;
}

EXPORT int inner_ref_config(const char *key, long v) {
  if (!key) return -1;
  LOCK();
  int r = set_config(key, v);
  UNLOCK();
  return r;
}

EXPORT void inner_ref_expect_phandle(void *p) {
  LOCK();
  g_expect_ph = p;
  UNLOCK();
}

EXPORT void inner_ref_reset(void) {
  LOCK();
  reset_locked();
  UNLOCK();
}

EXPORT int inner_ref_dump(const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  LOCK();
  fprintf(f, "# inner_ref v%d: %d violation(s)\n", V, g_nviol);
  if (g_viol.len) fwrite(g_viol.p, 1, g_viol.len, f);
  fprintf(f, "# call log\n");
  if (g_log.len) fwrite(g_log.p, 1, g_log.len, f);
  UNLOCK();
  fclose(f);
  return 0;
}

