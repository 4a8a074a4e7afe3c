#include "host.hpp"

#include "command_line.hpp"
#include "config_file.hpp"
#include "error.hpp"
#include "event_codec.hpp"
#include "host_metrics.hpp"
#include "journal.hpp"
#include "policy_plugin.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <thread>

namespace ballast {

namespace {

// SIGINT or SIGTERM arrived (set by the signal handler, for waits that
// cannot read the wake pipe).
std::atomic<bool> g_stop_signal{false};

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string machine_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

const char* level_name(int level) {
  switch (level) {
    case BALLAST_LOG_ERROR:
      return "ERROR";
    case BALLAST_LOG_WARN:
      return "WARN";
    case BALLAST_LOG_INFO:
      return "INFO";
    default:
      return "DEBUG";
  }
}

// The keys of `config` (dotted paths) that were not asked for: a key is
// known when it was asked for, or a key below it was (its table is then
// checked key by key), or a key above it was.
void unknown_keys(const nlohmann::json& config, const std::string& prefix, const std::set<std::string>& asked,
                  std::vector<std::string>* out) {
  for (const auto& [key, value] : config.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (asked.count(path)) continue;
    auto below = asked.lower_bound(path + ".");
    if (below == asked.end() || below->rfind(path + ".", 0) != 0) {
      out->push_back(path);
    } else if (value.is_object()) {
      unknown_keys(value, path, asked, out);
    }
  }
}

}  // namespace

// ---- timers ---------------------------------------------------------------
// One thread per host runs every plugin timer. cancel() waits for a running
// callback, so that after it returns the callback is neither running nor due.
struct Host::Timers {
  struct Timer {
    uint64_t period_ns;
    std::chrono::steady_clock::time_point due;
    ballast_timer_fn fn;
    void* user;
    std::string owner;
  };
  std::mutex mutex;
  std::condition_variable cv;
  std::map<uint64_t, Timer> timers;
  uint64_t next_id = 1;
  uint64_t running_id = 0;
  bool quit = false;
  std::thread thread;

  Timers() : thread([this] { loop(); }) {}
  ~Timers() {
    {
      std::lock_guard lock(mutex);
      quit = true;
    }
    cv.notify_all();
    thread.join();
  }

  uint64_t add(uint64_t period_ns, ballast_timer_fn fn, void* user, std::string owner) {
    std::lock_guard lock(mutex);
    uint64_t id = next_id++;
    auto due = std::chrono::steady_clock::now() + std::chrono::nanoseconds(period_ns);
    timers.emplace(id, Timer{period_ns, due, fn, user, std::move(owner)});
    cv.notify_all();
    return id;
  }

  int cancel(uint64_t id) {
    std::unique_lock lock(mutex);
    if (std::this_thread::get_id() == thread.get_id() && running_id == id)
      return fail(BALLAST_EINVAL, "timer_cancel called from the timer's own callback");
    if (timers.erase(id) == 0) return fail(BALLAST_ENOTFOUND, "no timer " + std::to_string(id));
    cv.wait(lock, [&] { return running_id != id; });
    return BALLAST_OK;
  }

  void cancel_owner(const std::string& owner) {
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(mutex);
      for (auto& [id, t] : timers)
        if (t.owner == owner) ids.push_back(id);
    }
    for (uint64_t id : ids) cancel(id);
  }

  void loop() {
    std::unique_lock lock(mutex);
    while (!quit) {
      if (timers.empty()) {
        cv.wait(lock);
        continue;
      }
      auto next = timers.begin();
      for (auto it = timers.begin(); it != timers.end(); ++it)
        if (it->second.due < next->second.due) next = it;
      if (std::chrono::steady_clock::now() < next->second.due) {
        // A copy: the timer may be cancelled (erased) while we wait.
        const auto due = next->second.due;
        cv.wait_until(lock, due);
        continue;
      }
      uint64_t id = next->first;
      Timer t = next->second;
      next->second.due += std::chrono::nanoseconds(t.period_ns);
      // A callback that overran its period does not cause a burst of catch-up calls.
      if (next->second.due < std::chrono::steady_clock::now())
        next->second.due = std::chrono::steady_clock::now() + std::chrono::nanoseconds(t.period_ns);
      running_id = id;
      lock.unlock();
      t.fn(t.user);
      lock.lock();
      running_id = 0;
      cv.notify_all();
    }
  }
};

