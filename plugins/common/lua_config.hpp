// A Lua configuration file evaluated as `ballast run` evaluates its config
// (core/config_file.cpp), for the plugin commands that take one (`ballast detect
// --config`): plugins do not link libballast, so they run the file in a Lua
// state of their own. The chunk runs as text only, in an environment without
// io, os, load, require or debug, under a deadline (1 s) and a memory cap
// (32 MiB); it must return a table, which becomes JSON: sequences arrays,
// string keys objects, an empty table an empty object. Functions, userdata,
// threads, non-finite numbers, mixed or sparse keys and cycles are errors
// naming the key path.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace ballast::util {

// False with *error naming the file and line, or the key path.
bool eval_lua_config(const std::string& path, nlohmann::json* out, std::string* error);

// A config value as a plugin reads it through ballast_host_api.config_get:
// strings as they are, booleans "true"/"false", numbers and tables as JSON.
std::string config_text(const nlohmann::json& value);

}  // namespace ballast::util
