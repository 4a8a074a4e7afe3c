/* Ballast C ABI: what a plugin exports, and the host services it receives.
 *
 * A plugin is a shared object that exports exactly one symbol:
 *
 *   BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor);
 *
 * The host calls it first and nothing else before it: it passes the ABI minor
 * version it implements; the plugin returns its descriptor (static storage,
 * never freed), or NULL when it needs a newer host. The major version is in
 * the symbol's name: a host refuses a plugin without a symbol of its major.
 * The host reads a descriptor field only when `size` covers it: the fields up
 * to `destroy` are required (BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE), those after
 * it are optional. It refuses a descriptor that is shorter than that, has
 * abi_major != 1, or lacks a valid name, create or destroy, with a message
 * naming the file and the reason.
 *
 * Life cycle, all calls from the host's main thread:
 *   create(host, &state) -> start(state) -> ... events, timers ... -> stop(state) -> destroy(state)
 * stop and destroy run in the reverse order of loading. A plugin is never
 * unloaded from the process (dlclose is never called): code that CUDA, NCCL
 * or UCX keep callbacks into must stay mapped.
 *
 * Errors, the one rule for the host table and every interface table
 * (ballast.command, ballast.comm, ballast.scheduler, ballast.startup, and
 * those to come): a function that fails returns a negative BALLAST_E* status
 * and leaves a message for the calling thread. The caller reads it right
 * after the call with its own getter: a plugin with host->last_error(host),
 * an embedder with ballast_last_error() (host.h); both read the same
 * per-thread message. A plugin whose interface function fails therefore
 * records its message with host->set_error before returning. ballast.comm v1
 * and ballast.startup v1 also keep a last_error(state) of their own, with
 * the same text; new interfaces have none.
 *
 * The host table is always whole: every function its size covers is valid
 * (a plugin never meets a NULL one), also for a plugin an embedder loads
 * through host.h without starting it. */
#ifndef BALLAST_PLUGIN_H
#define BALLAST_PLUGIN_H

#include "event.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ballast_log_level { BALLAST_LOG_ERROR = 0, BALLAST_LOG_WARN = 1, BALLAST_LOG_INFO = 2, BALLAST_LOG_DEBUG = 3 };

typedef void (*ballast_timer_fn)(void* user);

/* The host's services, handed to create(). The table and every function in
 * it stay valid until destroy() returns. The table identifies the calling
 * plugin: always pass the pointer you were given. Every function is
 * thread-safe unless its comment says otherwise. */
typedef struct ballast_host_api ballast_host_api;
struct ballast_host_api {
  uint32_t size;      /* sizeof(ballast_host_api) as the host compiled it */
  uint32_t abi_minor; /* the host's BALLAST_ABI_MINOR */

  /* Publish an event. The bus does not keep `event` or its payload past the
   * call (inline handlers run inside it; queued ones get a copy). ts_ns = 0
   * means now; source.plugin is filled by the host. May block when a
   * lossless queued subscriber is full (backpressure). Returns BALLAST_OK even
   * when there is no subscriber. */
  int (*publish)(const ballast_host_api* api, const ballast_event* event);

  /* Subscribe `handler(user, event)` to a topic ("a.b"), a prefix ("a.*") or
   * everything ("*"). options may be NULL (inline). The id, written to *id,
   * is used to unsubscribe. Delivery is FIFO per publisher thread. */
  int (*subscribe)(const ballast_host_api* api, const char* pattern, const ballast_subscribe_options* options,
                   ballast_handler handler, void* user, uint64_t* id);

  /* Remove a subscription. When it returns, the handler is not running and
   * will not be called again (queued events still waiting are discarded and
   * counted as dropped). Must not be called from the handler being removed. */
  int (*unsubscribe)(const ballast_host_api* api, uint64_t id);

  /* Log one line, prefixed by the host with the time and the plugin's name. */
  void (*log)(const ballast_host_api* api, int level, const char* message);

  /* The plugin's configuration value at `key` ("period", "window.seconds"
   * for nested tables), as text (numbers in shortest round-trip form,
   * booleans "true"/"false", tables as JSON). *value lives until destroy().
   * BALLAST_ENOTFOUND when the key is absent.
   * A plugin says which keys it takes by asking for them, present or not,
   * in create(): when create() returns, a key of its configuration it never
   * asked for (nor a key below or above it) is a typo, and the host refuses
   * the plugin with a message naming the key. */
  int (*config_get)(const ballast_host_api* api, const char* key, const char** value);

  /* Call fn(user) every period_ns (first call after one period) from the
   * host's timer thread, until cancelled or the host stops. fn must be quick. */
  int (*timer_start)(const ballast_host_api* api, uint64_t period_ns, ballast_timer_fn fn, void* user, uint64_t* id);
  /* Cancel a timer; when it returns, fn is not running and will not run again.
   * Must not be called from the timer's own fn. */
  int (*timer_cancel)(const ballast_host_api* api, uint64_t id);

  /* Add delta to the counter "<plugin>.<name>" (created at 0). Counters are
   * shown by `ballast run` and read by embedders. */
  int (*counter_add)(const ballast_host_api* api, const char* name, int64_t delta);

  /* Wall-clock time in ns since the Unix epoch. */
  int64_t (*now_ns)(const ballast_host_api* api);

