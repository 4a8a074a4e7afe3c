/* Ballast C ABI: the well-known event payloads.
 *
 * Plain C structs, each starting with its size, each with its v1 minimum
 * size (status.h, "Sizes"): a reader accepts a payload whose size field and
 * payload_size are at least that, and reads a field only when `size` covers
 * it. Fields after the v1 minimum may be left out: they then read as their
 * default (0, NULL). Arrays of element structs (samples, ops, nodes,
 * culprits) have the element layout of v1.0 and never grow. All strings
 * are UTF-8 and NUL-terminated; a NULL string means "not given". Pointers are
 * owned by the publisher and live for the handler call (see event.h).
 *
 * Usual topics: metric.sample, step.timing, collective.record,
 * collective.progress, fault.suspected, fault.confirmed, node.silent,
 * straggler.report, placement.request, placement.plan, recovery.action,
 * policy.error, job.state, startup.stage. */
#ifndef BALLAST_EVENTS_H
#define BALLAST_EVENTS_H

#include "event.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- metric.sample: BALLAST_SCHEMA_METRIC_BATCH ------------------------ */

enum ballast_sample_flags {
  BALLAST_SAMPLE_COUNTER = 1u << 0,      /* value is a monotonic counter's rate/delta source */
  BALLAST_SAMPLE_INVALID = 1u << 1,      /* NaN or infinite reading: value is not data */
  BALLAST_SAMPLE_COUNTER_RESET = 1u << 2 /* the counter went backwards: value is not data */
};

typedef struct ballast_metric_sample {
  const char* node;   /* machine the value was measured on */
  const char* metric; /* e.g. "cpu.user", "net.eth0.rx_bytes", "gpu0.util" */
  int64_t ts_ns;      /* when it was measured, wall clock */
  double value;
  uint32_t flags; /* enum ballast_sample_flags */
} ballast_metric_sample;

typedef struct ballast_metric_batch {
  uint32_t size;                        /* sizeof(ballast_metric_batch) */
  uint32_t count;                       /* entries in samples */
  const ballast_metric_sample* samples; /* count entries */
} ballast_metric_batch;
#define BALLAST_METRIC_BATCH_V1_SIZE BALLAST_SIZE_TO(ballast_metric_batch, samples)

/* ---- step.timing: BALLAST_SCHEMA_OP_TIMING_BATCH ----------------------- */

/* One operation of one rank, in the columns of the straggler traces:
 * dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, mb_id, gmc.
 * A whole step may be sent as one op with optype "step". */
typedef struct ballast_op_timing {
  int32_t dp_rank;
  int32_t stage; /* pipeline stage */
  int32_t rank;  /* global rank */
  int64_t step;
  const char* optype; /* "forward-compute", "grads-reduce-scatter", ... */
  double start_s;     /* start, seconds (any common epoch within one job) */
  double duration_s;
  int32_t seq_id; /* n-th op of this type in this step on this rank */
  int32_t mc;     /* model chunk within the stage, or -1 */
  int32_t mb_id;  /* micro-batch of compute ops, or -1 */
  int32_t gmc;    /* global model chunk index, or -1 */
} ballast_op_timing;

typedef struct ballast_op_timing_batch {
  uint32_t size;
  uint32_t count;
  const ballast_op_timing* ops;
} ballast_op_timing_batch;
#define BALLAST_OP_TIMING_BATCH_V1_SIZE BALLAST_SIZE_TO(ballast_op_timing_batch, ops)

/* ---- collective.record / collective.progress: BALLAST_SCHEMA_COLLECTIVE_RECORD */

enum ballast_collective_state {
  BALLAST_COLL_ISSUED = 0,
  BALLAST_COLL_STARTED = 1,
  BALLAST_COLL_DONE = 2,
  BALLAST_COLL_FAILED = 3
};

typedef struct ballast_collective_record {
  uint32_t size;
  uint32_t state;        /* enum ballast_collective_state */
  uint64_t comm_id;      /* communicator id, equal on every member */
  uint64_t seq;          /* per-communicator sequence number, from 1 */
  const char* op;        /* "allreduce", "broadcast", "send", ... */
  const char* dtype;     /* "f32", "bf16", ... */
  const char* algorithm; /* "ring", "recursive_doubling", ... */
  uint64_t count;        /* elements */
  uint64_t bytes;
  int32_t rank; /* rank within the communicator */
  int32_t nranks;
  int32_t peer;                       /* root (rooted ops) or peer (send/recv), or -1 */
  int32_t status;                     /* BALLAST_OK or the failure */
  int64_t issue_ns, start_ns, end_ns; /* 0 when not reached yet */
  uint64_t chunks_posted, chunks_sent, chunks_received, chunks_reduced; /* 0: none counted */
} ballast_collective_record;
/* The chunk counters may be left out. */
#define BALLAST_COLLECTIVE_RECORD_V1_SIZE BALLAST_SIZE_TO(ballast_collective_record, end_ns)

