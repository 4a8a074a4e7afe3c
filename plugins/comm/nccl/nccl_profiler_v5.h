/* NCCL's profiler plugin interface, version 5 (NCCL 2.28; NCCL 2.29 still
 * accepts it): the layout NCCL expects behind the symbol `ncclProfiler_v5`
 * of the library that NCCL_PROFILER_PLUGIN names. NCCL ships no header for
 * it (plugins declare it themselves); this one is written from the layout
 * documented in NCCL's plugins/profiler/README.md, and holds only what
 * Ballast uses. Field order and types are the contract: do not reorder. */
#ifndef BALLAST_NCCL_PROFILER_V5_H
#define BALLAST_NCCL_PROFILER_V5_H

#include <nccl.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Event types: the bits of the activation mask and of a descriptor's type. */
enum {
  NCCL_PROF_COLL = 1 << 1,       /* a collective, enqueued (its stop means enqueued, not done) */
  NCCL_PROF_P2P = 1 << 2,        /* a send or receive, enqueued */
  NCCL_PROF_PROXY_OP = 1 << 3,   /* a channel's network work for one peer, on the proxy thread */
  NCCL_PROF_PROXY_STEP = 1 << 4, /* one network transfer (a chunk) of a ProxyOp */
  NCCL_PROF_KERNEL_CH = 1 << 6   /* a channel of the kernel running the operation */
};

/* ProxyStep states (values of NCCL's ncclProfilerEventState_t). */
enum {
  NCCL_PROF_STEP_SEND_GPU_WAIT = 8,    /* waiting for the GPU to fill the chunk */
  NCCL_PROF_STEP_SEND_WAIT = 9,        /* handed to the network, waiting for completion */
  NCCL_PROF_STEP_RECV_WAIT = 10,       /* posted, waiting for the peer's data */
  NCCL_PROF_STEP_RECV_FLUSH_WAIT = 11, /* arrived, being flushed to the GPU */
  NCCL_PROF_STEP_RECV_GPU_WAIT = 12,   /* arrived, waiting for the GPU to consume it */
  NCCL_PROF_STEP_SEND_PEER_WAIT = 20   /* waiting for the receiver's credit */
};

typedef struct {
  uint64_t type;   /* one NCCL_PROF_* bit */
  void* parentObj; /* the handle our startEvent returned for the parent event */
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid; /* the process that issued the operation (PXN: maybe not this one) */
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} ballast_nccl_prof_descr_v5;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} ballast_nccl_prof_state_args_v5;

/* NCCL's logger: never called by Ballast, declared for the slot's type. */
typedef void (*ballast_nccl_logger)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ballast_nccl_logger logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ballast_nccl_prof_descr_v5* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, int eState, ballast_nccl_prof_state_args_v5* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ballast_nccl_profiler_v5;

#ifdef __cplusplus
}
#endif

#endif