  /* Record the message for a failure the plugin is about to return (kept per
   * thread, copied; plugin.h's "Errors"). The host prefixes it with the
   * plugin's name. */
  void (*set_error)(const ballast_host_api* api, const char* message);

  /* The message of the last failed host call on this thread ("" if none).
   * Valid until the next host call on this thread. */
  const char* (*last_error)(const ballast_host_api* api);

  /* Optional (ABI 1.1; read it only when
   * BALLAST_COVERS(api->size, ballast_host_api, node_name)). The name of the
   * node this host runs as: the config's `node`, else the machine's host
   * name. Lives until destroy(). */
  const char* (*node_name)(const ballast_host_api* api);

  /* Optional (ABI 1.2; read it only when
   * BALLAST_COVERS(api->size, ballast_host_api, fence_action)). Call it
   * before carrying out an action whose effects reach outside this process
   * (a resource manager's drain, resume, requeue, submit, cancel): the host
   * records the action, and says whether this process may carry it out.
   * `kind` names the action ("drain", "requeue", ...; [a-z0-9_.-], at most
   * 64 bytes); `record_json` is a JSON object describing it (what, on
   * which node or job, why; at most 64 KiB, a ".snapshot" at most 1 MiB),
   * kept in the host's action log.
   * A kind ending in ".snapshot" records the plugin's whole state instead:
   * with etcd it replaces every earlier record of this plugin in the log (a
   * successor's log starts from it), so a plugin that records many actions
   * writes one now and then to keep the log bounded.
   * Returns:
   *   BALLAST_OK       act. A host without high availability always answers
   *                    so (an embedded host, an agent, a controller without
   *                    `cluster.etcd`): nothing is recorded then.
   *   BALLAST_EFENCED  do not act: this process is not, or is no longer, the
   *                    leader of its controllers (with etcd, the record was
   *                    not written, in a transaction conditional on this
   *                    controller's leadership; a successor may be acting).
   *   another status   do not act now: the record could not be written (etcd
   *                    unreachable: BALLAST_EIO; a bad argument:
   *                    BALLAST_EINVAL); trying again later may succeed.
   * On any status but BALLAST_OK the message says why (last_error). A refusal
   * is counted by the host (counter `fence.refused`, `fence.allowed` for the
   * others). May block for an etcd round trip (a few ms; seconds when etcd is
   * slow): not from an inline handler. Fencing bounds, it does not close, the
   * window of a leader deposed between the record and its action: call it
   * right before acting, once per action. */
  int (*fence_action)(const ballast_host_api* api, const char* kind, const char* record_json);
};
/* The v1 minimum: everything up to and including last_error; node_name (1.1)
 * and fence_action (1.2) may be left out (an older host). */
#define BALLAST_HOST_API_V1_SIZE BALLAST_SIZE_TO(ballast_host_api, last_error)

/* An interface a plugin offers, for listing without creating the plugin. */
typedef struct ballast_interface_info {
  const char* name; /* "ballast.comm", "ballast.command", ... */
  uint32_t version;
} ballast_interface_info;

typedef struct ballast_plugin_descriptor {
  uint32_t size;      /* sizeof(ballast_plugin_descriptor) as the plugin compiled it */
  uint32_t abi_major; /* BALLAST_ABI_MAJOR */
  uint32_t abi_minor; /* BALLAST_ABI_MINOR the plugin was built against */
  uint32_t reserved;
  const char* name;        /* unique, [a-z0-9_-]+ */
  const char* version;     /* the plugin's own version, free text */
  const char* kind;        /* "detector", "comm", "scheduler", "startup", "example", ... */
  const char* description; /* one line */

  /* Create the plugin's state; must be cheap (no threads, no network):
   * `ballast --help` creates plugins to list their commands. host lives
   * until destroy(). On failure return
   * a negative status after host->set_error(); the host then skips the plugin
   * (calls nothing else on it) and keeps running. */
  int (*create)(const ballast_host_api* host, void** state);
  /* Optional (may be NULL). Start work: subscribe, start timers or threads. */
  int (*start)(void* state);
  /* Optional. Stop work: join the plugin's own threads. Before calling it
   * the host has cancelled the plugin's timers (none of their callbacks runs
   * during or after stop; cancelling them again is not an error). After it
   * returns the host refuses the plugin's publish with BALLAST_ESTATE (no
   * event of the plugin reaches the bus any more) and removes its
   * subscriptions: a handler may still run during stop, none after the
   * removal. */
  void (*stop)(void* state);
  /* Free the state. Called once, also when start failed. */
  void (*destroy)(void* state);

  /* Optional. A table of function pointers for interface `name` at `version`
   * (which starts with its own uint32_t size), or NULL if not offered. The
   * table lives until destroy(). Any thread after create. */
  const void* (*get_interface)(void* state, const char* name, uint32_t version);

  /* Optional. The interfaces get_interface offers, terminated by {NULL, 0}. */
  const ballast_interface_info* interfaces;
} ballast_plugin_descriptor;

/* The v1 minimum of a descriptor: everything up to and including destroy. */
#define BALLAST_PLUGIN_DESCRIPTOR_V1_SIZE BALLAST_SIZE_TO(ballast_plugin_descriptor, destroy)

/* The entry symbol's type and name. */
typedef const ballast_plugin_descriptor* (*ballast_plugin_entry_fn)(uint32_t host_minor);
#define BALLAST_PLUGIN_ENTRY "ballast_plugin_v1"

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_PLUGIN_H */
