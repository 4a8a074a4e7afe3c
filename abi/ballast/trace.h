/* Ballast C ABI: the collective trace ring, a file in shared memory.
 *
 * Every comm plugin that runs collectives in a process writes one ring file,
 * "<dir>/rank-<R>.<pid>.<writer>.btrace" (dir: BALLAST_TRACE_DIR, else
 * /dev/shm; writer: the plugin, "ucx" or "nccl"), created at its first
 * communicator and kept after the process ends, so that an observer (the
 * hang detector, `ballast analyze`) can read it while the process runs, is
 * stopped (SIGSTOP) or is gone. Readers take every "*.btrace" file and merge
 * those of one process. A writer makes the file complete under another name
 * and renames it into place. The bundled writers, making theirs, remove from
 * the folder the rings of ended processes of their host, idle for 10
 * minutes, beyond the newest 64 (BALLAST_TRACE_KEEP: another count, or
 * "all" to keep every one). The file is a header followed by slot_count
 * slots; the layout below is the contract.
 *
 * Writer (one process, several threads): claim index i = head++ (atomic).
 * On the first lap (i < slot_count) slot[i] is the writer's. After, the
 * writer takes slot[i % slot_count] only when it holds a published record
 * that has ended (gen g not 0, state done or failed), by exchanging its gen
 * from g to 0 (compare-and-swap); else (a record still in flight, one being
 * written, or another writer won the exchange) it leaves the slot: add 1 to
 * skipped and claim again; after slot_count such tries in a row the
 * operation goes unrecorded: add 1 to dropped. It fills the fields, then
 * stores gen = i + 1 with release order. While the operation runs it
 * updates the progress fields and progress_tick in place (plain 64-bit
 * stores), and finally end_tick and state. No locks, no system calls, no
 * allocation.
 *
 * Reader: load skipped, then head (acquire); for each slot: read gen, copy
 * the slot, read gen again; when both reads give the same g > 0, the copy is
 * record g - 1. The ring holds the records of the last slot_count claims and
 * older ones still in flight; the overflow, records overwritten by newer
 * ones, is head - skipped - min(head, slot_count). Record i alone: slot
 * i % slot_count, whose gen must read i + 1 both times.
 *
 * Times are ticks of the writer's clock; convert with
 * wall_ns = clock_wall_ns + (tick - clock_tick) * ns_per_tick. The bundled
 * comm plugins write CLOCK_MONOTONIC nanoseconds (ns_per_tick = 1), read
 * exactly or, where the kernel does not count time with the TSC, for the
 * end of an operation under 64 KiB, coarsely (steps of a few ms, never
 * before its start; exact with BALLAST_TRACE_EXACT=1). Progress fields are
 * refreshed every few microseconds of a running operation, not per chunk.
 * Readers on the same host may compare those ticks with their own
 * CLOCK_MONOTONIC. Other writers must say so through clock_wall_ns,
 * clock_tick and ns_per_tick. */
#ifndef BALLAST_TRACE_H
#define BALLAST_TRACE_H

#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BALLAST_TRACE_MAGIC UINT64_C(0x3143415254424c42) /* "BLBTRAC1" little-endian */
#define BALLAST_TRACE_VERSION 1
#define BALLAST_TRACE_SUFFIX ".btrace"

enum ballast_trace_algorithm {
  BALLAST_ALGO_NONE = 0,
  BALLAST_ALGO_LOCAL = 1, /* one rank: a copy */
  BALLAST_ALGO_RECURSIVE_DOUBLING = 2,
  BALLAST_ALGO_RING = 3,
  BALLAST_ALGO_BINOMIAL_TREE = 4,
  BALLAST_ALGO_PAIRWISE = 5,
  BALLAST_ALGO_DISSEMINATION = 6,
  BALLAST_ALGO_DIRECT = 7, /* one message (send/recv) */
  BALLAST_ALGO_NCCL = 8    /* chosen inside NCCL */
};

