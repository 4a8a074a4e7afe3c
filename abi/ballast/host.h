/* Ballast C ABI: embedding the core (libballast) in another program.
 *
 * A C/C++ trainer, or anything with a C FFI (Python ctypes), creates a host,
 * loads plugins and a policy, publishes and subscribes, and runs it, without
 * a configuration file. Link with libballast (pkg-config ballast, or CMake
 * Ballast::core). Every function is thread-safe unless stated; each returns
 * a status and leaves a message for ballast_last_error() on failure. */
#ifndef BALLAST_HOST_H
#define BALLAST_HOST_H

#include "events.h"
#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ballast_host ballast_host;

/* The message of the last failure of a ballast_* call on this thread, "" if
 * none. Valid until the next ballast_* call on this thread. */
BALLAST_EXPORT const char* ballast_last_error(void);

/* The ABI version libballast implements, as major*1000 + minor. */
BALLAST_EXPORT uint32_t ballast_abi_version(void);

/* Create a host. node_name may be NULL (the machine's host name). The host is
 * not started. Free with ballast_host_destroy. */
BALLAST_EXPORT int ballast_host_create(const char* node_name, ballast_host** host);

/* Stop (if running) and free the host: plugins are stopped and destroyed in
 * reverse order of loading, queues drained. host may be NULL. */
BALLAST_EXPORT void ballast_host_destroy(ballast_host* host);

/* Load a plugin from a shared object path, with its configuration given as a
 * Lua table constructor ("{ period = 1 }") or NULL, and create it. Started at
 * ballast_host_start, or at once if the host already runs. A refused or
 * failing plugin, or a config key the plugin does not ask for in its create
 * (plugin.h, config_get), returns an error naming it and leaves the host
 * usable. */
BALLAST_EXPORT int ballast_host_load_plugin(ballast_host* host, const char* path, const char* config_lua);

/* Load a Lua policy script (replacing the current one). fallback_action is
 * the action published when the policy fails ("escalate" if NULL). */
BALLAST_EXPORT int ballast_host_load_policy(ballast_host* host, const char* script_path, const char* fallback_action);

/* Reload the current policy from its file; on failure the old one stays. */
BALLAST_EXPORT int ballast_host_reload_policy(ballast_host* host);

/* Start loaded plugins and the policy, in order; events flow from now on. A
 * plugin whose start fails makes it return that error (those started before
 * it stop with the host). */
BALLAST_EXPORT int ballast_host_start(ballast_host* host);

/* Block until ballast_host_stop is called (any thread) or, when
 * handle_signals is non-zero, SIGINT/SIGTERM arrive (SIGHUP reloads the
 * policy; SIGUSR1 and SIGUSR2 log the counters and publish host.signal).
 * Main thread. */
BALLAST_EXPORT int ballast_host_run(ballast_host* host, int handle_signals);

/* Ask a running host to stop; ballast_host_run returns. Any thread, also a
 * signal handler. */
BALLAST_EXPORT int ballast_host_stop(ballast_host* host);

/* Publish an event as the embedding program (source.plugin = "host"). */
BALLAST_EXPORT int ballast_host_publish(ballast_host* host, const ballast_event* event);

/* Publish `json` (an object) under `topic`. Well-known topics (the schema of
 * events.h) are converted to their struct; others travel as
 * BALLAST_SCHEMA_JSON. For FFI callers. */
BALLAST_EXPORT int ballast_host_publish_json(ballast_host* host, const char* topic, const char* json);

/* Subscribe, as ballast_host_api.subscribe. */
BALLAST_EXPORT int ballast_host_subscribe(ballast_host* host, const char* pattern,
                                          const ballast_subscribe_options* options, ballast_handler handler, void* user,
                                          uint64_t* id);
BALLAST_EXPORT int ballast_host_unsubscribe(ballast_host* host, uint64_t id);

/* Render an event as one JSON object {"topic","ts","source","schema","payload"}
 * into buf (capacity cap, NUL-terminated). Returns the length needed without
 * the NUL (like snprintf): call again with a larger buffer when >= cap.
 * Negative on error. For handlers in FFI callers. */
BALLAST_EXPORT int64_t ballast_event_to_json(const ballast_event* event, char* buf, uint64_t cap);

/* The table of interface `name` at `version` offered by the loaded plugin
 * `plugin` (its descriptor name; NULL: the first loaded plugin that offers
 * it), e.g. "ballast.startup" v1 of "startup", in *table; BALLAST_ENOTFOUND
 * when the plugin is not loaded or does not offer it. The table lives until
 * the host is destroyed. For trainers that call a plugin's interface
 * directly. Such a caller has no plugin state: ballast.comm's functions
 * accept NULL for it (comm.h). */
BALLAST_EXPORT int ballast_host_get_interface(ballast_host* host, const char* plugin, const char* name,
                                              uint32_t version, const void** table);

/* Read counter `name` ("bus.dropped", "<plugin>.<name>") into *value. */
BALLAST_EXPORT int ballast_host_counter(ballast_host* host, const char* name, int64_t* value);

#ifdef __cplusplus
}
#endif

#endif /* BALLAST_HOST_H */
