// Detector configuration: from the host (ballast_host_api.config_get) or,
// for `ballast detect --config FILE.lua`, from a Lua file read here.
//
// The plugin depends on abi/ only, so it does not run Lua: it reads the
// subset a configuration table needs,
//
//   -- comment
//   return {
//     window = 3, threshold = 4.0, continuity = 2,
//     metrics = { "gpu*.util", "proc.cpu" },   -- a list of strings
//     floors = { rel = 0.05 },                 -- nested: key "floors.rel"
//   }
//
// (`return` optional; numbers, 'strings', "strings", true/false, nested
// tables; `,` or `;` between fields; `--` and `--[[ ]]` comments). Anything
// else (expressions, function calls) is an error naming the line and column.
#pragma once

#include "detector.hpp"

#include <functional>
#include <map>
#include <string>

namespace ballast::machine {

// A flat view of a configuration: dotted key -> text, the way config_get
// returns it (numbers and booleans as text, lists as a JSON array).
using ConfigText = std::map<std::string, std::string>;

// Parse the Lua subset above from `text`; `name` names the file in errors.
// Returns false and sets *error ("FILE:LINE:COL: message") on failure.
bool parse_lua_table(const std::string& text, const std::string& name, ConfigText* out,
                     std::string* error);

// Apply the keys the detector knows to *config. get(key, &value) returns
// false when the key is absent. Returns false with *error naming the key and
// the value when one is malformed.
bool apply_config(const std::function<bool(const std::string&, std::string*)>& get,
                  DetectorConfig* config, std::string* error);

// The keys apply_config reads (documented in README.md).
const std::vector<std::string>& config_keys();

}  // namespace ballast::machine
