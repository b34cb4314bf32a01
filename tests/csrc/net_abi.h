/*
 * C definitions of NCCL's network-plugin ABI, versions 6 to 12, written from the layout facts in
 * ../shared/docs/nccl-plugin-abi.md (sections 1 and 2) for the reference inner plugin
 * (inner_ref.c). The type names are ours; field order, types and sizes are the ABI's, and the
 * static assertions at the end pin every size that document gives (Linux LP64).
 *
 * Version differences in one place:
 *   v6  regMr/isend/irecv sizes are int; connect(dev, handle, comm); no device handles.
 *   v7  connect/accept take a device-handle out-pointer; getDeviceMr, irecvConsumed appended.
 *   v8  regMr size becomes size_t; props gain regIsGlobal.
 *   v9  isend/irecv sizes become size_t; props gain forceFlush, vProps[4], maxP2p/CollBytes;
 *       makeVDevice appended.
 *   v10 init(log, profilerCallback); connect takes a comm config; isend/irecv take phandle(s).
 *   v11 init(&ctx, commId, config, log, prof); listen/connect take ctx; finalize, setNetAttr
 *       appended; props gain maxMultiRequestSize.
 *   v12 vProps has 8 devices (shifting later fields); props gain railId, planeId.
 */
#ifndef NCCLBPF_NET_ABI_H
#define NCCLBPF_NET_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int net_result_t; /* a C enum: 4 bytes */
enum {
  NET_OK = 0,
  NET_ERR_SYSTEM = 2,
  NET_ERR_INTERNAL = 3,
  NET_ERR_INVALID_ARGUMENT = 4,
  NET_ERR_INVALID_USAGE = 5,
  NET_ERR_REMOTE = 6,
};

#define NET_HANDLE_BYTES 128
#define NET_PTR_HOST 0x1
#define NET_PTR_CUDA 0x2
#define NET_PTR_DMABUF 0x4
#define NET_RECV_HINT ((void *)0x1) /* NCCL_NET_OPTIONAL_RECV_COMPLETION in *request */

typedef void (*net_logger_t)(int level, unsigned long flags, const char *file, int line,
                             const char *fmt, ...);
typedef net_result_t (*net_prof_cb_t)(void **eHandle, int type, void *pHandle, int64_t pluginId,
                                      void *extData);

typedef struct {
  int netDeviceType; /* enum: 0 = host */
  int netDeviceVersion;
  void *handle;
  size_t size;
  int needsProxyProgress;
} net_dev_handle_t; /* the same from v7 to v12 */

typedef struct {
  int ndevs;
  int devs[4];
} net_vdev_props_v9_t; /* v9, v10, v11 */

typedef struct {
  int ndevs;
  int devs[8];
} net_vdev_props_v12_t;

typedef struct {
  int trafficClass;
} net_comm_config_t; /* v10, v11, v12 */

typedef struct {
  int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
} net_comm_attr_t;

typedef struct {
  net_comm_attr_t sendCommAttr, recvCommAttr;
  uint32_t op, algo, proto;
} net_attr_t; /* v11, v12 */

/* Properties. */
typedef struct {
  char *name;
  char *pciPath;
  uint64_t guid;
  int ptrSupport, speed, port;
  float latency;
  int maxComms, maxRecvs;
} net_props_v6_t;

typedef struct {
  char *name;
  char *pciPath;
  uint64_t guid;
  int ptrSupport, speed, port;
  float latency;
  int maxComms, maxRecvs;
  int netDeviceType, netDeviceVersion;
} net_props_v7_t;

typedef struct {
  char *name;
  char *pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal, speed, port;
  float latency;
  int maxComms, maxRecvs;
  int netDeviceType, netDeviceVersion;
} net_props_v8_t;

