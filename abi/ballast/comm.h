/* Ballast C ABI: interface "ballast.comm" v1, collectives between processes.
 *
 * A comm plugin (ballast-comm-ucx, ballast-comm-nccl) offers this table
 * through get_interface(state, "ballast.comm", 1). A communicator is created
 * collectively by every rank of a job from a rank, a world size and a
 * bootstrap address (torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT or
 * explicit values), and split into sub-communicators by colour and key.
 *
 * Every operation is non-blocking: start() returns a request, test() polls
 * it, wait() blocks on it; run() is the blocking wrapper. start() sets the
 * operation going where it can (the UCX plugin sends its first messages, the
 * NCCL plugin enqueues it on the stream), so that it travels while the
 * caller computes; test() and wait() move it on. Each operation has
 * a deadline: a dead, stopped or missing peer, or a peer that calls a
 * different operation, makes it fail with a message naming the rank and the
 * reason before the deadline has passed by much, never hang. After a failed
 * operation the communicator is unusable (every later call returns
 * BALLAST_ESTATE with the first failure's message); destroy it.
 *
 * Threads: a communicator and its requests belong to one thread at a time
 * (the caller serialises start/test/wait/destroy); abort() may be called from
 * any thread, also while another thread waits. Sub-communicators progress
 * independently of their parent.
 *
 * Operations in flight: a communicator takes up to info.max_in_flight
 * operations started and not yet completed by test() or wait() (start then
 * returns BALLAST_EFULL; a plugin that takes one says 1). Its collectives run
 * in the order they were started, every rank's in the same order, one after
 * the other (testing or waiting for any of them progresses those before
 * it); sends and receives run at once, beside them. An operation's deadline
 * counts from its start(), queued or not. When one fails, the others in
 * flight fail too, with its cause. A collective waiting behind another
 * leaves a record in state issued until it runs.
 *
 * Every operation leaves a record in the process's trace ring (trace.h)
 * unless tracing was turned off. */
#ifndef BALLAST_COMM_H
#define BALLAST_COMM_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BALLAST_COMM_INTERFACE "ballast.comm"
#define BALLAST_COMM_VERSION 1

/* Operations. The numbers are stable: they appear in trace rings. */
enum ballast_comm_op {
  BALLAST_OP_NONE = 0,
  BALLAST_OP_ALLREDUCE = 1,      /* count elements in sendbuf and recvbuf on every rank */
  BALLAST_OP_BROADCAST = 2,      /* count elements from root's sendbuf (or recvbuf if NULL) to every recvbuf */
  BALLAST_OP_REDUCE = 3,         /* count elements; the result only in root's recvbuf */
  BALLAST_OP_ALLGATHER = 4,      /* count elements per rank in; nranks*count out, rank order */
  BALLAST_OP_REDUCE_SCATTER = 5, /* nranks*count elements in; count out (block `rank`) */
  BALLAST_OP_ALLTOALL = 6,       /* nranks*count in and out; block i goes to rank i */
  BALLAST_OP_SEND = 7,           /* count elements of sendbuf to rank `root` */
  BALLAST_OP_RECV = 8,           /* count elements into recvbuf from rank `root` */
  BALLAST_OP_BARRIER = 9         /* no data */
};

enum ballast_comm_dtype {
  BALLAST_DT_F32 = 0,
  BALLAST_DT_F64 = 1,
  BALLAST_DT_F16 = 2,  /* IEEE half; reduced in float, rounded to nearest even */
  BALLAST_DT_BF16 = 3, /* bfloat16; reduced in float, rounded to nearest even */
  BALLAST_DT_I32 = 4,
  BALLAST_DT_I64 = 5,
  BALLAST_DT_U8 = 6, /* sum and prod wrap modulo 256 */
  BALLAST_DT_COUNT = 7
};

enum ballast_comm_redop {
  BALLAST_RED_SUM = 0,
  BALLAST_RED_PROD = 1,
  BALLAST_RED_MIN = 2,
  BALLAST_RED_MAX = 3,
  BALLAST_RED_COUNT = 4
};

/* Size in bytes of one element, 0 for an unknown dtype. Header-only, any thread. */
static inline uint32_t ballast_dtype_size(uint32_t dtype) {
  static const uint8_t sizes[BALLAST_DT_COUNT] = {4, 8, 2, 2, 4, 8, 1};
  return dtype < BALLAST_DT_COUNT ? sizes[dtype] : 0u;
}

/* Short stable names ("allreduce", "f32", "sum"); "?" when unknown. Any thread. */
static inline const char* ballast_op_name(uint32_t op) {
  static const char* const names[] = {"none",           "allreduce", "broadcast", "reduce", "allgather",
                                      "reduce_scatter", "alltoall",  "send",      "recv",   "barrier"};
  return op < sizeof names / sizeof names[0] ? names[op] : "?";
}
static inline const char* ballast_dtype_name(uint32_t dtype) {
  static const char* const names[BALLAST_DT_COUNT] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
  return dtype < BALLAST_DT_COUNT ? names[dtype] : "?";
}
static inline const char* ballast_redop_name(uint32_t redop) {
  static const char* const names[BALLAST_RED_COUNT] = {"sum", "prod", "min", "max"};
  return redop < BALLAST_RED_COUNT ? names[redop] : "?";
}

enum ballast_comm_flags {
  BALLAST_COMM_NO_TRACE = 1u << 0 /* leave no records in the trace ring */
};

/* How to create a world communicator. Zero/NULL/-1 fields take the
 * environment, then the default. Read only during init(). */
