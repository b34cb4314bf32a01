/* NCCL's env plugin loader, condensed (src/plugin/env.cc, env_v1.cc, env_v2.cc of 2.28-2.30):
 * dlopen(RTLD_NOW | RTLD_LOCAL), dlsym "ncclEnvPlugin_v2" (2.30) then "ncclEnvPlugin_v1", calls
 * through the tables as C sees them, atexit(finalize). One plugin per process (the tests call
 * it in child processes). The struct definitions are NCCL's, so a Rust mirror that drifted from
 * them is caught here, not by the mirror's own tests. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

typedef struct {
  const char *name;
  ncclResult_t (*init)(uint8_t ncclMajor, uint8_t ncclMinor, uint8_t ncclPatch, const char *suffix);
  ncclResult_t (*finalize)(void);
  const char *(*getEnv)(const char *name);
} ncclEnv_v1_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(uint8_t ncclMajor, uint8_t ncclMinor, uint8_t ncclPatch, const char *suffix,
                       ncclDebugLogger_t logFunction);
  ncclResult_t (*finalize)(void);
  const char *(*getEnv)(const char *name);
} ncclEnv_v2_t;

_Static_assert(sizeof(ncclEnv_v1_t) == 32, "ncclEnv_v1_t is 32 bytes");
_Static_assert(offsetof(ncclEnv_v1_t, init) == 8, "v1 init at 8");
_Static_assert(offsetof(ncclEnv_v1_t, finalize) == 16, "v1 finalize at 16");
_Static_assert(offsetof(ncclEnv_v1_t, getEnv) == 24, "v1 getEnv at 24");
_Static_assert(sizeof(ncclEnv_v2_t) == 32, "ncclEnv_v2_t is 32 bytes");
_Static_assert(offsetof(ncclEnv_v2_t, init) == 8, "v2 init at 8");
_Static_assert(offsetof(ncclEnv_v2_t, finalize) == 16, "v2 finalize at 16");
_Static_assert(offsetof(ncclEnv_v2_t, getEnv) == 24, "v2 getEnv at 24");

static void *lib;
static int version;
static ncclEnv_v1_t *v1;
static ncclEnv_v2_t *v2;

/* Opens `path` and picks the table as NCCL `nccl_minor` would (2.30+: v2, else v1; then v1).
 * Returns the version picked, 0 when neither symbol is there, -1 when dlopen fails. */
int env_caller_load(const char *path, int nccl_minor) {
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return -1;
  if (nccl_minor >= 30) {
    v2 = (ncclEnv_v2_t *)dlsym(lib, "ncclEnvPlugin_v2");
    if (v2) return version = 2;
  }
  v1 = (ncclEnv_v1_t *)dlsym(lib, "ncclEnvPlugin_v1");
  if (v1) return version = 1;
  return 0;
}

/* The dlopen handle (to compare with a later dlopen of the same library). */
void *env_caller_handle(void) { return lib; }

const char *env_caller_name(void) { return version == 2 ? v2->name : v1->name; }

/* Bit 0: init, bit 1: finalize, bit 2: getEnv; set when the slot is not NULL. */
int env_caller_slots(void) {
  if (version == 2) return (v2->init != NULL) | (v2->finalize != NULL) << 1 | (v2->getEnv != NULL) << 2;
  return (v1->init != NULL) | (v1->finalize != NULL) << 1 | (v1->getEnv != NULL) << 2;
}

int env_caller_init(uint8_t major, uint8_t minor, uint8_t patch, const char *suffix,
                    ncclDebugLogger_t logger) {
  if (version == 2) return v2->init(major, minor, patch, suffix, logger);
  return v1->init(major, minor, patch, suffix);
}

static void finalize_at_exit(void) {
  if (version == 2) v2->finalize();
  else v1->finalize();
}

/* As NCCL does after a successful init. */
void env_caller_atexit(void) { atexit(finalize_at_exit); }

int env_caller_finalize(void) { return version == 2 ? v2->finalize() : v1->finalize(); }

const char *env_caller_get(const char *name) {
  return version == 2 ? v2->getEnv(name) : v1->getEnv(name);
}

/* A logger that locks as NCCL's ncclDebugLog does (2.28-2.30, src/debug.cc): a non-recursive
 * mutex held while ncclDebugInit reads NCCL_DEBUG and NCCL_DEBUG_SUBSYS through the env plugin
 * (once the plugin is initialised; plain getenv before). A plugin that called the logger from
 * inside that getEnv would lock the mutex twice on one thread: NCCL deadlocks there; this
 * error-checking mutex records it instead. */
static pthread_mutex_t debug_lock;
static pthread_once_t debug_once = PTHREAD_ONCE_INIT;
static int debug_level = -1; /* -1: ncclDebugInit still to run */
static int plugin_ready;     /* ncclEnvPluginInitialized() */
static int recursed;         /* the logger was re-entered while it held its lock */
static int lines;
static char debug_seen[64];

static void debug_lock_init(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
  pthread_mutex_init(&debug_lock, &a);
}

void env_caller_nccl_like_logger(int level, unsigned long flags, const char *file, int line,
                                 const char *fmt, ...) {
  (void)level; (void)flags; (void)file; (void)line; (void)fmt;
  pthread_once(&debug_once, debug_lock_init);
  if (pthread_mutex_lock(&debug_lock) == EDEADLK) {
    __atomic_store_n(&recursed, 1, __ATOMIC_SEQ_CST);
    return;
  }
  if (debug_level < 0) {
    const char *d = plugin_ready ? env_caller_get("NCCL_DEBUG") : getenv("NCCL_DEBUG");
    const char *s = plugin_ready ? env_caller_get("NCCL_DEBUG_SUBSYS") : getenv("NCCL_DEBUG_SUBSYS");
    (void)s;
    snprintf(debug_seen, sizeof debug_seen, "%s", d ? d : "(unset)");
    debug_level = d ? 3 : 0;
  }
  lines++;
  pthread_mutex_unlock(&debug_lock);
}

/* After init succeeded, as NCCL marks its env plugin initialised. */
void env_caller_plugin_ready(void) { plugin_ready = 1; }

/* ncclResetDebugInit: the next log line runs ncclDebugInit again. */
void env_caller_reset_debug(void) {
  pthread_once(&debug_once, debug_lock_init);
  pthread_mutex_lock(&debug_lock);
  debug_level = -1;
  pthread_mutex_unlock(&debug_lock);
}

int env_caller_logger_recursed(void) { return __atomic_load_n(&recursed, __ATOMIC_SEQ_CST); }

/* The lines logged so far, and the NCCL_DEBUG the last ncclDebugInit saw (copied out). */
int env_caller_logger_state(char *seen, size_t cap) {
  pthread_once(&debug_once, debug_lock_init);
  pthread_mutex_lock(&debug_lock);
  int n = lines;
  if (seen && cap) snprintf(seen, cap, "%s", debug_seen);
  pthread_mutex_unlock(&debug_lock);
  return n;
}