typedef struct {
  char *name;
  char *pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal, forceFlush, speed, port;
  float latency;
  int maxComms, maxRecvs;
  int netDeviceType, netDeviceVersion;
  net_vdev_props_v9_t vProps;
  size_t maxP2pBytes, maxCollBytes;
} net_props_v9_t;
typedef net_props_v9_t net_props_v10_t;

typedef struct {
  char *name;
  char *pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal, forceFlush, speed, port;
  float latency;
  int maxComms, maxRecvs;
  int netDeviceType, netDeviceVersion;
  net_vdev_props_v9_t vProps;
  size_t maxP2pBytes, maxCollBytes;
  int maxMultiRequestSize;
} net_props_v11_t;

typedef struct {
  char *name;
  char *pciPath;
  uint64_t guid;
  int ptrSupport, regIsGlobal, forceFlush, speed, port;
  float latency;
  int maxComms, maxRecvs;
  int netDeviceType, netDeviceVersion;
  net_vdev_props_v12_t vProps;
  size_t maxP2pBytes, maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId, planeId;
} net_props_v12_t;

/* Slot types shared by several versions. */
typedef net_result_t (*net_devices_fn)(int *ndev);
typedef net_result_t (*net_listen_fn)(int dev, void *handle, void **listenComm);
typedef net_result_t (*net_listen_ctx_fn)(void *ctx, int dev, void *handle, void **listenComm);
typedef net_result_t (*net_accept6_fn)(void *listenComm, void **recvComm);
typedef net_result_t (*net_accept_fn)(void *listenComm, void **recvComm, net_dev_handle_t **devComm);
typedef net_result_t (*net_regmr_int_fn)(void *comm, void *data, int size, int type, void **mh);
typedef net_result_t (*net_regmr_fn)(void *comm, void *data, size_t size, int type, void **mh);
typedef net_result_t (*net_regmr_dmabuf_fn)(void *comm, void *data, size_t size, int type,
                                            uint64_t offset, int fd, void **mh);
typedef net_result_t (*net_deregmr_fn)(void *comm, void *mh);
typedef net_result_t (*net_isend_int_fn)(void *comm, void *data, int size, int tag, void *mh,
                                         void **request);
typedef net_result_t (*net_isend_fn)(void *comm, void *data, size_t size, int tag, void *mh,
                                     void **request);
typedef net_result_t (*net_isend_ph_fn)(void *comm, void *data, size_t size, int tag, void *mh,
                                        void *phandle, void **request);
typedef net_result_t (*net_irecv_int_fn)(void *comm, int n, void **data, int *sizes, int *tags,
                                         void **mhs, void **request);
typedef net_result_t (*net_irecv_fn)(void *comm, int n, void **data, size_t *sizes, int *tags,
                                     void **mhs, void **request);
typedef net_result_t (*net_irecv_ph_fn)(void *comm, int n, void **data, size_t *sizes, int *tags,
                                        void **mhs, void **phandles, void **request);
typedef net_result_t (*net_iflush_fn)(void *comm, int n, void **data, int *sizes, void **mhs,
                                      void **request);
typedef net_result_t (*net_test_fn)(void *request, int *done, int *sizes);
typedef net_result_t (*net_close_fn)(void *comm);
typedef net_result_t (*net_get_device_mr_fn)(void *comm, void *mh, void **dptr_mh);
typedef net_result_t (*net_irecv_consumed_fn)(void *comm, int n, void *request);

/* Tables: a name pointer, then one pointer per slot. */
typedef struct {
  const char *name;
  net_result_t (*init)(net_logger_t log);
  net_devices_fn devices;
  net_result_t (*getProperties)(int dev, net_props_v6_t *props);
  net_listen_fn listen;
  net_result_t (*connect)(int dev, void *handle, void **sendComm);
  net_accept6_fn accept;
  net_regmr_int_fn regMr;
  net_regmr_dmabuf_fn regMrDmaBuf;
  net_deregmr_fn deregMr;
  net_isend_int_fn isend;
  net_irecv_int_fn irecv;
  net_iflush_fn iflush;
  net_test_fn test;
  net_close_fn closeSend, closeRecv, closeListen;
} net_v6_t;