typedef struct ballast_comm_config {
  uint32_t size;           /* sizeof(ballast_comm_config) */
  uint32_t flags;          /* enum ballast_comm_flags; env BALLAST_TRACE=0 sets NO_TRACE */
  int32_t rank;            /* -1: env RANK */
  int32_t nranks;          /* 0: env WORLD_SIZE */
  const char* master_addr; /* NULL: env MASTER_ADDR, else "127.0.0.1" */
  int32_t master_port;     /* 0: env MASTER_PORT, else 29500; rank 0 listens there */
  int32_t reserved;
  int64_t timeout_ns;      /* default deadline of an operation; 0: env BALLAST_COMM_TIMEOUT_MS, else 300 s */
  int64_t init_timeout_ns; /* deadline of init (bootstrap); 0: the same as timeout_ns */
  const char* trace_dir;   /* NULL: env BALLAST_TRACE_DIR, else /dev/shm */
} ballast_comm_config;
#define BALLAST_COMM_CONFIG_V1_SIZE BALLAST_SIZE_TO(ballast_comm_config, trace_dir)

/* One operation. Buffers are the caller's and must stay valid and untouched
 * until the request completes; the plugin keeps no pointer afterwards.
 * Host memory for the UCX plugin, device memory for the NCCL plugin. */
typedef struct ballast_comm_args {
  uint32_t size;       /* sizeof(ballast_comm_args) */
  uint32_t op;         /* enum ballast_comm_op */
  uint32_t dtype;      /* enum ballast_comm_dtype */
  uint32_t redop;      /* enum ballast_comm_redop (allreduce, reduce, reduce_scatter) */
  const void* sendbuf; /* may equal recvbuf (in place) except for alltoall */
  void* recvbuf;
  uint64_t count; /* elements, as the op's comment in enum ballast_comm_op says */
  int32_t root;   /* root of broadcast/reduce, peer of send/recv; else ignored */
  int32_t reserved;
  int64_t timeout_ns; /* this operation's deadline from start; 0: the communicator's */
  void* stream;       /* NCCL plugin: the cudaStream_t to use, NULL = the comm's own; UCX: ignored */
} ballast_comm_args;
/* stream may be left out (NULL). */
#define BALLAST_COMM_ARGS_V1_SIZE BALLAST_SIZE_TO(ballast_comm_args, timeout_ns)

typedef struct ballast_comm_info {
  uint32_t size; /* sizeof(ballast_comm_info), set by the caller */
  int32_t rank;  /* rank in this communicator */
  int32_t nranks;
  int32_t world_rank;     /* rank in the world communicator it descends from */
  uint64_t comm_id;       /* equal on every member, distinct per communicator */
  uint64_t seq;           /* collectives started so far on this communicator */
  uint32_t max_in_flight; /* operations started and not yet completed it takes (see above) */
  uint32_t reserved;
} ballast_comm_info;
/* max_in_flight came later: a caller passing the shorter struct gets the rest. */
#define BALLAST_COMM_INFO_V1_SIZE BALLAST_SIZE_TO(ballast_comm_info, seq)

typedef struct ballast_comm ballast_comm;                 /* opaque */
typedef struct ballast_comm_request ballast_comm_request; /* opaque */

#define BALLAST_COMM_UNDEFINED (-1) /* split colour of a rank that joins no sub-communicator */

typedef struct ballast_comm_api {
  uint32_t size; /* sizeof(ballast_comm_api) */
  uint32_t reserved;

  /* Create the world communicator: collective over every rank of the job,
   * blocks until all joined or init_timeout_ns passed. cfg may be NULL (all
   * from the environment). *comm is owned by the caller: destroy() it. A
   * wrong world size, a rank given twice, a master that cannot be reached
   * or a port in use fail on every rank with a message saying so. state
   * (here and in last_error) may be NULL: an embedder reaching this table
   * through ballast_host_get_interface has none. */
  int (*init)(void* state, const ballast_comm_config* cfg, ballast_comm** comm);

  /* Collective over parent: ranks with the same colour form a new
   * communicator, ordered by (key, parent rank). colour
   * BALLAST_COMM_UNDEFINED gives *out = NULL. *out is owned by the caller and
   * must be destroyed before parent. Blocks until done or the deadline. */
  int (*split)(ballast_comm* parent, int32_t colour, int32_t key, ballast_comm** out);

  /* Free a communicator (an in-flight operation is cancelled). Not
   * collective; never blocks for long. comm may be NULL. Owner thread. */
  void (*destroy)(ballast_comm* comm);

  /* Make the in-flight and every later operation fail with BALLAST_EABORTED
   * and `reason` (may be NULL, copied). Any thread; returns at once. */
  int (*abort)(ballast_comm* comm, const char* reason);

  /* Fill *info (info->size set by the caller). Owner thread. */
  int (*info)(ballast_comm* comm, ballast_comm_info* info);

  /* Start an operation. On success *req is owned by the caller until test()
   * reports it done or wait() returns. Owner thread. */
  int (*start)(ballast_comm* comm, const ballast_comm_args* args, ballast_comm_request** req);

  /* Progress req; *done = 1 when it completed, then the return value is
   * its status and req is freed. Returns BALLAST_OK with *done = 0 while it
   * runs. Owner thread. */
  int (*test)(ballast_comm_request* req, int* done);

  /* Progress req until it completes or its deadline passes; frees req and
   * returns its status. Owner thread. */
  int (*wait)(ballast_comm_request* req);

  /* start + wait. Owner thread. */
  int (*run)(ballast_comm* comm, const ballast_comm_args* args);

  /* The message of the last failure of a call of this table on this thread,
   * "" if none. Valid until the next call on this thread. Any thread. The
   * same text reaches the host's last_error (plugin.h, "Errors"). */
  const char* (*last_error)(void* state);
} ballast_comm_api;
#define BALLAST_COMM_API_V1_SIZE BALLAST_SIZE_TO(ballast_comm_api, last_error)

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_COMM_H */