// ---- plugins and the host API table ----------------------------------------

struct Host::Plugin {
  ballast_host_api api;  // first member: the api pointer is the Plugin pointer
  Host* host = nullptr;
  PluginFile file;
  nlohmann::json config;
  void* state = nullptr;
  bool created = false;
  bool started = false;
  // Set by stop(): the host cancelled the plugin's timers (winding_down), and
  // refuses its publish once its stop() returned (stopped).
  std::atomic<bool> winding_down{false};
  std::atomic<bool> stopped{false};
  bool optional = false;                           // a failed start is reported, not an error
  std::mutex mutex;                                // guards the three members below
  std::map<std::string, std::string> config_text;  // node-based: stable c_str()
  std::set<std::string> asked;                     // every key config_get was called with
  std::vector<uint64_t> subscriptions;
};

struct HostApiTable {
  static Host::Plugin* self(const ballast_host_api* api) {
    return reinterpret_cast<Host::Plugin*>(const_cast<ballast_host_api*>(api));
  }
  static int publish(const ballast_host_api* api, const ballast_event* event) {
    if (api == nullptr || event == nullptr) return fail(BALLAST_EINVAL, "publish: null argument");
    auto* p = self(api);
    if (p->stopped.load(std::memory_order_relaxed))
      return fail(BALLAST_ESTATE, "plugin " + p->file.name + ": publish after its stop() returned");
    return p->host->publish(*event, p->file.name.c_str());
  }
  static int subscribe(const ballast_host_api* api, const char* pattern, const ballast_subscribe_options* options,
                       ballast_handler handler, void* user, uint64_t* id) {
    if (api == nullptr || id == nullptr) return fail(BALLAST_EINVAL, "subscribe: null argument");
    auto* p = self(api);
    int rc = p->host->subscribe(pattern, options, handler, user, p->file.name.c_str(), id);
    if (rc == BALLAST_OK) {
      std::lock_guard lock(p->mutex);
      p->subscriptions.push_back(*id);
    }
    return rc;
  }
  static int unsubscribe(const ballast_host_api* api, uint64_t id) {
    if (api == nullptr) return fail(BALLAST_EINVAL, "unsubscribe: null api");
    auto* p = self(api);
    {
      std::lock_guard lock(p->mutex);
      std::erase(p->subscriptions, id);
    }
    const int rc = p->host->unsubscribe(id);
    // What the host cancelled when it stopped the plugin is not an error to cancel again.
    return rc == BALLAST_ENOTFOUND && p->winding_down.load() ? BALLAST_OK : rc;
  }
  static void log(const ballast_host_api* api, int level, const char* message) {
    if (api == nullptr) return;
    auto* p = self(api);
    p->host->log(level, p->file.name, message ? message : "");
  }
  static int config_get(const ballast_host_api* api, const char* key, const char** value) {
    if (api == nullptr || key == nullptr || value == nullptr) return fail(BALLAST_EINVAL, "config_get: null argument");
    auto* p = self(api);
    std::lock_guard lock(p->mutex);
    p->asked.insert(key);
    const nlohmann::json* v = config_lookup(p->config, key);
    if (v == nullptr) return fail(BALLAST_ENOTFOUND, "plugin " + p->file.name + ": no config key '" + key + "'");
    auto [it, inserted] = p->config_text.try_emplace(key, config_text(*v));
    *value = it->second.c_str();
    return BALLAST_OK;
  }
  static int timer_start(const ballast_host_api* api, uint64_t period_ns, ballast_timer_fn fn, void* user,
                         uint64_t* id) {
    if (api == nullptr || fn == nullptr || id == nullptr) return fail(BALLAST_EINVAL, "timer_start: null argument");
    if (period_ns < 1000) return fail(BALLAST_EINVAL, "timer_start: period below 1 us");
    auto* p = self(api);
    *id = p->host->timers_->add(period_ns, fn, user, p->file.name);
    return BALLAST_OK;
  }
  static int timer_cancel(const ballast_host_api* api, uint64_t id) {
    if (api == nullptr) return fail(BALLAST_EINVAL, "timer_cancel: null api");
    auto* p = self(api);
    const int rc = p->host->timers_->cancel(id);
    return rc == BALLAST_ENOTFOUND && p->winding_down.load() ? BALLAST_OK : rc;
  }
  static int counter_add(const ballast_host_api* api, const char* name, int64_t delta) {
    if (api == nullptr || name == nullptr) return fail(BALLAST_EINVAL, "counter_add: null argument");
    auto* p = self(api);
    p->host->counter_add(p->file.name + "." + name, delta);
    return BALLAST_OK;
  }
  static int64_t now_ns(const ballast_host_api*) { return wall_ns(); }
  static void set_error(const ballast_host_api* api, const char* message) {
    std::string who = api ? self(api)->file.name : "plugin";
    fail(BALLAST_EPLUGIN, who + ": " + (message ? message : "(no message)"));
  }
  static const char* last_error_fn(const ballast_host_api*) { return last_error(); }
  static const char* node_name(const ballast_host_api* api) { return api ? self(api)->host->node_.c_str() : ""; }
  static int fence_action(const ballast_host_api* api, const char* kind, const char* record_json) {
    if (api == nullptr) return fail(BALLAST_EINVAL, "fence_action: null api");
    auto* p = self(api);
    return p->host->fence_action(p->file.name, kind, record_json);
  }