/* ---- fault.suspected / fault.confirmed / node.silent: BALLAST_SCHEMA_FAULT_REPORT */

enum ballast_fault_stage { BALLAST_FAULT_SUSPECTED = 0, BALLAST_FAULT_CONFIRMED = 1 };

typedef struct ballast_fault_report {
  uint32_t size;
  uint32_t stage;       /* enum ballast_fault_stage */
  const char* subject;  /* node name, or "rank:N" */
  int32_t rank;         /* the rank concerned, or -1 */
  const char* kind;     /* "outlier", "silent", "crashed", "stuck", "not_joined", "slow", "mismatch", ... */
  const char* metric;   /* the metric that gave it away, or NULL */
  double score;         /* detector's score (normalised distance, ...) */
  double confidence;    /* 0..1 */
  int64_t since_ns;     /* first time the evidence held */
  int64_t detected_ns;  /* when the report was raised */
  const char* evidence; /* JSON text with the detector's details, or NULL */
  const char* detector; /* "machine", "hang", ..., or NULL */
} ballast_fault_report;
/* evidence and detector may be left out. */
#define BALLAST_FAULT_REPORT_V1_SIZE BALLAST_SIZE_TO(ballast_fault_report, detected_ns)

/* ---- placement.plan: BALLAST_SCHEMA_PLACEMENT_PLAN --------------------- */

typedef struct ballast_placement_node {
  const char* name;
  int32_t pp_stage;
  int32_t dp_row;
  int32_t first_rank; /* global rank of the node's first GPU */
} ballast_placement_node;

typedef struct ballast_placement_plan {
  uint32_t size;
  uint32_t count; /* entries in nodes */
  const char* job;
  const char* algorithm;
  const ballast_placement_node* nodes; /* in global-rank order */
  int32_t max_dp_spread;
  int32_t max_pp_spread;
  double objective;
  double lower_bound;
} ballast_placement_plan;
#define BALLAST_PLACEMENT_PLAN_V1_SIZE BALLAST_SIZE_TO(ballast_placement_plan, lower_bound)

/* ---- recovery.action: BALLAST_SCHEMA_RECOVERY_ACTION ------------------- */

typedef struct ballast_recovery_action {
  uint32_t size;
  uint32_t reserved;
  const char* action;      /* "restart", "evict", "replace", "rollback", "checkpoint_now", "pause", "escalate" */
  const char* subject;     /* node or rank it applies to, or NULL for the job */
  const char* reason;      /* human-readable why */
  const char* args;        /* JSON object with the action's arguments, or NULL */
  const char* policy;      /* the policy that decided it */
  const char* cause_topic; /* topic of the event that triggered it, or NULL */
} ballast_recovery_action;
/* cause_topic may be left out. */
#define BALLAST_RECOVERY_ACTION_V1_SIZE BALLAST_SIZE_TO(ballast_recovery_action, policy)

/* ---- startup.stage: BALLAST_SCHEMA_STARTUP_STAGE ----------------------- */

typedef struct ballast_startup_stage {
  uint32_t size;
  int32_t status;    /* BALLAST_OK or the failure */
  const char* stage; /* "environment", "file_warmup", "checkpoint_load", "comm_init", "first_step" */
  const char* node;
  int32_t rank;
  int64_t start_ns, end_ns;
  uint64_t bytes; /* bytes read or restored, 0 if not applicable */
} ballast_startup_stage;
/* bytes may be left out. */
#define BALLAST_STARTUP_STAGE_V1_SIZE BALLAST_SIZE_TO(ballast_startup_stage, end_ns)

/* ---- straggler.report: BALLAST_SCHEMA_STRAGGLER_REPORT ----------------- */

typedef struct ballast_straggler_culprit {
  const char* dimension; /* "optype", "stage", "dp_rank", "rank" */
  const char* name;      /* "forward-compute", "3", ... */
  double slowdown;       /* slowdown attributed to it */
} ballast_straggler_culprit;

typedef struct ballast_straggler_report {
  uint32_t size;
  uint32_t count;  /* entries in culprits, worst first */
  double slowdown; /* S: actual / ideal step time */
  double launch_slowdown;
  const char* kind; /* "worker", "stage", "random", "none" */
  const ballast_straggler_culprit* culprits;
  int64_t first_step, last_step;
} ballast_straggler_report;
#define BALLAST_STRAGGLER_REPORT_V1_SIZE BALLAST_SIZE_TO(ballast_straggler_report, last_step)

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_EVENTS_H */
