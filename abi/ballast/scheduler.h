/* Ballast C ABI: interface "ballast.scheduler" v1, topology-aware placement.
 *
 * A plugin offering this interface places a training job's nodes on a
 * cluster's network topology and replaces failed nodes of a placed job.
 * The job is a matrix of nodes (after Arnold, arXiv 2509.15940): rows are
 * PP groups (dp_row), columns are DP groups (pp_stage); placement minimises
 * alpha * (max DP-group spread) + (1 - alpha) * (max PP-group spread), where
 * a group's spread is the number of minipods it touches, 0 when it fits in
 * one. Results are ballast_placement_plan (events.h), nodes in global-rank
 * order (Megatron's: TP fastest, then DP, then PP).
 *
 * Get the table with get_interface(state, BALLAST_SCHEDULER_INTERFACE,
 * BALLAST_SCHEDULER_VERSION). The bundled scheduler plugin offers it and
 * also answers `placement.request` events (BALLAST_SCHEMA_JSON, an object
 * {"job", "topology", "state"?, "algorithm"?, "seed"?, "replace"?}) with
 * `placement.plan` events. */
#ifndef BALLAST_SCHEDULER_H
#define BALLAST_SCHEDULER_H

#include "events.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BALLAST_SCHEDULER_INTERFACE "ballast.scheduler"
#define BALLAST_SCHEDULER_VERSION 1

/* What to place. Strings are UTF-8, owned by the caller, read during the
 * call only. */
typedef struct ballast_placement_request {
  uint32_t size;             /* sizeof(ballast_placement_request) */
  uint32_t reserved;         /* 0 */
  const char* topology_path; /* Slurm topology.conf or topology.yaml (tree or block) */
  const char* job_json;      /* {"gpus_per_node","tp","pp","dp","alpha"?,"model"?,"name"?} */
  const char* state_json;    /* {"busy":[hostlist...],"faulty":[hostlist...]}, or NULL: all free */
  const char* algorithm;     /* "arnold" (NULL), "exact", "heuristic", "best-fit", "random-fit", "slurm-tree" */
  uint64_t seed;             /* same input and seed give the same plan */
} ballast_placement_request;
#define BALLAST_PLACEMENT_REQUEST_V1_SIZE BALLAST_SIZE_TO(ballast_placement_request, seed)

/* Which nodes of a placed job failed, and where spares may come from. */
typedef struct ballast_replacement_request {
  uint32_t size;             /* sizeof(ballast_replacement_request) */
  uint32_t reserved;         /* 0 */
  const char* topology_path; /* the topology the plan was made on */
  const char* state_json;    /* as in ballast_placement_request, or NULL */
  const char* plan_json;     /* the plan, as plan_json() or `ballast plan --json` gives it */
  const char* failed;        /* hostlist of failed nodes, e.g. "gpu[003,017]" */
  const char* spares;        /* hostlist of allowed spares, or NULL: every free node outside the plan */
} ballast_replacement_request;
#define BALLAST_REPLACEMENT_REQUEST_V1_SIZE BALLAST_SIZE_TO(ballast_replacement_request, spares)

typedef struct ballast_scheduler_api {
  uint32_t size; /* sizeof(ballast_scheduler_api) */
  uint32_t reserved;

  /* Place a job. On success *plan is a new plan owned by the caller, freed
   * with free_plan. On failure (BALLAST_EINVAL, BALLAST_EFORMAT for bad
   * input naming file and line, BALLAST_ENOTFOUND for a missing file) the
   * message is left with the host's set_error / last_error. Any thread;
   * calls may run concurrently. */
  int (*place)(void* state, const ballast_placement_request* request, ballast_placement_plan** plan);

  /* Replace failed nodes: only their cells change (no other rank moves),
   * each taking the spare whose minipod keeps the objective lowest. *plan
   * as for place(). Any thread. */
  int (*replace)(void* state, const ballast_replacement_request* request, ballast_placement_plan** plan);

  /* The plan as one JSON object (the `ballast plan --json` form), for a plan
   * returned by place() or replace(); valid until free_plan. Any thread. */
  const char* (*plan_json)(void* state, const ballast_placement_plan* plan);

  /* Free a plan returned by place() or replace(); NULL is ignored. */
  void (*free_plan)(void* state, ballast_placement_plan* plan);
} ballast_scheduler_api;
#define BALLAST_SCHEDULER_API_V1_SIZE BALLAST_SIZE_TO(ballast_scheduler_api, free_plan)

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_SCHEDULER_H */
