/* A plugin built against headers of another 1.x minor (tests/abi/CMakeLists.txt
 * makes them): ballast_fault_report one field shorter than today's (no
 * detector) or one field longer (an appended `extra`), ballast_host_api
 * without node_name and fence_action (1.0) or with one function more. At
 * start it publishes one fault.confirmed report of its own struct's size,
 * subscribes with options of its own size and, when the host's table has it
 * (1.2), asks fence_action whether it may act; what the host answered goes
 * to its counters. */
#include <ballast/events.h>
#include <ballast/plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct compat {
  const ballast_host_api* host;
  uint64_t subscription;
} compat;

static int on_event(void* user, const ballast_event* event) {
  (void)user;
  (void)event;
  return BALLAST_OK;
}

static int compat_create(const ballast_host_api* host, void** state) {
  compat* c = calloc(1, sizeof *c);
  if (c == NULL) return BALLAST_ENOMEM;
  c->host = host;
#ifndef COMPAT_SHORTER
  /* The host's node name, when the host's table has it (1.1). */
  if (BALLAST_COVERS(host->size, ballast_host_api, node_name) && strcmp(host->node_name(host), "abi-node") == 0)
    host->counter_add(host, "node_named", 1);
#endif
  *state = c;
  return BALLAST_OK;
}

static int compat_start(void* state) {
  compat* c = state;
  ballast_fault_report r = {0};
  r.size = sizeof r;
  r.stage = BALLAST_FAULT_CONFIRMED;
  r.subject = "node7";
  r.rank = 3;
  r.kind = "outlier";
  r.metric = "cpu.user";
  r.score = 6.5;
  r.confidence = 0.9;
  r.since_ns = 1000;
  r.detected_ns = 2000;
  r.evidence = "{\"z\":6.5}";
#ifndef COMPAT_SHORTER
  r.detector = "compat";
#endif
#ifdef COMPAT_LONGER
  r.extra = "from a later minor";
#endif
  ballast_event e = {0};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_FAULT_REPORT;
  e.topic = "fault.confirmed";
  e.source.rank = -1;
  e.payload = &r;
  e.payload_size = sizeof r;
  int rc = c->host->publish(c->host, &e);
  c->host->counter_add(c->host, rc == BALLAST_OK ? "published" : "refused", 1);
  if (rc != BALLAST_OK) c->host->log(c->host, BALLAST_LOG_ERROR, c->host->last_error(c->host));

  ballast_subscribe_options o = {0};
  o.size = sizeof o;
  o.delivery = BALLAST_DELIVER_QUEUED;
  rc = c->host->subscribe(c->host, "compat.*", &o, on_event, c, &c->subscription);
  c->host->counter_add(c->host, rc == BALLAST_OK ? "subscribed" : "subscribe_refused", 1);
#ifndef COMPAT_SHORTER
  if (BALLAST_COVERS(c->host->size, ballast_host_api, fence_action)) {
    rc = c->host->fence_action(c->host, "compat.act", "{\"node\":\"node7\",\"why\":\"test\"}");
    c->host->counter_add(c->host,
                         rc == BALLAST_OK        ? "fence_ok"
                         : rc == BALLAST_EFENCED ? "fence_fenced"
                                                 : "fence_error",
                         1);
    if (rc != BALLAST_OK) c->host->log(c->host, BALLAST_LOG_WARN, c->host->last_error(c->host));
  }
#endif
  return BALLAST_OK;
}

static void compat_destroy(void* state) { free(state); }

static const ballast_plugin_descriptor descriptor = {sizeof descriptor,
                                                     BALLAST_ABI_MAJOR,
                                                     BALLAST_ABI_MINOR,
                                                     0,
                                                     COMPAT_NAME,
                                                     "1.0",
                                                     "test",
                                                     "publishes a fault report of another minor's size",
                                                     compat_create,
                                                     compat_start,
                                                     NULL,
                                                     compat_destroy,
                                                     NULL,
                                                     NULL};

BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return &descriptor;
}
