// Configuration files: Lua tables evaluated in the policy sandbox.
//
//   return {
//     node = "gpu001",                 -- default: the host name
//     role = "agent",                  -- "agent" | "controller"
//     plugins = {                      -- loaded in order; stopped in reverse
//       { path = "ballast-hello.so", config = { greeting = "hi" } },
//       "ballast-collect",             -- a name: searched in the plugin path
//     },
//     policy = { script = "default.lua", fallback = "escalate",
//                deadline_ms = 100, memory_mb = 64 },
//     journal = "events.journal",      -- optional event log
//     bus = { dispatcher_threads = 1, queue_capacity = 4096 },
//   }
//
// Relative paths are resolved against the config file's folder, then the
// plugin/script search path.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace ballast {

// Evaluate a Lua file (or, with from_string, a chunk) that returns a table,
// in the sandbox, and convert it to JSON (arrays for sequences, objects for
// string keys; functions and userdata are errors naming the key path).
// Status; the message names the file, the line or the key.
// Runs under ConfigLimits{} (1 s, 32 MiB).
int eval_lua_table(const std::string& path_or_chunk, bool from_string, nlohmann::json* out);

struct ConfigLimits {
  uint32_t deadline_ms = 1000;              // wall clock for the whole file
  uint64_t memory_limit_bytes = 32u << 20;  // cap of its Lua state
};
int eval_lua_table(const std::string& path_or_chunk, bool from_string, nlohmann::json* out, const ConfigLimits& limits);

// The value at a dotted key ("window.seconds") of a config object, or
// nullptr. Array elements by index, from 1 as in the Lua table ("plugins.2"
// is the second plugin).
const nlohmann::json* config_lookup(const nlohmann::json& config, const std::string& key);

// A config value as the text handed to plugins (ballast_host_api.config_get):
// strings as is, numbers in shortest round-trip form, booleans
// "true"/"false", arrays and objects as JSON.
std::string config_text(const nlohmann::json& value);

}  // namespace ballast