typedef struct {
  const char *name;
  net_result_t (*init)(net_logger_t log);
  net_devices_fn devices;
  net_result_t (*getProperties)(int dev, net_props_v7_t *props);
  net_listen_fn listen;
  net_result_t (*connect)(int dev, void *handle, void **sendComm, net_dev_handle_t **devComm);
  net_accept_fn accept;
  net_regmr_int_fn regMr;
  net_regmr_dmabuf_fn regMrDmaBuf;
  net_deregmr_fn deregMr;
  net_isend_int_fn isend;
  net_irecv_int_fn irecv;
  net_iflush_fn iflush;
  net_test_fn test;
  net_close_fn closeSend, closeRecv, closeListen;
  net_get_device_mr_fn getDeviceMr;
  net_irecv_consumed_fn irecvConsumed;
} net_v7_t;

typedef struct {
  const char *name;
  net_result_t (*init)(net_logger_t log);
  net_devices_fn devices;
  net_result_t (*getProperties)(int dev, net_props_v8_t *props);
  net_listen_fn listen;
  net_result_t (*connect)(int dev, void *handle, void **sendComm, net_dev_handle_t **devComm);
  net_accept_fn accept;
  net_regmr_fn regMr;
  net_regmr_dmabuf_fn regMrDmaBuf;
  net_deregmr_fn deregMr;
  net_isend_int_fn isend;
  net_irecv_int_fn irecv;
  net_iflush_fn iflush;
  net_test_fn test;
  net_close_fn closeSend, closeRecv, closeListen;
  net_get_device_mr_fn getDeviceMr;
  net_irecv_consumed_fn irecvConsumed;
} net_v8_t;

typedef struct {
  const char *name;
  net_result_t (*init)(net_logger_t log);
  net_devices_fn devices;
  net_result_t (*getProperties)(int dev, net_props_v9_t *props);
  net_listen_fn listen;
  net_result_t (*connect)(int dev, void *handle, void **sendComm, net_dev_handle_t **devComm);
  net_accept_fn accept;
  net_regmr_fn regMr;
  net_regmr_dmabuf_fn regMrDmaBuf;
  net_deregmr_fn deregMr;
  net_isend_fn isend;
  net_irecv_fn irecv;
  net_iflush_fn iflush;
  net_test_fn test;
  net_close_fn closeSend, closeRecv, closeListen;
  net_get_device_mr_fn getDeviceMr;
  net_irecv_consumed_fn irecvConsumed;
  net_result_t (*makeVDevice)(int *d, net_vdev_props_v9_t *props);
} net_v9_t;

typedef struct {
  const char *name;
  net_result_t (*init)(net_logger_t log, net_prof_cb_t prof);
  net_devices_fn devices;
  net_result_t (*getProperties)(int dev, net_props_v10_t *props);
  net_listen_fn listen;
  net_result_t (*connect)(int dev, net_comm_config_t *config, void *handle, void **sendComm,
                          net_dev_handle_t **devComm);
  net_accept_fn accept;
  net_regmr_fn regMr;
  net_regmr_dmabuf_fn regMrDmaBuf;
  net_deregmr_fn deregMr;
  net_isend_ph_fn isend;
  net_irecv_ph_fn irecv;
  net_iflush_fn iflush;
  net_test_fn test;
  net_close_fn closeSend, closeRecv, closeListen;
  net_get_device_mr_fn getDeviceMr;
  net_irecv_consumed_fn irecvConsumed;
  net_result_t (*makeVDevice)(int *d, net_vdev_props_v9_t *props);
} net_v10_t;

