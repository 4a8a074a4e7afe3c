// The C API of abi/ballast/host.h, over the C++ Host. Exceptions never cross
// the boundary: each entry point catches them and turns them into a status.
#include "config_file.hpp"
#include "error.hpp"
#include "event_codec.hpp"
#include "host.hpp"

#include <ballast/host.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>

struct ballast_host {
  std::unique_ptr<ballast::Host> host;
  std::mutex mutex;  // serialises the main-thread calls of embedders that use several threads
};

namespace {

template <class F>
int guarded(const char* what, F&& f) {
  try {
    ballast::clear_error();
    return f();
  } catch (const std::bad_alloc&) {
    return ballast::fail(BALLAST_ENOMEM, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return ballast::fail(BALLAST_EINTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return ballast::fail(BALLAST_EINTERNAL, std::string(what) + ": unknown exception");
  }
}

}  // namespace

extern "C" {

BALLAST_EXPORT const char* ballast_last_error(void) { return ballast::last_error(); }

BALLAST_EXPORT uint32_t ballast_abi_version(void) { return BALLAST_ABI_MAJOR * 1000 + BALLAST_ABI_MINOR; }

BALLAST_EXPORT int ballast_host_create(const char* node_name, ballast_host** out) {
  if (out == nullptr) return ballast::fail(BALLAST_EINVAL, "ballast_host_create: out is NULL");
  return guarded("ballast_host_create", [&]() -> int {
    ballast::HostOptions options;
    if (node_name) options.node = node_name;
    auto* h = new ballast_host;
    h->host = std::make_unique<ballast::Host>(options);
    *out = h;
    return BALLAST_OK;
  });
}

BALLAST_EXPORT void ballast_host_destroy(ballast_host* host) {
  if (host == nullptr) return;
  guarded("ballast_host_destroy", [&]() -> int {
    delete host;
    return BALLAST_OK;
  });
}

BALLAST_EXPORT int ballast_host_load_plugin(ballast_host* host, const char* path, const char* config_lua) {
  if (host == nullptr || path == nullptr)
    return ballast::fail(BALLAST_EINVAL, "ballast_host_load_plugin: NULL argument");
  return guarded("ballast_host_load_plugin", [&]() -> int {
    nlohmann::json config = nlohmann::json::object();
    if (config_lua != nullptr && *config_lua) {
      std::string chunk = std::string("return ") + config_lua;
      if (int rc = ballast::eval_lua_table(chunk, true, &config); rc != BALLAST_OK) return rc;
    }
    std::string resolved;
    if (int rc = ballast::resolve_plugin(path, std::filesystem::current_path().string(), &resolved); rc != BALLAST_OK)
      return rc;
    std::lock_guard lock(host->mutex);
    return host->host->load_plugin(resolved, config);
  });
}

BALLAST_EXPORT int ballast_host_load_policy(ballast_host* host, const char* script_path, const char* fallback_action) {
  if (host == nullptr || script_path == nullptr)
    return ballast::fail(BALLAST_EINVAL, "ballast_host_load_policy: NULL argument");
  return guarded("ballast_host_load_policy", [&]() -> int {
    ballast::PolicyOptions options;
    if (fallback_action) {
      bool known = false;
      for (const char* a : ballast::kRecoveryActions) known = known || std::strcmp(a, fallback_action) == 0;
      if (!known)
        return ballast::fail(BALLAST_EINVAL, std::string("ballast_host_load_policy: fallback '") + fallback_action +
                                                 "' is not a recovery action");
      options.fallback_action = fallback_action;
    }
    std::lock_guard lock(host->mutex);
    return host->host->load_policy(script_path, options);
  });
}

BALLAST_EXPORT int ballast_host_reload_policy(ballast_host* host) {
  if (host == nullptr) return ballast::fail(BALLAST_EINVAL, "ballast_host_reload_policy: NULL host");
  return guarded("ballast_host_reload_policy", [&]() -> int { return host->host->reload_policy(); });
}

BALLAST_EXPORT int ballast_host_start(ballast_host* host) {
  if (host == nullptr) return ballast::fail(BALLAST_EINVAL, "ballast_host_start: NULL host");
  return guarded("ballast_host_start", [&]() -> int {
    std::lock_guard lock(host->mutex);
    return host->host->start();
  });
}

BALLAST_EXPORT int ballast_host_run(ballast_host* host, int handle_signals) {
  if (host == nullptr) return ballast::fail(BALLAST_EINVAL, "ballast_host_run: NULL host");
  return guarded("ballast_host_run", [&]() -> int { return host->host->run(handle_signals != 0); });
}

BALLAST_EXPORT int ballast_host_stop(ballast_host* host) {
  if (host == nullptr) return BALLAST_EINVAL;
  host->host->request_stop();  // async-signal-safe: no allocation, no lock
  return BALLAST_OK;
}

BALLAST_EXPORT int ballast_host_publish(ballast_host* host, const ballast_event* event) {
  if (host == nullptr || event == nullptr) return ballast::fail(BALLAST_EINVAL, "ballast_host_publish: NULL argument");
  return guarded("ballast_host_publish", [&]() -> int { return host->host->publish(*event, "host"); });
}

BALLAST_EXPORT int ballast_host_publish_json(ballast_host* host, const char* topic, const char* json) {
  if (host == nullptr || topic == nullptr || json == nullptr)
    return ballast::fail(BALLAST_EINVAL, "ballast_host_publish_json: NULL argument");
  return guarded("ballast_host_publish_json", [&]() -> int { return host->host->publish_json(topic, json, "host"); });
}

BALLAST_EXPORT int ballast_host_subscribe(ballast_host* host, const char* pattern,
                                          const ballast_subscribe_options* options, ballast_handler handler, void* user,
                                          uint64_t* id) {
  if (host == nullptr) return ballast::fail(BALLAST_EINVAL, "ballast_host_subscribe: NULL host");
  return guarded("ballast_host_subscribe",
                 [&]() -> int { return host->host->subscribe(pattern, options, handler, user, "host", id); });
}

BALLAST_EXPORT int ballast_host_unsubscribe(ballast_host* host, uint64_t id) {
  if (host == nullptr) return ballast::fail(BALLAST_EINVAL, "ballast_host_unsubscribe: NULL host");
  return guarded("ballast_host_unsubscribe", [&]() -> int { return host->host->unsubscribe(id); });
}

BALLAST_EXPORT int64_t ballast_event_to_json(const ballast_event* event, char* buf, uint64_t cap) {
  if (event == nullptr || (buf == nullptr && cap != 0))
    return ballast::fail(BALLAST_EINVAL, "ballast_event_to_json: NULL argument");
  int64_t needed = -1;
  int rc = guarded("ballast_event_to_json", [&]() -> int {
    std::string text = ballast::event_to_json(*event).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    needed = static_cast<int64_t>(text.size());
    if (cap > 0) {
      size_t n = std::min<uint64_t>(text.size(), cap - 1);
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
    return BALLAST_OK;
  });
  return rc == BALLAST_OK ? needed : rc;
}

BALLAST_EXPORT int ballast_host_get_interface(ballast_host* host, const char* plugin, const char* name,
                                              uint32_t version, const void** table) {
  if (host == nullptr || name == nullptr || table == nullptr)
    return ballast::fail(BALLAST_EINVAL, "ballast_host_get_interface: NULL argument");
  return guarded("ballast_host_get_interface", [&]() -> int {
    std::lock_guard lock(host->mutex);
    *table = host->host->get_interface(plugin != nullptr ? plugin : "", name, version);
    if (*table == nullptr)
      return ballast::fail(BALLAST_ENOTFOUND, (plugin != nullptr ? std::string("no loaded plugin '") + plugin + "'"
                                                                 : std::string("no loaded plugin")) +
                                                  " offering " + name + " v" + std::to_string(version));
    return BALLAST_OK;
  });
}

BALLAST_EXPORT int ballast_host_counter(ballast_host* host, const char* name, int64_t* value) {
  if (host == nullptr || name == nullptr || value == nullptr)
    return ballast::fail(BALLAST_EINVAL, "ballast_host_counter: NULL argument");
  return guarded("ballast_host_counter", [&]() -> int {
    nlohmann::json all = host->host->counters();
    auto it = all.find(name);
    if (it == all.end()) return ballast::fail(BALLAST_ENOTFOUND, std::string("no counter '") + name + "'");
    *value = it->get<int64_t>();
    return BALLAST_OK;
  });
}

}  // extern "C"
