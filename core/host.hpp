// The host: plugins, the bus, the journal, timers and counters of one
// process (DESIGN.md "Processes"). Life cycle:
//   configure -> load plugins (create, in order) -> start (in order) -> run
//   -> stop (reverse order) -> destroy (reverse order).
// The Lua policy is a built-in plugin (policy_plugin.hpp), loaded first so
// that it starts first and stops last. A plugin that fails to load or create,
// or whose config has a key it never asks for (plugin.h, config_get), is
// refused with an error; one that fails to start makes start() fail, unless
// it was loaded as optional (then it is reported and stays inactive).
// SIGINT/SIGTERM stop run(); SIGHUP reloads the policy; SIGUSR1 and SIGUSR2
// write the counters to the log and publish host.signal. serve_metrics()
// serves the counters over HTTP (host_metrics.hpp). Building a host from a
// config file is host_config.hpp; the plugins' `ballast` subcommands,
// plugin_commands.hpp.
// Thread-safety: load_*, start, run, stop and the destructor belong to the
// thread that created the host; publish, subscribe, request_stop, counters
// and log are thread-safe (request_stop also from a signal handler).
#pragma once

#include "bus.hpp"
#include "plugin_loader.hpp"
#include "policy.hpp"

#include <ballast/host.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

namespace ballast {

enum class LogFormat { text, json };

// One log line (no newline): "TIME LEVEL [who] message", or a JSON object
// {"ts","level","source","message"}.
std::string log_line(LogFormat format, int level, const std::string& who, const std::string& message);

struct HostOptions {
  std::string node;  // "" = the machine's host name
  BusOptions bus;
  int log_level = BALLAST_LOG_INFO;
  LogFormat log_format = LogFormat::text;  // json: one object per line
};

class Host {
 public:
  explicit Host(HostOptions options = {});
  ~Host();
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // Load, validate and create a plugin; started at once if the host runs.
  // An optional plugin that fails to start is reported, not an error.
  int load_plugin(const std::string& path, const nlohmann::json& config, bool optional = false);
  // Load the policy (the built-in "policy" plugin), or replace its script.
  int load_policy(const std::string& path, const PolicyOptions& options);
  int reload_policy();
  int open_journal(const std::string& path);
  // Serve the counters in Prometheus text format at http://LISTEN/metrics
  // (host_metrics.hpp: "HOST:PORT", ":PORT" or "PORT" on 127.0.0.1; port 0
  // picks a free one). Until the host is destroyed.
  int serve_metrics(const std::string& listen);
  std::string metrics_url() const;  // "" when not serving

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
  // Publish an event decoded from `frame` (event_codec.hpp; `size` bytes, one
  // whole frame): the journal writes the frame's bytes instead of encoding
  // the event again, when publishing changes nothing the frame holds.
  int publish_decoded(const ballast_event& event, const char* publisher, const unsigned char* frame, size_t size);
  int publish_json(const std::string& topic, const std::string& json, const char* publisher);
  int subscribe(const char* pattern, const ballast_subscribe_options* options, ballast_handler handler, void* user,
                const char* owner, uint64_t* id);
  int unsubscribe(uint64_t id);

  // The interface table `name`@`version` of loaded plugin `plugin` (""
  // for the first loaded plugin that offers it), or null; *state, when
  // given, is the plugin's state to call the table with.
  const void* get_interface(const std::string& plugin, const char* name, uint32_t version, void** state = nullptr);

  void log(int level, const std::string& who, const std::string& message);
  // Every counter on one log line, whatever the log level.
  void log_counters(const std::string& why);
  int64_t counter(const std::string& name) const;  // 0 when unknown
  // Every counter, bus ones and the sources' below included.
  nlohmann::json counters() const;
  // Counters kept where they are counted (the built-in policy plugin's
  // events, the cluster role's), read by counters() with the others: on
  // SIGUSR1/2, /metrics and the stop line. `source` returns {name: number}
  // and may be called from any thread until remove_counter_source(id)
  // returns. Thread-safe.
  uint64_t add_counter_source(std::function<nlohmann::json()> source);
  void remove_counter_source(uint64_t id);

  // The fence of plugin.h's fence_action: asked, for `plugin`, whether this
  // process may carry out an action of `kind` described by `record` (a JSON
  // object), which it records. Without one (the default) every action may
  // run. The cluster controller with etcd installs one (leader.hpp); an empty
  // function removes it, after the calls in flight return. Thread-safe.
  using ActionFence =
      std::function<int(const std::string& plugin, const std::string& kind, const nlohmann::json& record)>;
  void set_action_fence(ActionFence fence);
  // fence_action for `plugin`: validates, asks the fence, counts
  // fence.allowed / fence.refused. Thread-safe.
  int fence_action(const std::string& plugin, const char* kind, const char* record_json);
  // Whether an action's kind is a snapshot ("<name>.snapshot"): the plugin's whole state, which
  // replaces its earlier records in the action log and may be larger than one action's.
  static bool snapshot_kind(const std::string& kind) { return kind.size() > 9 && kind.ends_with(".snapshot"); }

  const std::string& node() const { return node_; }
  bool running() const { return started_ && !stopped_; }
  size_t plugin_count() const;
  Bus& bus() { return bus_; }

  struct Plugin;
  struct Timers;

 private:
  int add_plugin(const PluginFile& file, const nlohmann::json& config, bool first, bool optional = false);
  int start_plugin(Plugin& p);
  void counter_add(const std::string& name, int64_t delta);
  static int journal_handler(void* user, const ballast_event* event);
  void journal_failed(const std::string& why);
  void write_log(int level, const std::string& who, const std::string& message);
  void on_user_signal(int sig);

  std::string node_;
  std::atomic<int> log_level_;
  LogFormat log_format_;
  Bus bus_;
  std::unique_ptr<Timers> timers_;
  std::vector<std::unique_ptr<Plugin>> plugins_;
  Plugin* policy_ = nullptr;  // the built-in policy plugin, when loaded
  std::unique_ptr<class JournalWriter> journal_;
  uint64_t journal_subscription_ = 0;
  std::atomic<uint64_t> journal_failures_{0};  // appends and the final flush that failed
  mutable std::mutex counters_mutex_;
  std::vector<std::pair<std::string, std::unique_ptr<std::atomic<int64_t>>>> counters_;
  mutable std::mutex sources_mutex_;  // held while a source is read
  std::vector<std::pair<uint64_t, std::function<nlohmann::json()>>> counter_sources_;
  uint64_t next_source_id_ = 1;
  uint64_t policy_counters_ = 0;           // the policy plugin's source, while it exists
  mutable std::shared_mutex fence_mutex_;  // held shared while the fence runs
  ActionFence fence_;
  std::mutex log_mutex_;
  bool started_ = false;
  bool stopped_ = false;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stop_requested_{false};
  std::atomic<size_t> plugins_loaded_{0};       // plugins_.size(), for other threads
  std::unique_ptr<class HostMetrics> metrics_;  // declared last: stopped first

  friend struct HostApiTable;
};

}  // namespace ballast
