/*
 * Internals shared by the two halves of the reference inner plugin: inner_ref.c (the net table
 * of one ABI version: transport and per-call checks) and inner_ref_state.c (object tables and
 * handles, call log, violations, counters, configuration, injections, and the exported
 * inner_ref_* API). Not part of any ABI: both files are compiled into each libinner-ref-vN.so
 * with -fvisibility=hidden, so nothing here is exported.
 */
#ifndef NCCLBPF_INNER_REF_INT_H
#define NCCLBPF_INNER_REF_INT_H

#include "net_abi.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef REF_NET_VERSION
#error "build with -DREF_NET_VERSION=N (6..12)"
#endif
#define V REF_NET_VERSION
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define EXPORT __attribute__((visibility("default")))

#define MAXR 8 /* most buffers in one irecv we advertise */
#define SQ 512 /* queued sends per send comm (32 x maxRecvs, with room) */
#define RQ 64  /* queued receives per recv comm */
#define CQ 64  /* receives awaiting irecvConsumed */
#define AQ 16  /* connected, not yet accepted */
#define LOG_CAP (64u << 20)

enum { K_CTX = 1, K_LISTEN, K_SEND, K_RECV, K_MR, K_REQ, K_END };
#define H_BASE (0x5EF0ull << 48)

typedef struct {
  uint32_t gen; /* generation of the latest issue; 0: never issued */
  int live;
  uint64_t serial;
} hdr_t;

typedef struct {
  hdr_t h;
  uint64_t comm_id;
  int traffic_class;
} ctx_t;

typedef struct {
  hdr_t h;
  int dev;
  uint64_t ctx;
  int connecting; /* a connect attempt started and not finished */
  uint64_t aq[AQ];
  int aq_n;
} listen_t;

typedef struct {
  hdr_t h;
  int dev;
  uint64_t ctx, peer; /* peer: the recv comm once accepted */
  uint64_t sq[SQ];
  int sq_n;
} send_t;

typedef struct {
  hdr_t h;
  int dev;
  uint64_t ctx, peer;
  uint64_t rq[RQ];
  int rq_n;
  uint64_t cq[CQ]; /* done receives awaiting irecvConsumed, with their n */
  int cq_nbuf[CQ];
  int cq_n;
} recv_t;

typedef struct {
  hdr_t h;
  uint64_t comm;
  uintptr_t ptr;
  size_t size;
  int type, dmabuf, fd;
  uint64_t offset;
} mr_t;

enum { R_SEND, R_RECV, R_FLUSH };
typedef struct {
  hdr_t h;
  int op, n;
  uint64_t comm;
  void *data[MAXR];
  size_t size[MAXR], got[MAXR];
  int tag[MAXR], filled[MAXR], nfilled;
  void *ph[MAXR];
  void *eh[MAXR];            /* profiler event handles */
  struct {                   /* the extData the profiler events point at */
    uint8_t type;
    int op;
    size_t len;
  } pdesc[MAXR];
  int complete, hung, polls_left;
  net_result_t err;
} req_t;

#define MAX_CTX 1024
#define MAX_COMM 1024
#define MAX_MR 8192
#define MAX_REQ 8192
extern ctx_t g_ctx[MAX_CTX];
extern listen_t g_listen[MAX_COMM];
extern send_t g_send[MAX_COMM];
extern recv_t g_recv[MAX_COMM];
extern mr_t g_mr[MAX_MR];
extern req_t g_req[MAX_REQ];
extern const char *KIND_NAME[];

/* One recursive lock guards everything (the profiler callback runs under it). */
extern pthread_mutex_t g_mu;
#define LOCK() pthread_mutex_lock(&g_mu)
#define UNLOCK() pthread_mutex_unlock(&g_mu)

typedef struct {
  char *p;
  size_t len, cap;
  int truncated;
} text_t;

typedef struct {
  long allow_null_mhandle, connect_delay, done_after_tests, flush_null, profiler_events, maxrecvs,
      ndev;
} ref_config_t;
typedef struct {
  int ndevs, devs[8];
  char name[64];
} ref_vdev_t;
extern ref_config_t g_cfg;
extern ref_vdev_t g_vdev[16];
extern int g_nvdev;
extern int g_inits;   /* v6-v10 init calls since load/reset */
extern void *g_expect_ph;
extern net_logger_t g_logger;
extern net_prof_cb_t g_prof;

/* Handles: 0x5EF0 | kind (4 bits) | generation (28 bits) | slot (16 bits). */
enum { H_OK, H_FOREIGN, H_KIND, H_UNISSUED, H_STALE };
int cap_of(int k);
hdr_t *hdr_at(int k, int slot);
uint64_t make_handle(int k, int slot);
int alloc_slot(int k);                        /* -1 when full */
int resolve(uint64_t v, int k, int *slot);    /* H_OK or why not */
int check_handle(uint64_t v, int k, int *slot, const char *op, const char *what); /* + violation */
const char *nm(uint64_t v, char *buf);        /* buf: 24 bytes */

__attribute__((format(printf, 1, 2))) void logf_(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void violation(const char *fmt, ...);
void bump(const char *name);                  /* name must outlive the library */
int fire(const char *what);                   /* 1 when the armed injection fires now */
int ndev_total(void);

#endif