typedef struct {
  const char *name;
  net_result_t (*init)(void **ctx, uint64_t commId, net_comm_config_t *config, net_logger_t log,
                       net_prof_cb_t prof);
  net_devices_fn devices;
  net_result_t (*getProperties)(int dev, net_props_v11_t *props);
  net_listen_ctx_fn listen;
  net_result_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
                          net_dev_handle_t **devComm);
  net_accept_fn accept;
  net_regmr_fn regMr;
  net_regmr_dmabuf_fn regMrDmaBuf;
  net_deregmr_fn deregMr;
  net_isend_ph_fn isend;
  net_irecv_ph_fn irecv;
  net_iflush_fn iflush;
  net_test_fn test;
  net_close_fn closeSend, closeRecv, closeListen;
  net_get_device_mr_fn getDeviceMr;
  net_irecv_consumed_fn irecvConsumed;
  net_result_t (*makeVDevice)(int *d, net_vdev_props_v9_t *props);
  net_result_t (*finalize)(void *ctx);
  net_result_t (*setNetAttr)(void *ctx, net_attr_t *attr);
} net_v11_t;

typedef struct {
  const char *name;
  net_result_t (*init)(void **ctx, uint64_t commId, net_comm_config_t *config, net_logger_t log,
                       net_prof_cb_t prof);
  net_devices_fn devices;
  net_result_t (*getProperties)(int dev, net_props_v12_t *props);
  net_listen_ctx_fn listen;
  net_result_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
                          net_dev_handle_t **devComm);
  net_accept_fn accept;
  net_regmr_fn regMr;
  net_regmr_dmabuf_fn regMrDmaBuf;
  net_deregmr_fn deregMr;
  net_isend_ph_fn isend;
  net_irecv_ph_fn irecv;
  net_iflush_fn iflush;
  net_test_fn test;
  net_close_fn closeSend, closeRecv, closeListen;
  net_get_device_mr_fn getDeviceMr;
  net_irecv_consumed_fn irecvConsumed;
  net_result_t (*makeVDevice)(int *d, net_vdev_props_v12_t *props);
  net_result_t (*finalize)(void *ctx);
  net_result_t (*setNetAttr)(void *ctx, net_attr_t *attr);
} net_v12_t;

/* The sizes the ABI document gives (LP64). */
_Static_assert(sizeof(net_dev_handle_t) == 32, "device handle");
_Static_assert(sizeof(net_vdev_props_v9_t) == 20, "vProps v9-v11");
_Static_assert(sizeof(net_vdev_props_v12_t) == 36, "vProps v12");
_Static_assert(sizeof(net_attr_t) == 44, "net attr");
_Static_assert(sizeof(net_props_v6_t) == 48, "props v6");
_Static_assert(sizeof(net_props_v7_t) == 56, "props v7");
_Static_assert(sizeof(net_props_v8_t) == 64, "props v8");
_Static_assert(sizeof(net_props_v9_t) == 104, "props v9/v10");
_Static_assert(sizeof(net_props_v11_t) == 112, "props v11");
_Static_assert(sizeof(net_props_v12_t) == 128, "props v12");
_Static_assert(offsetof(net_props_v9_t, maxP2pBytes) == 88, "props v9 maxP2pBytes");
_Static_assert(offsetof(net_props_v11_t, maxMultiRequestSize) == 104, "props v11 maxMulti");
_Static_assert(offsetof(net_props_v12_t, maxP2pBytes) == 104, "props v12 maxP2pBytes");
_Static_assert(offsetof(net_props_v12_t, railId) == 124, "props v12 railId");
_Static_assert(sizeof(net_v6_t) == 136, "table v6");
_Static_assert(sizeof(net_v7_t) == 152, "table v7");
_Static_assert(sizeof(net_v8_t) == 152, "table v8");
_Static_assert(sizeof(net_v9_t) == 160, "table v9");
_Static_assert(sizeof(net_v10_t) == 160, "table v10");
_Static_assert(sizeof(net_v11_t) == 176, "table v11");
_Static_assert(sizeof(net_v12_t) == 176, "table v12");

#endif
