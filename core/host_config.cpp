#include "host_config.hpp"

#include "command_line.hpp"
#include "config_file.hpp"
#include "error.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace fs = std::filesystem;

namespace ballast {

namespace {

// Every top-level key of a config file: the host's, the executor's `job`
// (plugins/scheduler/runner) and the cluster role's `cluster` (core/cluster).
const std::vector<std::string> kConfigKeys = {"node",    "role",   "log_level", "log_format", "bus",    "journal",
                                              "plugins", "policy", "metrics",   "job",        "cluster"};

std::string script_search(const std::string& reference, const std::string& base_dir) {
  std::error_code ec;
  fs::path p(reference);
  if (p.is_absolute()) return reference;
  if (fs::exists(fs::path(base_dir) / p, ec)) return (fs::path(base_dir) / p).string();
  std::string prefix = install_prefix();
  fs::path shipped = fs::path(prefix) / BALLAST_SCRIPT_REL_DIR / p;
  if (!prefix.empty() && fs::exists(shipped, ec)) return shipped.string();
  return (fs::path(base_dir) / p).string();
}

// A whole number in [0, max] (an integer, or a float with no fraction):
// anything else is refused, never wrapped or truncated.
int as_uint(const nlohmann::json& config, const char* key, uint64_t fallback, uint64_t max, uint64_t* out) {
  const nlohmann::json* v = config_lookup(config, key);
  if (v == nullptr) {
    *out = fallback;
    return BALLAST_OK;
  }
  const std::string range = "': expected a whole number from 0 to " + std::to_string(max);
  if (v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0)) {
    *out = v->get<uint64_t>();
  } else if (v->is_number_float() && v->get<double>() >= 0 && v->get<double>() <= double(max) &&
             v->get<double>() == std::floor(v->get<double>())) {
    *out = uint64_t(v->get<double>());
  } else {
    return fail(BALLAST_EINVAL, std::string("config field '") + key + range);
  }
  if (*out > max)
    return fail(BALLAST_EINVAL, std::string("config field '") + key + range + ", not " + std::to_string(*out));
  return BALLAST_OK;
}

// A table's keys must be among `known`: a typo is an error naming the key,
// the closest known one and the table (`where`, "" for the top level).
int check_keys(const nlohmann::json& table, const std::vector<std::string>& known, const std::string& where) {
  if (!table.is_object()) return BALLAST_OK;
  for (const auto& [key, value] : table.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string why = "config: unknown key '" + (where.empty() ? key : where + "." + key) + "'";
    if (const std::string near = util::closest(key, known); !near.empty())
      why += " (did you mean '" + (where.empty() ? near : where + "." + near) + "'?)";
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    return fail(BALLAST_EINVAL, why + "; " + (where.empty() ? "the top level" : "'" + where + "'") + " takes " + list);
  }
  return BALLAST_OK;
}

int log_options(const nlohmann::json& config, HostOptions* options) {
  if (auto* level = config_lookup(config, "log_level")) {
    if (!level->is_string() || !parse_log_level(level->get<std::string>(), &options->log_level))
      return fail(BALLAST_EINVAL, "config field 'log_level': expected error, warn, info or debug");
  }
  if (auto* format = config_lookup(config, "log_format")) {
    if (!format->is_string() || !parse_log_format(format->get<std::string>(), &options->log_format))
      return fail(BALLAST_EINVAL, "config field 'log_format': expected text or json");
  }
  return BALLAST_OK;
}

}  // namespace

bool parse_log_level(const std::string& text, int* level) {
  static const char* names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; ++i)
    if (text == names[i]) {
      *level = i;
      return true;
    }
  return false;
}

bool parse_log_format(const std::string& text, LogFormat* format) {
  if (text != "text" && text != "json") return false;
  *format = text == "json" ? LogFormat::json : LogFormat::text;
  return true;
}

