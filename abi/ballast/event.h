/* Ballast C ABI: the event, the unit that travels on the bus.
 *
 * An event is a topic, a timestamp, a source, a schema id and a payload.
 * Topics are dotted lowercase names ("fault.confirmed"); a subscription
 * matches a topic exactly, or by prefix when its pattern ends in ".*"
 * ("fault.*" matches "fault.suspected" and "fault.confirmed"), or everything
 * with "*". Well-known payloads are the structs of events.h, each with its
 * schema id; a plugin may publish opaque bytes under its own schema id
 * (>= BALLAST_SCHEMA_CUSTOM), or JSON text under BALLAST_SCHEMA_JSON. */
#ifndef BALLAST_EVENT_H
#define BALLAST_EVENT_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Schema ids of payloads. The struct behind each id is in events.h. */
enum ballast_schema {
  BALLAST_SCHEMA_NONE = 0,              /* no payload */
  BALLAST_SCHEMA_JSON = 1,              /* UTF-8 JSON text, payload_size bytes, no NUL needed */
  BALLAST_SCHEMA_METRIC_BATCH = 2,      /* ballast_metric_batch */
  BALLAST_SCHEMA_OP_TIMING_BATCH = 3,   /* ballast_op_timing_batch */
  BALLAST_SCHEMA_COLLECTIVE_RECORD = 4, /* ballast_collective_record */
  BALLAST_SCHEMA_FAULT_REPORT = 5,      /* ballast_fault_report */
  BALLAST_SCHEMA_PLACEMENT_PLAN = 6,    /* ballast_placement_plan */
  BALLAST_SCHEMA_RECOVERY_ACTION = 7,   /* ballast_recovery_action */
  BALLAST_SCHEMA_STARTUP_STAGE = 8,     /* ballast_startup_stage */
  BALLAST_SCHEMA_STRAGGLER_REPORT = 9,  /* ballast_straggler_report */
  BALLAST_SCHEMA_CUSTOM = 0x10000       /* first id free for plugins' own opaque bytes */
};

/* Where an event comes from. Strings may be NULL (unknown); rank is -1 when
 * the event does not concern one rank. */
typedef struct ballast_source {
  const char* node;   /* host name of the machine */
  int32_t rank;       /* global rank of the training process, or -1 */
  const char* plugin; /* the publishing plugin's name, filled by the host */
} ballast_source;

/* One event. Ownership: the publisher owns every pointer; the bus does not
 * copy an event for inline delivery, and copies it (deeply, for well-known
 * schemas) for queued delivery. A handler may read an event only during its
 * call; it must copy what it keeps. */
typedef struct ballast_event {
  uint32_t size;     /* sizeof(ballast_event) as the publisher compiled it */
  uint32_t schema;   /* enum ballast_schema or a custom id */
  const char* topic; /* dotted name, NUL-terminated, never NULL */
  int64_t ts_ns;     /* wall-clock ns since the Unix epoch; 0 = the host fills "now" */
  ballast_source source;
  const void* payload;   /* NULL when payload_size is 0 */
  uint64_t payload_size; /* bytes: sizeof the struct for well-known schemas */
} ballast_event;
#define BALLAST_EVENT_V1_SIZE BALLAST_SIZE_TO(ballast_event, payload_size)

/* A subscriber's handler. Called inline in the publisher's thread or from a
 * dispatcher thread (queued). Must not throw or longjmp; must not block for
 * long when inline. The return value is counted as a handler failure when
 * negative and otherwise ignored. */
typedef int (*ballast_handler)(void* user, const ballast_event* event);

/* Delivery options of a subscription. */
enum ballast_delivery {
  BALLAST_DELIVER_INLINE = 0, /* in the publisher's thread, no copy, no allocation */
  BALLAST_DELIVER_QUEUED = 1  /* through a bounded queue drained by a dispatcher thread */
};

enum ballast_subscribe_flags {
  BALLAST_SUBSCRIBE_LOSSY = 1u << 0 /* queued: drop (and count) instead of blocking the publisher */
};

typedef struct ballast_subscribe_options {
  uint32_t size;           /* sizeof(ballast_subscribe_options) */
  uint32_t delivery;       /* enum ballast_delivery */
  uint32_t flags;          /* enum ballast_subscribe_flags */
  uint32_t queue_capacity; /* queued only: slots, 0 = the host's default (4096) */
} ballast_subscribe_options;
/* flags and queue_capacity may be left out (0). */
#define BALLAST_SUBSCRIBE_OPTIONS_V1_SIZE BALLAST_SIZE_TO(ballast_subscribe_options, delivery)

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_EVENT_H */
