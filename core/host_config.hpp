// Building a host from a configuration table (config.hpp describes the file):
// the node, the bus, the journal, the plugins in order with their config,
// and the policy. Uses the host's public interface only.
#pragma once

#include "host.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace ballast {

// base_dir resolves relative paths. Plugins that fail are reported and
// skipped; a bad config, policy or journal is an error naming the field.
int host_from_config(const nlohmann::json& config, const std::string& base_dir, std::unique_ptr<Host>* out);

}  // namespace ballast