  static ballast_host_api make() {
    ballast_host_api a{};
    a.size = sizeof a;
    a.abi_minor = BALLAST_ABI_MINOR;
    a.publish = publish;
    a.subscribe = subscribe;
    a.unsubscribe = unsubscribe;
    a.log = log;
    a.config_get = config_get;
    a.timer_start = timer_start;
    a.timer_cancel = timer_cancel;
    a.counter_add = counter_add;
    a.now_ns = now_ns;
    a.set_error = set_error;
    a.last_error = last_error_fn;
    a.node_name = node_name;
    a.fence_action = fence_action;
    return a;
  }
};

// ---- the host --------------------------------------------------------------

Host::Host(HostOptions options)
    : node_(options.node.empty() ? machine_name() : options.node),
      log_level_(options.log_level),
      log_format_(options.log_format),
      bus_(options.bus),
      timers_(std::make_unique<Timers>()) {
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) wake_pipe_[0] = wake_pipe_[1] = -1;
}

Host::~Host() {
  metrics_.reset();  // no scrape while the plugins go
  stop();
  if (policy_counters_ != 0) remove_counter_source(policy_counters_);
  // Destroy in reverse order of loading.
  for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
    Plugin& p = **it;
    if (p.created) {
      timers_->cancel_owner(p.file.name);
      p.file.descriptor->destroy(p.state);
      p.created = false;
    }
  }
  timers_.reset();
  if (journal_) journal_->close();
  for (int fd : wake_pipe_)
    if (fd >= 0) close(fd);
}

size_t Host::plugin_count() const { return plugins_loaded_.load(); }

int Host::serve_metrics(const std::string& listen) {
  if (metrics_) return fail(BALLAST_ESTATE, "metrics already served at " + metrics_->url());
  if (int rc = HostMetrics::create(*this, listen, &metrics_); rc != BALLAST_OK) return rc;
  log(BALLAST_LOG_INFO, "host", "serving metrics at " + metrics_->url());
  return BALLAST_OK;
}

std::string Host::metrics_url() const { return metrics_ ? metrics_->url() : std::string(); }

