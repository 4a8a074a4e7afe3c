/* hello: a Ballast plugin in plain C99.
 *
 * It subscribes to `fault.suspected` and, for each suspicion, publishes a
 * `hello.seen` event (JSON) naming the subject, and counts it. With config
 * key `period_ms` it also publishes a `hello.tick` heartbeat from a timer.
 * It depends on the ABI headers only; it never links libballast. */
#include <ballast/events.h>
#include <ballast/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hello {
  const ballast_host_api* host;
  const char* greeting; /* from config, owned by the host */
  uint64_t subscription;
  uint64_t timer;
  int has_timer;
  uint64_t period_ns;
} hello;

/* Writes s as a JSON string (quoted; '"', '\\' and control characters
 * escaped; other bytes as they are) at out, which has room for
 * json_string_size(s) bytes; returns the end. */
static size_t json_string_size(const char* s) { return 6 * strlen(s) + 3; }

static char* json_string(char* out, const char* s) {
  static const char hex[] = "0123456789abcdef";
  *out++ = '"';
  for (; *s; ++s) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      *out++ = '\\';
      *out++ = (char)c;
    } else if (c < 0x20) {
      *out++ = '\\';
      *out++ = 'u';
      *out++ = '0';
      *out++ = '0';
      *out++ = hex[c >> 4];
      *out++ = hex[c & 15];
    } else {
      *out++ = (char)c;
    }
  }
  *out++ = '"';
  *out = '\0';
  return out;
}

static int on_suspected(void* user, const ballast_event* ev) {
  hello* h = (hello*)user;
  const ballast_fault_report* report = (const ballast_fault_report*)ev->payload;
  const char* subject = "unknown";
  char* json;
  char* end;
  int rc;
  ballast_event out;
  if (ev->schema == BALLAST_SCHEMA_FAULT_REPORT && report != NULL && report->subject != NULL) subject = report->subject;
  /* The greeting comes from the config and the subject from another plugin:
   * either may hold quotes or control characters. */
  json = (char*)malloc(32 + json_string_size(h->greeting) + json_string_size(subject));
  if (json == NULL) return BALLAST_ENOMEM;
  end = json + sprintf(json, "{\"greeting\":");
  end = json_string(end, h->greeting);
  end += sprintf(end, ",\"subject\":");
  end = json_string(end, subject);
  end += sprintf(end, "}");
  memset(&out, 0, sizeof out);
  out.size = sizeof out;
  out.schema = BALLAST_SCHEMA_JSON;
  out.topic = "hello.seen";
  out.source.rank = -1;
  out.payload = json;
  out.payload_size = (uint64_t)(end - json);
  h->host->counter_add(h->host, "seen", 1);
  rc = h->host->publish(h->host, &out); /* the host copies the payload */
  free(json);
  return rc;
}

static void on_tick(void* user) {
  hello* h = (hello*)user;
  static const char json[] = "{\"alive\":true}";
  ballast_event out;
  memset(&out, 0, sizeof out);
  out.size = sizeof out;
  out.schema = BALLAST_SCHEMA_JSON;
  out.topic = "hello.tick";
  out.source.rank = -1;
  out.payload = json;
  out.payload_size = sizeof json - 1;
  h->host->publish(h->host, &out);
}

static int hello_create(const ballast_host_api* host, void** state) {
  hello* h;
  const char* value = NULL;
  if (host == NULL || host->size < BALLAST_HOST_API_V1_SIZE) return BALLAST_EVERSION;
  h = (hello*)calloc(1, sizeof *h);
  if (h == NULL) return BALLAST_ENOMEM;
  h->host = host;
  h->greeting = "hello";
  if (host->config_get(host, "greeting", &value) == BALLAST_OK) h->greeting = value;
  if (host->config_get(host, "period_ms", &value) == BALLAST_OK) {
    char* end = NULL;
    double ms = strtod(value, &end);
    if (end == value || *end != '\0' || ms < 1) {
      host->set_error(host, "config key period_ms: expected a number >= 1");
      free(h);
      return BALLAST_EINVAL;
    }
    h->period_ns = (uint64_t)(ms * 1e6);
  }
  *state = h;
  return BALLAST_OK;
}

static int hello_start(void* state) {
  hello* h = (hello*)state;
  ballast_subscribe_options opts;
  int rc;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.delivery = BALLAST_DELIVER_INLINE;
  rc = h->host->subscribe(h->host, "fault.suspected", &opts, on_suspected, h, &h->subscription);
  if (rc != BALLAST_OK) return rc;
  if (h->period_ns > 0) {
    rc = h->host->timer_start(h->host, h->period_ns, on_tick, h, &h->timer);
    if (rc != BALLAST_OK) return rc;
    h->has_timer = 1;
  }
  h->host->log(h->host, BALLAST_LOG_INFO, "hello: listening to fault.suspected");
  return BALLAST_OK;
}

static void hello_stop(void* state) {
  hello* h = (hello*)state;
  if (h->has_timer) h->host->timer_cancel(h->host, h->timer);
  h->has_timer = 0;
  h->host->unsubscribe(h->host, h->subscription);
}

static void hello_destroy(void* state) { free(state); }

static const ballast_plugin_descriptor descriptor = {sizeof(ballast_plugin_descriptor),
                                                     BALLAST_ABI_MAJOR,
                                                     BALLAST_ABI_MINOR,
                                                     0,
                                                     "hello",
                                                     "1.0",
                                                     "example",
                                                     "Answers every fault.suspected with a hello.seen event",
                                                     hello_create,
                                                     hello_start,
                                                     hello_stop,
                                                     hello_destroy,
                                                     NULL, /* get_interface: no interfaces */
                                                     NULL};

BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor; /* any 1.x host serves the fields this plugin uses */
  return &descriptor;
}