int host_from_config(const nlohmann::json& config, const std::string& base_dir, std::unique_ptr<Host>* out) {
  if (!config.is_object()) return fail(BALLAST_EINVAL, "config: expected a table");
  if (int rc = check_keys(config, kConfigKeys, ""); rc != BALLAST_OK) return rc;
  if (int rc = check_keys(config.value("bus", nlohmann::json()), {"dispatcher_threads", "queue_capacity"}, "bus");
      rc != BALLAST_OK)
    return rc;
  if (int rc = check_keys(config.value("policy", nlohmann::json()), {"script", "fallback", "deadline_ms", "memory_mb"},
                          "policy");
      rc != BALLAST_OK)
    return rc;
  if (int rc = check_keys(config.value("metrics", nlohmann::json()), {"listen"}, "metrics"); rc != BALLAST_OK)
    return rc;
  HostOptions options;
  if (auto* node = config_lookup(config, "node")) {
    if (!node->is_string()) return fail(BALLAST_EINVAL, "config field 'node': expected a string");
    options.node = node->get<std::string>();
  }
  if (auto* role = config_lookup(config, "role")) {
    if (!role->is_string() || (*role != "agent" && *role != "controller"))
      return fail(BALLAST_EINVAL, "config field 'role': expected \"agent\" or \"controller\"");
  }
  if (int rc = log_options(config, &options); rc != BALLAST_OK) return rc;
  uint64_t threads = 0, capacity = 0;
  if (int rc = as_uint(config, "bus.dispatcher_threads", 1, 1024, &threads); rc != BALLAST_OK) return rc;
  if (int rc = as_uint(config, "bus.queue_capacity", 4096, uint64_t{1} << 30, &capacity); rc != BALLAST_OK) return rc;
  if (threads == 0 || threads > 64)
    return fail(BALLAST_EINVAL, "config field 'bus.dispatcher_threads': expected 1..64");
  if (capacity == 0 || capacity > (1u << 20))
    return fail(BALLAST_EINVAL, "config field 'bus.queue_capacity': expected 1..1048576");
  options.bus.dispatcher_threads = static_cast<unsigned>(threads);
  options.bus.default_queue_capacity = static_cast<uint32_t>(capacity);

  auto host = std::make_unique<Host>(options);

  if (auto* journal = config_lookup(config, "journal")) {
    if (!journal->is_string()) return fail(BALLAST_EINVAL, "config field 'journal': expected a path");
    fs::path jp(journal->get<std::string>());
    if (jp.is_relative()) jp = fs::path(base_dir) / jp;
    if (int rc = host->open_journal(jp.string()); rc != BALLAST_OK) return rc;
  }

  if (auto* plugins = config_lookup(config, "plugins")) {
    // An empty Lua table is an empty list too.
    const bool empty = plugins->is_object() && plugins->empty();
    if (!plugins->is_array() && !empty) return fail(BALLAST_EINVAL, "config field 'plugins': expected a list");
    for (size_t i = 0; !empty && i < plugins->size(); ++i) {
      const auto& entry = (*plugins)[i];
      std::string field = "plugins[" + std::to_string(i + 1) + "]";
      std::string reference;
      bool optional = false;
      nlohmann::json plugin_config = nlohmann::json::object();
      if (entry.is_string()) {
        reference = entry.get<std::string>();
      } else if (entry.is_object() && entry.contains("path") && entry["path"].is_string()) {
        if (int rc = check_keys(entry, {"path", "config", "optional"}, field); rc != BALLAST_OK) return rc;
        reference = entry["path"].get<std::string>();
        if (entry.contains("config")) {
          if (!entry["config"].is_object())
            return fail(BALLAST_EINVAL, "config field '" + field + ".config': expected a table");
          plugin_config = entry["config"];
        }
        if (entry.contains("optional")) {
          if (!entry["optional"].is_boolean())
            return fail(BALLAST_EINVAL, "config field '" + field + ".optional': expected true or false");
          optional = entry["optional"].get<bool>();
        }
      } else {
        return fail(BALLAST_EINVAL,
                    "config field '" + field + "': expected a name or { path = ..., config = {...}, optional = true }");
      }
      // A plugin that cannot be used stops the host, unless it is optional.
      std::string path;
      int rc = resolve_plugin(reference, base_dir, &path);
      if (rc == BALLAST_OK) rc = host->load_plugin(path, plugin_config, optional);
      if (rc != BALLAST_OK && !optional) return fail(rc, "config field '" + field + "': " + last_error());
      if (rc != BALLAST_OK)
        host->log(BALLAST_LOG_WARN, "host", "config field '" + field + "' (optional, skipped): " + last_error());
    }
  }

  if (auto* policy = config_lookup(config, "policy")) {
    PolicyOptions popts;
    std::string script;
    if (policy->is_string()) {
      script = policy->get<std::string>();
    } else if (policy->is_object() && policy->contains("script") && (*policy)["script"].is_string()) {
      script = (*policy)["script"].get<std::string>();
      if (auto* f = config_lookup(*policy, "fallback")) {
        if (!f->is_string()) return fail(BALLAST_EINVAL, "config field 'policy.fallback': expected an action name");
        popts.fallback_action = f->get<std::string>();
      }
      uint64_t deadline = 0, memory = 0;
      if (int rc = as_uint(*policy, "deadline_ms", popts.call_deadline_ms, 3600000, &deadline); rc != BALLAST_OK)
        return rc;
      if (int rc = as_uint(*policy, "memory_mb", popts.memory_limit_bytes >> 20, uint64_t{1} << 20, &memory);
          rc != BALLAST_OK)
        return rc;
      popts.call_deadline_ms = static_cast<uint32_t>(deadline);
      popts.memory_limit_bytes = memory << 20;
    } else {
      return fail(BALLAST_EINVAL, "config field 'policy': expected a script path or { script = ..., ... }");
    }
    bool known = false;
    for (const char* a : kRecoveryActions) known = known || popts.fallback_action == a;
    if (!known)
      return fail(BALLAST_EINVAL,
                  "config field 'policy.fallback': '" + popts.fallback_action + "' is not a recovery action");
    if (int rc = host->load_policy(script_search(script, base_dir), popts); rc != BALLAST_OK) return rc;
  }

  if (auto* metrics = config_lookup(config, "metrics")) {
    const nlohmann::json* listen = config_lookup(*metrics, "listen");
    if (!metrics->is_object() || listen == nullptr || !listen->is_string())
      return fail(BALLAST_EINVAL, "config field 'metrics': expected { listen = \"HOST:PORT\" }");
    if (int rc = host->serve_metrics(listen->get<std::string>()); rc != BALLAST_OK)
      return fail(rc, std::string("config field 'metrics.listen': ") + last_error());
  }
  *out = std::move(host);
  return BALLAST_OK;
}

}  // namespace ballast
