// Detector configuration: from the host (ballast_host_api.config_get) or,
// for `ballast detect --config FILE.lua`, from a Lua file evaluated as
// `ballast run` evaluates its config (plugins/common/lua_config.hpp), each
// key then read as config_get would hand it over.
#pragma once

#include "detector.hpp"

#include <functional>
#include <string>

namespace ballast::machine {

// Read FILE.lua (a Lua file returning a table of the keys below) into
// *config. False with *error naming the file and line, or the key.
bool load_config_file(const std::string& path, DetectorConfig* config, std::string* error);

// Apply the keys the detector knows to *config. get(key, &value) returns
// false when the key is absent. Returns false with *error naming the key and
// the value when one is malformed.
bool apply_config(const std::function<bool(const std::string&, std::string*)>& get, DetectorConfig* config,
                  std::string* error);

// The keys apply_config reads (documented in README.md).
const std::vector<std::string>& config_keys();

}  // namespace ballast::machine
