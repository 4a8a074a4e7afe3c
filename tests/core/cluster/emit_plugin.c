/* emit: a test plugin that publishes `count` metric.sample events, `batch`
 * per tick of `period_ms`, each a batch of one sample whose value is its
 * index (1, 2, ...). The cluster tests count what reached the controller. */
#include <ballast/events.h>
#include <ballast/plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct emit {
  const ballast_host_api* host;
  uint64_t count, sent, batch, period_ms, timer;
  int has_timer;
} emit;

static uint64_t config_u64(const ballast_host_api* host, const char* key, uint64_t fallback) {
  const char* v = NULL;
  if (host->config_get(host, key, &v) != BALLAST_OK || v == NULL) return fallback;
  return strtoull(v, NULL, 10);
}

static void on_tick(void* user) {
  emit* e = (emit*)user;
  for (uint64_t i = 0; i < e->batch && e->sent < e->count; ++i) {
    ballast_metric_sample s;
    ballast_metric_batch b;
    ballast_event ev;
    memset(&s, 0, sizeof s);
    s.metric = "test.index";
    s.value = (double)(e->sent + 1);
    s.ts_ns = e->host->now_ns(e->host);
    b.size = sizeof b;
    b.count = 1;
    b.samples = &s;
    memset(&ev, 0, sizeof ev);
    ev.size = sizeof ev;
    ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
    ev.topic = "metric.sample";
    ev.source.rank = -1;
    ev.payload = &b;
    ev.payload_size = sizeof b;
    if (e->host->publish(e->host, &ev) != BALLAST_OK) return;
    e->sent++;
    e->host->counter_add(e->host, "published", 1);
  }
}

static int emit_create(const ballast_host_api* host, void** state) {
  emit* e = (emit*)calloc(1, sizeof *e);
  if (e == NULL) return BALLAST_ENOMEM;
  e->host = host;
  e->count = config_u64(host, "count", 1000);
  e->batch = config_u64(host, "batch", 10);
  e->period_ms = config_u64(host, "period_ms", 10);
  *state = e;
  return BALLAST_OK;
}

static int emit_start(void* state) {
  emit* e = (emit*)state;
  int rc = e->host->timer_start(e->host, e->period_ms * 1000000ull, on_tick, e, &e->timer);
  e->has_timer = rc == BALLAST_OK;
  return rc;
}

static void emit_stop(void* state) {
  emit* e = (emit*)state;
  if (e->has_timer) e->host->timer_cancel(e->host, e->timer);
  e->has_timer = 0;
}

static void emit_destroy(void* state) { free(state); }

static const ballast_plugin_descriptor descriptor = {sizeof(ballast_plugin_descriptor),
                                                     BALLAST_ABI_MAJOR,
                                                     BALLAST_ABI_MINOR,
                                                     0,
                                                     "emit",
                                                     "1",
                                                     "test",
                                                     "publishes numbered metric.sample events (cluster tests)",
                                                     emit_create,
                                                     emit_start,
                                                     emit_stop,
                                                     emit_destroy,
                                                     NULL,
                                                     NULL};

BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return &descriptor;
}