static inline const char* ballast_algorithm_name(uint32_t algo) {
  static const char* const names[] = {
      "none", "local", "recursive_doubling", "ring", "binomial_tree", "pairwise", "dissemination", "direct", "nccl"};
  return algo < sizeof names / sizeof names[0] ? names[algo] : "?";
}

/* Slot states: the values of enum ballast_collective_state (events.h). */
#define BALLAST_TRACE_ISSUED 0u
#define BALLAST_TRACE_STARTED 1u
#define BALLAST_TRACE_DONE 2u
#define BALLAST_TRACE_FAILED 3u

enum ballast_trace_slot_flags {
  BALLAST_TRACE_P2P = 1u << 0 /* send/recv: seq counts this pair's messages, not collectives */
};

/* 256 bytes at offset 0 of the file. */
typedef struct ballast_trace_header {
  uint64_t magic;       /* BALLAST_TRACE_MAGIC */
  uint32_t version;     /* BALLAST_TRACE_VERSION */
  uint32_t header_size; /* offset of slot 0 (256) */
  uint32_t slot_size;   /* sizeof(ballast_trace_slot) (192) */
  uint32_t slot_count;  /* a power of two */
  int32_t pid;
  int32_t rank;          /* global rank (RANK), -1 unknown */
  int32_t nranks;        /* world size, 0 unknown */
  uint32_t closed;       /* 1 once the process shut its communicators down cleanly */
  int64_t clock_wall_ns; /* wall clock (ns since the epoch) at clock_tick */
  uint64_t clock_tick;
  double ns_per_tick;
  uint64_t head;           /* atomic: records ever claimed */
  uint64_t heartbeat_tick; /* atomic: last time the process's comm code ran */
  char host[64];           /* the writer's host name */
  uint64_t skipped;        /* atomic: indices claimed and left (their slot in flight or being written) */
  uint64_t dropped;        /* atomic: operations unrecorded, every slot in flight */
  uint8_t reserved[256 - 160];
} ballast_trace_header;

/* One operation, 192 bytes. */
typedef struct ballast_trace_slot {
  uint64_t gen;       /* atomic: record index + 1, 0 while being (re)written */
  uint64_t comm_id;   /* equal on every member of the communicator */
  uint64_t seq;       /* per communicator, from 1 (per peer pair for P2P) */
  uint64_t count;     /* elements (per rank where the op says so) */
  uint64_t bytes;     /* bytes this rank contributes */
  uint32_t op;        /* enum ballast_comm_op */
  uint32_t dtype;     /* enum ballast_comm_dtype */
  uint32_t redop;     /* enum ballast_comm_redop */
  uint32_t algorithm; /* enum ballast_trace_algorithm */
  int32_t rank;       /* rank in the communicator */
  int32_t nranks;
  int32_t world_rank;
  int32_t peer;      /* root (rooted ops), peer (send/recv), else -1 */
  uint32_t state;    /* atomic: BALLAST_TRACE_* */
  int32_t status;    /* final status (BALLAST_OK or a failure) */
  uint32_t flags;    /* enum ballast_trace_slot_flags */
  int32_t wait_peer; /* rank of the oldest unfinished receive, -1 none */
  int32_t send_peer; /* rank of the oldest unfinished send, -1 none */
  uint32_t steps;    /* steps of the algorithm */
  uint32_t step;     /* current step */
  uint32_t reserved0;
  uint64_t issue_tick;
  uint64_t start_tick;
  uint64_t end_tick;      /* 0 while in flight */
  uint64_t progress_tick; /* last time a chunk completed, to within a few ms */
  uint64_t chunks_total;  /* chunks this rank sends plus receives */
  uint64_t chunks_posted;
  uint64_t chunks_sent;
  uint64_t chunks_received;
  uint64_t chunks_reduced;
  uint64_t bytes_sent;
  uint64_t bytes_received;
} ballast_trace_slot;

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_TRACE_H */