const void* Host::get_interface(const std::string& plugin, const char* name, uint32_t version, void** state) {
  for (auto& p : plugins_) {
    if (!p->created || (!plugin.empty() && p->file.name != plugin) || p->file.get_interface == nullptr) continue;
    if (const void* table = p->file.get_interface(p->state, name, version)) {
      if (state != nullptr) *state = p->state;
      return table;
    }
  }
  return nullptr;
}

void Host::log(int level, const std::string& who, const std::string& message) {
  if (level > log_level_.load(std::memory_order_relaxed)) return;
  write_log(level, who, message);
}

void Host::log_counters(const std::string& why) {
  std::string line = why + ": counters";
  const nlohmann::json all = counters();
  for (const auto& [name, value] : all.items()) line += " " + name + "=" + value.dump();
  write_log(BALLAST_LOG_INFO, "host", line);
}

std::string log_line(LogFormat format, int level, const std::string& who, const std::string& message) {
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  char ts[48];
  std::snprintf(ts, sizeof ts, "%s.%03dZ", stamp, ms);
  if (format == LogFormat::json) {
    std::string level_text = level_name(level);
    for (char& c : level_text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const nlohmann::json line = {{"ts", ts}, {"level", level_text}, {"source", who}, {"message", message}};
    return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  char head[96];
  std::snprintf(head, sizeof head, "%s %-5s [", ts, level_name(level));
  return head + who + "] " + message;
}

void Host::write_log(int level, const std::string& who, const std::string& message) {
  const std::string line = log_line(log_format_, level, who, message);
  std::lock_guard lock(log_mutex_);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Host::counter_add(const std::string& name, int64_t delta) {
  std::lock_guard lock(counters_mutex_);
  for (auto& [n, v] : counters_)
    if (n == name) {
      v->fetch_add(delta, std::memory_order_relaxed);
      return;
    }
  counters_.emplace_back(name, std::make_unique<std::atomic<int64_t>>(delta));
}

void Host::set_action_fence(ActionFence fence) {
  std::unique_lock lock(fence_mutex_);
  fence_ = std::move(fence);
}

int Host::fence_action(const std::string& plugin, const char* kind, const char* record_json) {
  // A snapshot holds a plugin's whole state (a Slurm job's node list: about 100 bytes a node), an
  // action one operation. The action log may bound them lower (etcd's: 16 KiB and 1 MiB).
  constexpr size_t kMaxKind = 64, kMaxRecord = 64 * 1024, kMaxSnapshot = 1024 * 1024;
  auto refuse = [&](int rc) {
    counter_add("fence.refused", 1);
    return rc;
  };
  if (kind == nullptr || record_json == nullptr)
    return refuse(fail(BALLAST_EINVAL, "fence_action: null kind or record"));
  const std::string k = kind;
  const bool kind_ok = !k.empty() && k.size() <= kMaxKind && std::all_of(k.begin(), k.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
  if (!kind_ok)
    return refuse(fail(BALLAST_EINVAL, "fence_action: kind '" + k.substr(0, kMaxKind) + "' is not [a-z0-9_.-]{1,64}"));
  const size_t size = std::strlen(record_json);
  const bool snapshot = snapshot_kind(k);
  if (size > (snapshot ? kMaxSnapshot : kMaxRecord))
    return refuse(fail(BALLAST_EINVAL, "fence_action " + k + ": record of " + std::to_string(size) + " bytes, above " +
                                           (snapshot ? "1 MiB" : "64 KiB")));
  nlohmann::json record = nlohmann::json::parse(record_json, record_json + size, nullptr, false);
  if (!record.is_object()) return refuse(fail(BALLAST_EINVAL, "fence_action " + k + ": record is not a JSON object"));
  std::shared_lock lock(fence_mutex_);
  const int rc = fence_ ? fence_(plugin, k, record) : BALLAST_OK;
  if (rc != BALLAST_OK) return refuse(rc);
  counter_add("fence.allowed", 1);
  return BALLAST_OK;
}

int64_t Host::counter(const std::string& name) const {
  nlohmann::json all = counters();
  auto it = all.find(name);
  return it == all.end() ? 0 : it->get<int64_t>();
}

nlohmann::json Host::counters() const {
  nlohmann::json out = nlohmann::json::object();
  BusStats s = bus_.stats();
  out["bus.published"] = s.published;
  out["bus.delivered"] = s.delivered;
  out["bus.dropped"] = s.dropped;
  out["bus.handler_failures"] = s.handler_failures;
  out["bus.subscriptions"] = s.subscriptions;
  out["bus.topics"] = s.topics;
  if (journal_) out["journal.failed"] = journal_failures_.load();
  {
    std::lock_guard lock(counters_mutex_);
    for (auto& [n, v] : counters_) out[n] = v->load(std::memory_order_relaxed);
  }
  std::lock_guard lock(sources_mutex_);
  for (auto& [id, source] : counter_sources_) out.update(source());
  return out;
}

uint64_t Host::add_counter_source(std::function<nlohmann::json()> source) {
  std::lock_guard lock(sources_mutex_);
  counter_sources_.emplace_back(next_source_id_, std::move(source));
  return next_source_id_++;
}

void Host::remove_counter_source(uint64_t id) {
  std::lock_guard lock(sources_mutex_);
  std::erase_if(counter_sources_, [id](const auto& s) { return s.first == id; });
}

int Host::load_plugin(const std::string& path, const nlohmann::json& config, bool optional) {
  PluginFile file;
  if (int rc = load_plugin_file(path, &file); rc != BALLAST_OK) {
    log(optional ? BALLAST_LOG_WARN : BALLAST_LOG_ERROR, "host", last_error());
    return rc;
  }
  return add_plugin(file, config, false, optional);
}

// Create the plugin of `file` and keep it, last in the order (first: first).
int Host::add_plugin(const PluginFile& file, const nlohmann::json& config, bool first, bool optional) {
  for (const auto& p : plugins_)
    if (p->file.name == file.name)
      return fail(BALLAST_EINVAL, "plugin " + file.path + " refused: a plugin named '" + file.name +
                                      "' is already loaded from " + p->file.path);
  auto plugin = std::make_unique<Plugin>();
  plugin->api = HostApiTable::make();
  plugin->host = this;
  plugin->file = file;
  plugin->config = config.is_null() ? nlohmann::json::object() : config;
  plugin->optional = optional;
  clear_error();
  int rc = file.descriptor->create(&plugin->api, &plugin->state);
  if (rc != BALLAST_OK) {
    std::string why = *last_error() ? last_error() : ballast_status_name(rc);
    timers_->cancel_owner(file.name);
    for (uint64_t id : plugin->subscriptions) bus_.unsubscribe(id);
    log(BALLAST_LOG_ERROR, "host", "plugin " + file.name + " (" + file.path + ") failed to create: " + why);
    return fail(rc, "plugin " + file.name + " (" + file.path + ") failed to create: " + why);
  }
  plugin->created = true;
  // Keys it never asked for are typos: refused before anything runs.
  std::vector<std::string> unknown;
  unknown_keys(plugin->config, "", plugin->asked, &unknown);
  if (!unknown.empty()) {
    const std::vector<std::string> asked(plugin->asked.begin(), plugin->asked.end());
    std::string why = "unknown config key '" + unknown[0] + "'";
    if (const std::string near = util::closest(unknown[0], asked); !near.empty())
      why += " (did you mean '" + near + "'?)";
    if (unknown.size() > 1) why += " and " + std::to_string(unknown.size() - 1) + " more";
    std::string keys;
    for (const auto& k : asked) keys += (keys.empty() ? "" : ", ") + k;
    why += asked.empty() ? "; it takes no config keys" : "; the keys it takes: " + keys;
    timers_->cancel_owner(file.name);
    for (uint64_t id : plugin->subscriptions) bus_.unsubscribe(id);
    file.descriptor->destroy(plugin->state);
    log(BALLAST_LOG_ERROR, "host", "plugin " + file.name + " (" + file.path + ") refused: " + why);
    return fail(BALLAST_EINVAL, "plugin " + file.name + " (" + file.path + "): " + why);
  }
  log(BALLAST_LOG_INFO, "host", "loaded plugin " + file.name + " " + file.version + " from " + file.path);
  Plugin& p = *plugin;
  plugins_.insert(first ? plugins_.begin() : plugins_.end(), std::move(plugin));
  plugins_loaded_.store(plugins_.size());
  if (started_ && !stopped_) return start_plugin(p);
  return BALLAST_OK;
}

// A required plugin's failure is an error; an optional one's is reported.
int Host::start_plugin(Plugin& p) {
  if (p.file.descriptor->start) {
    clear_error();
    const int rc = p.file.descriptor->start(p.state);
    if (rc != BALLAST_OK) {
      const std::string why = "plugin " + p.file.name + " failed to start (" + ballast_status_name(rc) +
                              "): " + (*last_error() ? last_error() : "(no message)");
      if (p.optional) {
        log(BALLAST_LOG_WARN, "host", why + "; optional: it stays loaded but inactive");
        return BALLAST_OK;
      }
      log(BALLAST_LOG_ERROR, "host", why);
      return fail(BALLAST_EPLUGIN, why);
    }
  }
  p.started = true;
  return BALLAST_OK;
}

namespace {

// The frame an event on this thread's stack was decoded from, while
// publish_decoded() publishes it: journal_handler() matches the event by
// address (inline delivery hands the publisher's own event).
struct DecodedFrame {
  const ballast_event* event = nullptr;
  const unsigned char* frame = nullptr;
  size_t size = 0;
};
thread_local DecodedFrame t_decoded;

}  // namespace

int Host::open_journal(const std::string& path) {
  auto journal = std::make_unique<JournalWriter>();
  // Grouped: one write per burst of events, not per event.
  if (int rc = journal->open(path, JournalWriter::Mode::grouped); rc != BALLAST_OK) return rc;
  journal_ = std::move(journal);
  // Inline: each publisher encodes its own events into the writer's buffer
  // (no copy into a queue, no single dispatcher encoding every event); the
  // writer thread does the I/O.
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_INLINE, 0, 0};
  return bus_.subscribe("*", &opts, journal_handler, this, "journal", &journal_subscription_);
}

int Host::journal_handler(void* user, const ballast_event* event) {
  auto* host = static_cast<Host*>(user);
  int rc = event == t_decoded.event ? host->journal_->append_frames(t_decoded.frame, t_decoded.size)
                                    : host->journal_->append(*event);
  if (rc != BALLAST_OK) host->journal_failed(last_error());
  return rc;
}

// Counted (journal.failed), logged at the first failure and every 1000th.
void Host::journal_failed(const std::string& why) {
  uint64_t n = journal_failures_.fetch_add(1) + 1;
  if (n == 1 || n % 1000 == 0) {
    log(BALLAST_LOG_ERROR, "host", "journal: " + std::to_string(n) + " event(s) not written so far: " + why);
  }
}

// ---- the policy: a built-in plugin ---------------------------------------------

int Host::load_policy(const std::string& path, const PolicyOptions& options) {
  if (policy_ != nullptr) {
    if (int rc = policy_plugin_load(policy_->state, path, options); rc != BALLAST_OK) return rc;
  } else {
    nlohmann::json config = {{"script", path},
                             {"fallback", options.fallback_action},
                             {"deadline_ms", options.call_deadline_ms},
                             {"memory_bytes", options.memory_limit_bytes}};
    if (!options.name.empty()) config["name"] = options.name;
    PluginFile builtin;
    builtin.path = "(built in)";
    builtin.descriptor = policy_plugin_descriptor();
    builtin.descriptor_size = builtin.descriptor->size;
    builtin.name = builtin.descriptor->name;
    builtin.version = builtin.descriptor->version;
    builtin.kind = builtin.descriptor->kind;
    builtin.description = builtin.descriptor->description;
    builtin.abi_major = builtin.descriptor->abi_major;
    builtin.abi_minor = builtin.descriptor->abi_minor;
    // First in the order: it starts before the plugins whose events it watches
    // and stops after them.
    if (int rc = add_plugin(builtin, config, true); rc != BALLAST_OK) return rc;
    policy_ = plugins_.front().get();
    void* state = policy_->state;
    const std::string events = policy_->file.name + ".events";
    policy_counters_ = add_counter_source([state, events] {
      return nlohmann::json{{events, policy_plugin_events(state)}};
    });
  }
  log(BALLAST_LOG_INFO, "host", "loaded policy " + path);
  return BALLAST_OK;
}

int Host::reload_policy() {
  if (policy_ == nullptr) return fail(BALLAST_ESTATE, "no policy loaded");
  // A handler may run until its deadline (up to an hour): SIGINT and SIGTERM
  // still stop the host meanwhile.
  auto stopping = [this] { return stop_requested_.load() || g_stop_signal.load(); };
  if (int rc = policy_plugin_reload(policy_->state, stopping); rc != BALLAST_OK) {
    log(BALLAST_LOG_ERROR, "host", std::string("policy reload failed, the old policy stays: ") + last_error());
    return rc;
  }
  log(BALLAST_LOG_INFO, "host", "policy reloaded");
  return BALLAST_OK;
}

// ---- events -----------------------------------------------------------------

int Host::publish(const ballast_event& event, const char* publisher) {
  return publish_decoded(event, publisher, nullptr, 0);
}

int Host::publish_decoded(const ballast_event& event, const char* publisher, const unsigned char* frame, size_t size) {
  if (event.topic == nullptr) return fail(BALLAST_EINVAL, "publish: event without a topic");
  if (event.size < BALLAST_EVENT_V1_SIZE)
    return fail(BALLAST_EINVAL,
                "publish: event size " + std::to_string(event.size) + " is smaller than ballast_event v1");
  ballast_event ev = event;  // a few words on the stack; the payload is not copied
  ev.size = sizeof ev;
  // The frame is the published event only when nothing below changes it.
  const bool same = frame != nullptr && ev.ts_ns != 0 && ev.source.node != nullptr && ev.source.plugin != nullptr &&
                    publisher != nullptr && std::strcmp(ev.source.plugin, publisher) == 0;
  if (ev.ts_ns == 0) ev.ts_ns = wall_ns();
  if (ev.source.node == nullptr) ev.source.node = node_.c_str();
  ev.source.plugin = publisher;
  if (!same) return bus_.publish(ev);
  const DecodedFrame outer = t_decoded;  // a handler may publish from inside this publish
  t_decoded = {&ev, frame, size};
  const int rc = bus_.publish(ev);
  t_decoded = outer;
  return rc;
}

int Host::publish_json(const std::string& topic, const std::string& json, const char* publisher) {
  nlohmann::json payload = nlohmann::json::parse(json, nullptr, false);
  if (payload.is_discarded()) return fail(BALLAST_EFORMAT, "publish_json " + topic + ": payload is not valid JSON");
  OwnedEvent owned;
  std::string error;
  if (int rc = event_from_json(nlohmann::json{{"topic", topic}, {"payload", std::move(payload)}}, &owned, &error);
      rc != BALLAST_OK)
    return fail(rc, "publish_json " + topic + ": " + error);
  return publish(owned.view(), publisher);
}

int Host::subscribe(const char* pattern, const ballast_subscribe_options* options, ballast_handler handler, void* user,
                    const char* owner, uint64_t* id) {
  if (pattern == nullptr || handler == nullptr || id == nullptr)
    return fail(BALLAST_EINVAL, "subscribe: null argument");
  return bus_.subscribe(pattern, options, handler, user, owner ? owner : "host", id);
}

int Host::unsubscribe(uint64_t id) { return bus_.unsubscribe(id); }

// ---- life cycle -------------------------------------------------------------

int Host::start() {
  if (started_) return fail(BALLAST_ESTATE, "host already started");
  started_ = true;
  for (auto& p : plugins_) {
    if (!p->created) continue;
    if (int rc = start_plugin(*p); rc != BALLAST_OK) return rc;
  }
  return BALLAST_OK;
}

namespace {
std::atomic<int> g_signal_fd{-1};
std::atomic<bool> g_hup{false};

void on_signal(int sig) {
  if (sig == SIGHUP) g_hup.store(true);
  if (sig == SIGINT || sig == SIGTERM) g_stop_signal.store(true);
  int fd = g_signal_fd.load();
  if (fd >= 0) {
    char c = static_cast<char>(sig);
    ssize_t n = write(fd, &c, 1);
    (void)n;
  }
}
}  // namespace

void Host::request_stop() {
  stop_requested_.store(true);
  if (wake_pipe_[1] >= 0) {
    char c = 0;
    ssize_t n = write(wake_pipe_[1], &c, 1);
    (void)n;
  }
}

int Host::run(bool handle_signals, const std::function<void()>& on_ready) {
  if (!started_) {
    if (int rc = start(); rc != BALLAST_OK) return rc;
  }
  struct sigaction old_int {
  }, old_term{}, old_hup{}, old_usr1{}, old_usr2{};
  if (handle_signals) {
    g_stop_signal.store(false);
    g_signal_fd.store(wake_pipe_[1]);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    sigaction(SIGUSR1, &sa, &old_usr1);
    sigaction(SIGUSR2, &sa, &old_usr2);
  }
  if (on_ready) on_ready();
  while (!stop_requested_.load()) {
    pollfd pfd{wake_pipe_[0], POLLIN, 0};
    int n = poll(&pfd, 1, 1000);
    if (n > 0) {
      char buf[64];
      ssize_t got;
      while ((got = read(wake_pipe_[0], buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < got; ++i) {
          if (buf[i] == SIGINT || buf[i] == SIGTERM) {
            log(BALLAST_LOG_INFO, "host",
                std::string("received ") + (buf[i] == SIGINT ? "SIGINT" : "SIGTERM") + ", stopping");
            stop_requested_.store(true);
          } else if (buf[i] == SIGUSR1 || buf[i] == SIGUSR2) {
            on_user_signal(buf[i]);
          }
        }
      }
    }
    if (g_hup.exchange(false)) {
      log(BALLAST_LOG_INFO, "host", "reloading the policy");
      reload_policy();
    }
  }
  if (handle_signals) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGHUP, &old_hup, nullptr);
    sigaction(SIGUSR1, &old_usr1, nullptr);
    sigaction(SIGUSR2, &old_usr2, nullptr);
    g_signal_fd.store(-1);
  }
  stop();
  return BALLAST_OK;
}

// SIGUSR1 or SIGUSR2 (Slurm's --signal sends SIGUSR1 before the time limit):
// the counters go to the log, and host.signal to the bus, where a policy may
// act on it (checkpoint_now).
void Host::on_user_signal(int sig) {
  const std::string name = sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2";
  log_counters("received " + name);
  const nlohmann::json payload = {{"signal", name}, {"node", node_}};
  if (publish_json("host.signal", payload.dump(), "host") != BALLAST_OK)
    log(BALLAST_LOG_WARN, "host", std::string("host.signal not published: ") + last_error());
}

void Host::stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  // plugin.h's stop(): timers cancelled before, publish refused after, then
  // the subscriptions removed.
  for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
    Plugin& p = **it;
    if (!p.started) continue;
    p.winding_down.store(true);
    timers_->cancel_owner(p.file.name);
    if (p.file.descriptor->stop) p.file.descriptor->stop(p.state);
    p.stopped.store(true);
    p.started = false;
    std::vector<uint64_t> subs;
    {
      std::lock_guard lock(p.mutex);
      subs.swap(p.subscriptions);
    }
    for (uint64_t id : subs) bus_.unsubscribe(id);
    log(BALLAST_LOG_INFO, "host", "stopped plugin " + p.file.name);
  }
  // Deliver what is still queued (what its handlers publish is journaled as
  // it is published). The policy, stopped above, skips what is queued for it.
  bus_.shutdown();
  if (journal_ && journal_->flush(true) != BALLAST_OK) journal_failed(last_error());
}

}  // namespace ballast
