/* An NCCL net plugin (ncclNetPlugin_v12) whose every request is complete the moment it is
 * posted: no bytes move. `ncclbpf-bench interposer` loads it once directly and once as the
 * inner plugin of ncclbpf (NCCL_BPF_NET_INNER), so that the difference per request is the
 * wrapper's own cost. Compiled by the bench at run time (`cc -O2 -shared -fPIC`).
 *
 * The table's slots follow ncclnet-headers' NetV12 (net.rs), in order; slots the bench never
 * reaches answer with an error (getProperties) or are left NULL (the optional ones). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int result_t; /* ncclResult_t: 0 success, 3 internal error */
typedef void *vp;

#define SLOTS 64

struct req {
  int size;
};

struct comm {
  unsigned next;
  struct req reqs[SLOTS];
};

static result_t init(vp *ctx, uint64_t comm_id, vp config, vp logger, vp prof) {
  (void)comm_id, (void)config, (void)logger, (void)prof;
  static int token;
  *ctx = &token;
  return 0;
}
static result_t devices(int *n) {
  *n = 1;
  return 0;
}
static result_t get_properties(int dev, vp props) {
  (void)dev, (void)props;
  return 3;
}
static result_t net_listen(vp ctx, int dev, vp handle, vp *lc) {
  (void)ctx, (void)dev;
  static int listener;
  memset(handle, 0x5a, 16);
  *lc = &listener;
  return 0;
}
static struct comm *new_comm(void) { return calloc(1, sizeof(struct comm)); }
static result_t net_connect(vp ctx, int dev, vp handle, vp *sc, vp *dh) {
  (void)ctx, (void)dev, (void)handle, (void)dh;
  *sc = new_comm();
  return *sc ? 0 : 3;
}
static result_t net_accept(vp lc, vp *rc, vp *dh) {
  (void)lc, (void)dh;
  *rc = new_comm();
  return *rc ? 0 : 3;
}
static result_t reg_mr(vp c, vp data, size_t size, int type, vp *mh) {
  (void)c, (void)data, (void)size, (void)type;
  *mh = NULL;
  return 0;
}
static result_t dereg_mr(vp c, vp mh) {
  (void)c, (void)mh;
  return 0;
}
static struct req *take(struct comm *c, size_t size) {
  struct req *r = &c->reqs[c->next++ % SLOTS];
  r->size = (int)size;
  return r;
}
static result_t isend(vp c, vp data, size_t size, int tag, vp mh, vp ph, vp *request) {
  (void)data, (void)tag, (void)mh, (void)ph;
  *request = take(c, size);
  return 0;
}
static result_t irecv(vp c, int n, vp *data, size_t *sizes, int *tags, vp *mhs, vp *phs,
                      vp *request) {
  (void)n, (void)data, (void)tags, (void)mhs, (void)phs;
  *request = take(c, sizes ? sizes[0] : 0);
  return 0;
}
static result_t iflush(vp c, int n, vp *data, int *sizes, vp *mhs, vp *request) {
  (void)n, (void)data, (void)sizes, (void)mhs;
  *request = take(c, 0);
  return 0;
}
static result_t test(vp request, int *done, int *sizes) {
  *done = 1;
  if (sizes) sizes[0] = ((struct req *)request)->size;
  return 0;
}
static result_t close_comm(vp c) {
  free(c);
  return 0;
}
static result_t close_listen(vp lc) {
  (void)lc;
  return 0;
}
static result_t finalize(vp ctx) {
  (void)ctx;
  return 0;
}

struct net_v12 {
  const char *name;
  vp init, devices, get_properties, listen, connect, accept, reg_mr, reg_mr_dma_buf, dereg_mr,
      isend, irecv, iflush, test, close_send, close_recv, close_listen, get_device_mr,
      irecv_consumed, make_v_device, finalize, set_net_attr;
};

__attribute__((visibility("default"))) const struct net_v12 ncclNetPlugin_v12 = {
    "Null",       (vp)init,   (vp)devices, (vp)get_properties, (vp)net_listen,     (vp)net_connect,
    (vp)net_accept,  (vp)reg_mr, NULL,        (vp)dereg_mr,       (vp)isend,      (vp)irecv,
    (vp)iflush,   (vp)test,   (vp)close_comm, (vp)close_comm,  (vp)close_listen, NULL,
    NULL,         NULL,       (vp)finalize, NULL,
};
