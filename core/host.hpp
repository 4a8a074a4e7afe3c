// The host: plugins, the bus, the policy, the journal, timers and counters of
// one process (DESIGN.md "Processes"). Life cycle:
//   configure -> load plugins (create, in order) -> start (in order) -> run
//   -> stop (reverse order) -> destroy (reverse order).
// A plugin that fails to load, create or start is reported and skipped; the
// host keeps running. SIGINT/SIGTERM stop run(); SIGHUP reloads the policy.
// Thread-safety: load_*, start, run, stop and the destructor belong to the
// thread that created the host; publish, subscribe, request_stop, counters
// and log are thread-safe (request_stop also from a signal handler).
#pragma once

#include "bus.hpp"
#include "loader.hpp"
#include "plugin_probe.hpp"
#include "policy.hpp"

#include <ballast/command.h>
#include <ballast/host.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ballast {

struct HostOptions {
  std::string node;  // "" = the machine's host name
  BusOptions bus;
  int log_level = BALLAST_LOG_INFO;
};

class Host {
 public:
  explicit Host(HostOptions options = {});
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // Build a host from a configuration table (config.hpp describes it);
  // base_dir resolves relative paths. Plugins that fail are reported and
  // skipped; a bad config, policy or journal is an error.
  static int from_config(const nlohmann::json& config, const std::string& base_dir,
                         std::unique_ptr<Host>* out);

  // Load, validate and create a plugin; started at once if the host runs.
  int load_plugin(const std::string& path, const nlohmann::json& config);
  int load_policy(const std::string& path, PolicyOptions options);
  int reload_policy();
  int open_journal(const std::string& path);

  int start();
  // Block until request_stop() or, with handle_signals, SIGINT/SIGTERM.
  // on_ready runs once the plugins started and the signals are handled: a
  // "running" message printed before would let a caller's SIGINT kill the
  // process outright.
  int run(bool handle_signals, const std::function<void()>& on_ready = {});
  void request_stop();
  // Stop plugins (reverse order), drain the bus. Idempotent.
  void stop();

  // Publish as `publisher` (filled into source.plugin); ts 0 = now.
  int publish(const ballast_event& event, const char* publisher);
  int publish_json(const std::string& topic, const std::string& json, const char* publisher);
  int subscribe(const char* pattern, const ballast_subscribe_options* options, ballast_handler handler,
                void* user, const char* owner, uint64_t* id);
  int unsubscribe(uint64_t id);

  // The interface table `name`@`version` of loaded plugin `plugin`, or null.
  const void* get_interface(const std::string& plugin, const char* name, uint32_t version);

  void log(int level, const std::string& who, const std::string& message);
  int64_t counter(const std::string& name) const;  // 0 when unknown
  nlohmann::json counters() const;                 // every counter, bus ones included

  // Every plugin file in the search path, inspected in child processes
  // (plugin_probe.hpp) with the subcommands it offers ("ballast.command").
  static std::vector<PluginProbe> command_probes();
  // Run the plugin subcommand `name` of the first probe offering it: only
  // that plugin is loaded in this process. Returns the exit code, or -1
  // when no plugin offers `name`.
  static int run_command(const std::string& name, const std::vector<PluginProbe>& probes, int argc, char** argv);
  // Every plugin subcommand: name -> summary, the first offer of a name winning.
  static std::vector<std::pair<std::string, std::string>> list_commands(const std::vector<PluginProbe>& probes);
  // Create the plugin of `f` in a host of its own (not started) and call
  // visit(state, command) for each of its commands, bounds-checked, until
  // visit returns true. Returns whether some call did; *error says why a
  // plugin or its table was refused.
  static bool commands_in(const PluginFile& f, std::string* error,
                          const std::function<bool(void*, const ballast_command&)>& visit);

  const std::string& node() const { return node_; }
  bool running() const { return started_ && !stopped_; }
  size_t plugin_count() const;
  Bus& bus() { return bus_; }

  struct Plugin;
  struct Timers;
  struct Outbox;

 private:
  void policy_event(const ballast_event& event);
  int subscribe_policy();
  void counter_add(const std::string& name, int64_t delta);
  static int policy_handler(void* user, const ballast_event* event);
  static int journal_handler(void* user, const ballast_event* event);

  std::string node_;
  int log_level_;
  Bus bus_;
  std::unique_ptr<Timers> timers_;
  std::unique_ptr<Outbox> outbox_;  // what the policy publishes (see host.cpp)
  std::vector<std::unique_ptr<Plugin>> plugins_;
  std::timed_mutex policy_mutex_;  // timed: a reload gives up when the host stops
  std::unique_ptr<Policy> policy_;
  std::vector<uint64_t> policy_subscriptions_;
  std::unique_ptr<class JournalWriter> journal_;
  uint64_t journal_subscription_ = 0;
  mutable std::mutex counters_mutex_;
  std::vector<std::pair<std::string, std::unique_ptr<std::atomic<int64_t>>>> counters_;
  std::mutex log_mutex_;
  bool started_ = false;
  bool stopped_ = false;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> reload_requested_{false};

  friend struct HostApiTable;
};

}  // namespace ballast
