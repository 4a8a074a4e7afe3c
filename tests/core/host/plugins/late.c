/* A plugin for the stop() contract of plugin.h: it runs a 1 ms timer,
 * counts the ticks that come while its stop() runs, and offers "test.late"
 * v1, a table whose publish() publishes through its host table at any time,
 * also after stop() returned. */
#include <ballast/plugin.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct late_api {
  uint32_t size;
  int (*publish)(void);
  int (*ticks_during_stop)(void);
  int (*cancel_again)(void);
} late_api;

static const ballast_host_api* g_host;
static uint64_t g_timer;
static atomic_int g_stopping;
static atomic_int g_ticks_during_stop;

static void tick(void* user) {
  (void)user;
  if (atomic_load(&g_stopping)) atomic_fetch_add(&g_ticks_during_stop, 1);
}

static int publish_now(void) {
  ballast_event e = {0};
  e.size = sizeof e;
  e.schema = BALLAST_SCHEMA_NONE;
  e.topic = "late.event";
  e.source.rank = -1;
  return g_host->publish(g_host, &e);
}
static int ticks_during_stop(void) { return atomic_load(&g_ticks_during_stop); }
static int cancel_again(void) { return g_host->timer_cancel(g_host, g_timer); }

static const late_api api = {sizeof api, publish_now, ticks_during_stop, cancel_again};

static int late_create(const ballast_host_api* host, void** state) {
  g_host = host;
  *state = (void*)&api;
  return BALLAST_OK;
}
static int late_start(void* state) {
  (void)state;
  return g_host->timer_start(g_host, 1000000, tick, NULL, &g_timer);
}
static void late_stop(void* state) {
  (void)state;
  atomic_store(&g_stopping, 1);
  struct timespec ts = {0, 50 * 1000000};
  nanosleep(&ts, NULL); /* 50 ticks' worth, were the timer still running */
}
static void late_destroy(void* state) { (void)state; }
static const void* late_interface(void* state, const char* name, uint32_t version) {
  (void)state;
  if (name == NULL || version != 1) return NULL;
  const char* want = "test.late";
  for (int i = 0;; ++i) {
    if (name[i] != want[i]) return NULL;
    if (name[i] == '\0') return &api;
  }
}

static const ballast_plugin_descriptor descriptor = {sizeof descriptor,
                                                     BALLAST_ABI_MAJOR,
                                                     BALLAST_ABI_MINOR,
                                                     0,
                                                     "late",
                                                     "1.0",
                                                     "test",
                                                     "checks what the host does around stop()",
                                                     late_create,
                                                     late_start,
                                                     late_stop,
                                                     late_destroy,
                                                     late_interface,
                                                     NULL};

BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return &descriptor;
}
