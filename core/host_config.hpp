// Building a host from a configuration table (config.hpp describes the file):
// the node, the bus, the journal, the plugins in order with their config,
// and the policy. Uses the host's public interface only.
#pragma once

#include "host.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace ballast {

// base_dir resolves relative paths. A key the config does not take, a
// plugin that fails to load or create (unless `optional = true`), a bad
// policy, journal or metrics address is an error naming the field.
int host_from_config(const nlohmann::json& config, const std::string& base_dir, std::unique_ptr<Host>* out);

// "error", "warn", "info", "debug" -> BALLAST_LOG_*; "text", "json".
bool parse_log_level(const std::string& text, int* level);
bool parse_log_format(const std::string& text, LogFormat* format);

}  // namespace ballast
