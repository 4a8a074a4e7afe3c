// The Lua policy as a built-in plugin, "policy": an ordinary subscriber that
// reaches the host only through the ballast_host_api table the host hands
// it, like every plugin (DESIGN.md "Lua policies"). A C handler and a Lua
// handler sit on the same path: plugin -> host API (host.cpp) -> bus
// (bus.cpp) -> subscriber.
//
// Its configuration, read with config_get like any plugin's:
//   script       the policy file (required)
//   fallback     the action published when a call fails (default "escalate")
//   deadline_ms  wall clock per handler call (default 100)
//   memory_bytes cap of the Lua state (default 64 MiB)
//   name         for messages (default: the file's stem)
// Its counters: policy.events (handler calls; kept in the plugin, the host
// reads it with policy_plugin_events), policy.actions (recovery actions
// decided), policy.errors (calls that failed: policy.error).
// create() loads the script (an error names the file and the line); start()
// subscribes queued to a covering set of the script's patterns; what the
// script publishes goes out through an outbox thread (policy_plugin.cpp says
// why); stop() interrupts the handler call in progress, skips the events
// still queued, hands out what the outbox holds and stops it.
#pragma once

#include "policy.hpp"

#include <ballast/plugin.h>

#include <cstdint>
#include <functional>
#include <string>

namespace ballast {

// The built-in plugin's descriptor (static storage).
const ballast_plugin_descriptor* policy_plugin_descriptor();

// Load `path` with `options` in place of the running script (the same file
// again: a reload); on failure the old script stays and the message is left
// in last_error(). `state` is the plugin's, from create. Host main thread.
int policy_plugin_load(void* state, const std::string& path, const PolicyOptions& options);

// Re-read the current script's file (policy_plugin_load with its own path).
// While a handler call holds the policy, `give_up` is asked every 100 ms:
// true abandons the reload (BALLAST_ESTATE), e.g. when the host is stopping.
int policy_plugin_reload(void* state, const std::function<bool()>& give_up);

// Events the plugin has handled (policy.events). Any thread, while the
// plugin exists.
uint64_t policy_plugin_events(const void* state);

}  // namespace ballast
