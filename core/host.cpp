#include "host.hpp"

#include "config.hpp"
#include "error.hpp"
#include "event_codec.hpp"
#include "journal.hpp"

#include <ballast/command.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <filesystem>
#include <map>
#include <thread>

namespace fs = std::filesystem;

namespace ballast {

namespace {

// SIGINT or SIGTERM arrived (set by the signal handler, for waits that
// cannot read the wake pipe).
std::atomic<bool> g_stop_signal{false};

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string machine_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

const char* level_name(int level) {
  switch (level) {
    case BALLAST_LOG_ERROR: return "ERROR";
    case BALLAST_LOG_WARN: return "WARN";
    case BALLAST_LOG_INFO: return "INFO";
    default: return "DEBUG";
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

// ---- the policy's outbox ------------------------------------------------------
// What a policy publishes is handed to this thread instead of being published
// from the dispatcher thread that runs the policy: a policy subscribed to its
// own topics (recovery.action, "*") would otherwise block that dispatcher on
// its own full queue. The outbox grows only as fast as the policy reacts.
struct Host::Outbox {
  Host& host;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<OwnedEvent> events;
  bool quit = false;
  std::thread thread;

  explicit Outbox(Host& h) : host(h), thread([this] { loop(); }) {}
  ~Outbox() {
    {
      std::lock_guard lock(mutex);
      quit = true;
    }
    cv.notify_all();
    thread.join();
  }
  void push(const ballast_event& event) {
    OwnedEvent copy(event);
    {
      std::lock_guard lock(mutex);
      events.push_back(std::move(copy));
    }
    cv.notify_one();
  }
  void loop() {
    std::unique_lock lock(mutex);
    for (;;) {
      cv.wait(lock, [&] { return quit || !events.empty(); });
      if (events.empty()) return;  // quit, and everything handed over
      OwnedEvent ev = std::move(events.front());
      events.pop_front();
      lock.unlock();
      if (host.publish(ev.view(), "policy") != BALLAST_OK)
        host.log(BALLAST_LOG_WARN, "policy", std::string("could not publish ") + ev.view().topic + ": " + last_error());
      lock.lock();
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
  std::mutex mutex;  // guards the two members below
  std::map<std::string, std::string> config_text;  // node-based: stable c_str()
  std::vector<uint64_t> subscriptions;
};

struct HostApiTable {
  static Host::Plugin* self(const ballast_host_api* api) {
    return reinterpret_cast<Host::Plugin*>(const_cast<ballast_host_api*>(api));
  }
  static int publish(const ballast_host_api* api, const ballast_event* event) {
    if (api == nullptr || event == nullptr) return fail(BALLAST_EINVAL, "publish: null argument");
    auto* p = self(api);
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
    return p->host->unsubscribe(id);
  }
  static void log(const ballast_host_api* api, int level, const char* message) {
    if (api == nullptr) return;
    auto* p = self(api);
    p->host->log(level, p->file.name, message ? message : "");
  }
  static int config_get(const ballast_host_api* api, const char* key, const char** value) {
    if (api == nullptr || key == nullptr || value == nullptr) return fail(BALLAST_EINVAL, "config_get: null argument");
    auto* p = self(api);
    const nlohmann::json* v = config_lookup(p->config, key);
    if (v == nullptr) return fail(BALLAST_ENOTFOUND, "plugin " + p->file.name + ": no config key '" + key + "'");
    std::lock_guard lock(p->mutex);
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
    return self(api)->host->timers_->cancel(id);
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
    return a;
  }
};

// ---- the host --------------------------------------------------------------

Host::Host(HostOptions options)
    : node_(options.node.empty() ? machine_name() : options.node),
      log_level_(options.log_level),
      bus_(options.bus),
      timers_(std::make_unique<Timers>()),
      outbox_(std::make_unique<Outbox>(*this)) {
  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) wake_pipe_[0] = wake_pipe_[1] = -1;
}

Host::~Host() {
  stop();
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

size_t Host::plugin_count() const { return plugins_.size(); }

const void* Host::get_interface(const std::string& plugin, const char* name, uint32_t version) {
  for (auto& p : plugins_)
    if (p->created && p->file.name == plugin && p->file.get_interface != nullptr)
      return p->file.get_interface(p->state, name, version);
  return nullptr;
}

void Host::log(int level, const std::string& who, const std::string& message) {
  if (level > log_level_) return;
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  std::lock_guard lock(log_mutex_);
  std::fprintf(stderr, "%s.%03dZ %-5s [%s] %s\n", stamp, ms, level_name(level), who.c_str(), message.c_str());
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
  std::lock_guard lock(counters_mutex_);
  for (auto& [n, v] : counters_) out[n] = v->load(std::memory_order_relaxed);
  return out;
}

int Host::load_plugin(const std::string& path, const nlohmann::json& config) {
  PluginFile file;
  if (int rc = load_plugin_file(path, &file); rc != BALLAST_OK) {
    log(BALLAST_LOG_ERROR, "host", last_error());
    return rc;
  }
  for (const auto& p : plugins_)
    if (p->file.name == file.name)
      return fail(BALLAST_EINVAL, "plugin " + file.path + " refused: a plugin named '" + file.name +
                                      "' is already loaded from " + p->file.path);
  auto plugin = std::make_unique<Plugin>();
  plugin->api = HostApiTable::make();
  plugin->host = this;
  plugin->file = file;
  plugin->config = config.is_null() ? nlohmann::json::object() : config;
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
  log(BALLAST_LOG_INFO, "host", "loaded plugin " + file.name + " " + file.version + " from " + file.path);
  plugins_.push_back(std::move(plugin));
  if (started_ && !stopped_) {
    Plugin& p = *plugins_.back();
    if (p.file.descriptor->start && p.file.descriptor->start(p.state) != BALLAST_OK) {
      log(BALLAST_LOG_ERROR, "host", "plugin " + p.file.name + " failed to start: " + last_error());
      return fail(BALLAST_EPLUGIN, "plugin " + p.file.name + " failed to start");
    }
    p.started = true;
  }
  return BALLAST_OK;
}

int Host::open_journal(const std::string& path) {
  auto journal = std::make_unique<JournalWriter>();
  // Grouped: one write per burst of events, not per event.
  if (int rc = journal->open(path, JournalWriter::Mode::grouped); rc != BALLAST_OK) return rc;
  journal_ = std::move(journal);
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_QUEUED, 0, 0};
  return bus_.subscribe("*", &opts, journal_handler, this, "journal", &journal_subscription_);
}

int Host::journal_handler(void* user, const ballast_event* event) {
  auto* host = static_cast<Host*>(user);
  int rc = host->journal_->append(*event);
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

// ---- policy ---------------------------------------------------------------

namespace {

// Turns what a policy does into events on the bus.
// `json` (an object's text) under `topic` as an event: the topic's
// well-known struct, or JSON. Status; *error says what is wrong.
int event_from_text(const std::string& topic, const std::string& json, OwnedEvent* out, std::string* error) {
  nlohmann::json payload = nlohmann::json::parse(json, nullptr, false);
  if (payload.is_discarded()) {
    *error = "payload is not valid JSON";
    return BALLAST_EFORMAT;
  }
  return event_from_json(nlohmann::json{{"topic", topic}, {"payload", std::move(payload)}}, out, error);
}

class BusSink : public PolicySink {
 public:
  BusSink(Host& host, Host::Outbox& outbox, const std::string& policy)
      : host_(host), outbox_(outbox), policy_(policy) {}
  void on_action(const PolicyAction& a) override {
    ballast_recovery_action payload{};
    payload.size = sizeof payload;
    payload.action = a.action.c_str();
    payload.subject = a.subject.empty() ? nullptr : a.subject.c_str();
    payload.reason = a.reason.c_str();
    payload.args = a.args_json.c_str();
    payload.policy = policy_.c_str();
    payload.cause_topic = a.cause_topic.empty() ? nullptr : a.cause_topic.c_str();
    ballast_event ev{};
    ev.size = sizeof ev;
    ev.schema = BALLAST_SCHEMA_RECOVERY_ACTION;
    ev.topic = "recovery.action";
    ev.source.rank = -1;
    ev.payload = &payload;
    ev.payload_size = sizeof payload;
    outbox_.push(ev);
  }
  void on_publish(const std::string& topic, const std::string& json) override { push_json(topic, json); }
  void on_log(int level, const std::string& message) override { host_.log(level, "policy " + policy_, message); }
  void on_error(const std::string& message) override {
    host_.log(BALLAST_LOG_ERROR, "policy " + policy_, message);
    push_json("policy.error", nlohmann::json{{"policy", policy_}, {"message", message}}
                                    .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }

 private:
  void push_json(const std::string& topic, const std::string& json) {
    OwnedEvent ev;
    std::string error;
    if (event_from_text(topic, json, &ev, &error) != BALLAST_OK) {
      host_.log(BALLAST_LOG_WARN, "policy " + policy_, "ballast.publish(" + topic + ") dropped: " + error);
      return;
    }
    outbox_.push(ev.view());
  }

  Host& host_;
  Host::Outbox& outbox_;
  std::string policy_;
};

// Whether pattern `outer` matches every topic `inner` matches.
bool covers(const std::string& outer, const std::string& inner) {
  if (outer == "*" || outer == inner) return true;
  if (outer.size() >= 2 && outer.compare(outer.size() - 2, 2, ".*") == 0) {
    std::string prefix = outer.substr(0, outer.size() - 1);  // "a."
    return inner.rfind(prefix, 0) == 0 && inner != "*";
  }
  return false;
}

}  // namespace

int Host::policy_handler(void* user, const ballast_event* event) {
  static_cast<Host*>(user)->policy_event(*event);
  return 0;
}

void Host::policy_event(const ballast_event& event) {
  std::lock_guard lock(policy_mutex_);
  if (!policy_) return;
  BusSink sink(*this, *outbox_, policy_->name());
  policy_->handle(event, sink);
}

int Host::subscribe_policy() {
  for (uint64_t id : policy_subscriptions_) bus_.unsubscribe(id);
  policy_subscriptions_.clear();
  std::vector<std::string> patterns;
  {
    std::lock_guard lock(policy_mutex_);
    if (!policy_) return BALLAST_OK;
    patterns = policy_->patterns();
  }
  // Subscribe to a covering set only, so that no event reaches the policy twice.
  std::vector<std::string> cover;
  for (size_t i = 0; i < patterns.size(); ++i) {
    bool covered = false;
    for (size_t j = 0; j < patterns.size() && !covered; ++j)
      if (i != j && covers(patterns[j], patterns[i]) && !(covers(patterns[i], patterns[j]) && j > i))
        covered = true;
    if (!covered) cover.push_back(patterns[i]);
  }
  ballast_subscribe_options opts{sizeof opts, BALLAST_DELIVER_QUEUED, 0, 0};
  for (const auto& pattern : cover) {
    uint64_t id = 0;
    if (int rc = bus_.subscribe(pattern, &opts, policy_handler, this, "policy", &id); rc != BALLAST_OK) return rc;
    policy_subscriptions_.push_back(id);
  }
  return BALLAST_OK;
}

int Host::load_policy(const std::string& path, PolicyOptions options) {
  std::unique_ptr<Policy> policy;
  if (int rc = Policy::load(path, std::move(options), &policy); rc != BALLAST_OK) return rc;
  {
    std::lock_guard lock(policy_mutex_);
    policy_ = std::move(policy);
  }
  log(BALLAST_LOG_INFO, "host", "loaded policy " + path);
  return started_ && !stopped_ ? subscribe_policy() : BALLAST_OK;
}

int Host::reload_policy() {
  int rc;
  {
    // A handler may run until its deadline (up to an hour): SIGINT and
    // SIGTERM still stop the host meanwhile.
    std::unique_lock lock(policy_mutex_, std::defer_lock);
    while (!lock.try_lock_for(std::chrono::milliseconds(100))) {
      if (stop_requested_.load() || g_stop_signal.load()) {
        return fail(BALLAST_ESTATE, "policy reload abandoned: the host is stopping");
      }
    }
    if (!policy_) return fail(BALLAST_ESTATE, "no policy loaded");
    rc = policy_->reload();
  }
  if (rc != BALLAST_OK) {
    log(BALLAST_LOG_ERROR, "host", std::string("policy reload failed, the old policy stays: ") + last_error());
    return rc;
  }
  log(BALLAST_LOG_INFO, "host", "policy reloaded");
  return started_ && !stopped_ ? subscribe_policy() : BALLAST_OK;
}

// ---- events -----------------------------------------------------------------

int Host::publish(const ballast_event& event, const char* publisher) {
  if (event.topic == nullptr) return fail(BALLAST_EINVAL, "publish: event without a topic");
  if (event.size < offsetof(ballast_event, payload_size) + sizeof event.payload_size)
    return fail(BALLAST_EINVAL, "publish: event size " + std::to_string(event.size) + " is too small");
  ballast_event ev = event;  // a few words on the stack; the payload is not copied
  ev.size = sizeof ev;
  if (ev.ts_ns == 0) ev.ts_ns = wall_ns();
  if (ev.source.node == nullptr) ev.source.node = node_.c_str();
  ev.source.plugin = publisher;
  return bus_.publish(ev);
}

int Host::publish_json(const std::string& topic, const std::string& json, const char* publisher) {
  OwnedEvent owned;
  std::string error;
  if (int rc = event_from_text(topic, json, &owned, &error); rc != BALLAST_OK)
    return fail(rc, "publish_json " + topic + ": " + error);
  return publish(owned.view(), publisher);
}

int Host::subscribe(const char* pattern, const ballast_subscribe_options* options, ballast_handler handler,
                    void* user, const char* owner, uint64_t* id) {
  if (pattern == nullptr || handler == nullptr || id == nullptr)
    return fail(BALLAST_EINVAL, "subscribe: null argument");
  return bus_.subscribe(pattern, options, handler, user, owner ? owner : "host", id);
}

int Host::unsubscribe(uint64_t id) { return bus_.unsubscribe(id); }

// ---- life cycle -------------------------------------------------------------

int Host::start() {
  if (started_) return fail(BALLAST_ESTATE, "host already started");
  started_ = true;
  if (int rc = subscribe_policy(); rc != BALLAST_OK) return rc;
  for (auto& p : plugins_) {
    if (!p->created) continue;
    if (p->file.descriptor->start) {
      clear_error();
      int rc = p->file.descriptor->start(p->state);
      if (rc != BALLAST_OK) {
        log(BALLAST_LOG_ERROR, "host",
            "plugin " + p->file.name + " failed to start (" + ballast_status_name(rc) + "): " + last_error() +
                "; it stays loaded but inactive");
        continue;
      }
    }
    p->started = true;
  }
  return BALLAST_OK;
}

namespace {
std::atomic<Host*> g_signal_host{nullptr};
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
  struct sigaction old_int{}, old_term{}, old_hup{};
  if (handle_signals) {
    g_stop_signal.store(false);
    g_signal_host.store(this);
    g_signal_fd.store(wake_pipe_[1]);
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
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
            log(BALLAST_LOG_INFO, "host", std::string("received ") + (buf[i] == SIGINT ? "SIGINT" : "SIGTERM") +
                                              ", stopping");
            stop_requested_.store(true);
          }
        }
      }
    }
    if (g_hup.exchange(false) || reload_requested_.exchange(false)) {
      log(BALLAST_LOG_INFO, "host", "reloading the policy");
      reload_policy();
    }
  }
  if (handle_signals) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGHUP, &old_hup, nullptr);
    g_signal_fd.store(-1);
    g_signal_host.store(nullptr);
  }
  stop();
  return BALLAST_OK;
}

void Host::stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  for (auto it = plugins_.rbegin(); it != plugins_.rend(); ++it) {
    Plugin& p = **it;
    if (!p.started) continue;
    if (p.file.descriptor->stop) p.file.descriptor->stop(p.state);
    p.started = false;
    timers_->cancel_owner(p.file.name);
    std::vector<uint64_t> subs;
    {
      std::lock_guard lock(p.mutex);
      subs.swap(p.subscriptions);
    }
    for (uint64_t id : subs) bus_.unsubscribe(id);
    log(BALLAST_LOG_INFO, "host", "stopped plugin " + p.file.name);
  }
  // Deliver what is queued to the journal. The policy's handler call in
  // progress is interrupted and the events still queued for it are skipped
  // (counted): what it answered would not be published any more, and a
  // stuck handler must not hold the host for its deadline.
  if (policy_) policy_->stop();
  bus_.shutdown();
  if (policy_ && policy_->skipped() > 0) {
    log(BALLAST_LOG_WARN, "host", "policy " + policy_->name() + ": " + std::to_string(policy_->skipped()) +
                                      " queued event(s) not handled: the host stopped");
  }
  outbox_.reset();
  if (journal_ && journal_->flush(true) != BALLAST_OK) journal_failed(last_error());
}

// ---- configuration ------------------------------------------------------------

namespace {

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

}  // namespace

int Host::from_config(const nlohmann::json& config, const std::string& base_dir, std::unique_ptr<Host>* out) {
  if (!config.is_object()) return fail(BALLAST_EINVAL, "config: expected a table");
  HostOptions options;
  if (auto* node = config_lookup(config, "node")) {
    if (!node->is_string()) return fail(BALLAST_EINVAL, "config field 'node': expected a string");
    options.node = node->get<std::string>();
  }
  if (auto* role = config_lookup(config, "role")) {
    if (!role->is_string() || (*role != "agent" && *role != "controller"))
      return fail(BALLAST_EINVAL, "config field 'role': expected \"agent\" or \"controller\"");
  }
  if (auto* level = config_lookup(config, "log_level")) {
    static const char* names[] = {"error", "warn", "info", "debug"};
    bool ok = false;
    for (int i = 0; i < 4; ++i)
      if (level->is_string() && *level == names[i]) options.log_level = i, ok = true;
    if (!ok) return fail(BALLAST_EINVAL, "config field 'log_level': expected error, warn, info or debug");
  }
  uint64_t threads = 0, capacity = 0;
  if (int rc = as_uint(config, "bus.dispatcher_threads", 1, 1024, &threads); rc != BALLAST_OK) return rc;
  if (int rc = as_uint(config, "bus.queue_capacity", 4096, uint64_t{1} << 30, &capacity); rc != BALLAST_OK) return rc;
  if (threads == 0 || threads > 64) return fail(BALLAST_EINVAL, "config field 'bus.dispatcher_threads': expected 1..64");
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
    if (!plugins->is_array()) return fail(BALLAST_EINVAL, "config field 'plugins': expected a list");
    for (size_t i = 0; i < plugins->size(); ++i) {
      const auto& entry = (*plugins)[i];
      std::string field = "plugins[" + std::to_string(i + 1) + "]";
      std::string reference;
      nlohmann::json plugin_config = nlohmann::json::object();
      if (entry.is_string()) {
        reference = entry.get<std::string>();
      } else if (entry.is_object() && entry.contains("path") && entry["path"].is_string()) {
        reference = entry["path"].get<std::string>();
        if (entry.contains("config")) {
          if (!entry["config"].is_object())
            return fail(BALLAST_EINVAL, "config field '" + field + ".config': expected a table");
          plugin_config = entry["config"];
        }
      } else {
        return fail(BALLAST_EINVAL, "config field '" + field + "': expected a name or { path = ..., config = {...} }");
      }
      std::string path;
      if (resolve_plugin(reference, base_dir, &path) != BALLAST_OK) {
        host->log(BALLAST_LOG_ERROR, "host", "config field '" + field + "': " + last_error());
        continue;  // the host keeps running without it
      }
      host->load_plugin(path, plugin_config);  // failures are logged, the host goes on
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
      if (int rc = as_uint(*policy, "deadline_ms", popts.call_deadline_ms, 3600000, &deadline); rc != BALLAST_OK) return rc;
      if (int rc = as_uint(*policy, "memory_mb", popts.memory_limit_bytes >> 20, uint64_t{1} << 20, &memory); rc != BALLAST_OK) return rc;
      popts.call_deadline_ms = static_cast<uint32_t>(deadline);
      popts.memory_limit_bytes = memory << 20;
    } else {
      return fail(BALLAST_EINVAL, "config field 'policy': expected a script path or { script = ..., ... }");
    }
    bool known = false;
    for (const char* a : kRecoveryActions) known = known || popts.fallback_action == a;
    if (!known) return fail(BALLAST_EINVAL, "config field 'policy.fallback': '" + popts.fallback_action +
                                                "' is not a recovery action");
    if (int rc = host->load_policy(script_search(script, base_dir), popts); rc != BALLAST_OK) return rc;
  }
  *out = std::move(host);
  return BALLAST_OK;
}

// ---- plugin subcommands -----------------------------------------------------------

bool Host::commands_in(const PluginFile& f, std::string* error,
                       const std::function<bool(void*, const ballast_command&)>& visit) {
  HostOptions o;
  o.log_level = BALLAST_LOG_WARN;
  Host host(o);
  if (host.load_plugin(f.path, nlohmann::json::object()) != BALLAST_OK) {
    *error = last_error();
    return false;
  }
  Plugin& p = *host.plugins_.back();
  auto* table = static_cast<const ballast_command_table*>(
      f.get_interface(p.state, BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION));
  const std::string who = "plugin " + f.path + " (" + f.name + "): ";
  if (table == nullptr || table->size < sizeof(ballast_command_table)) {
    *error = who + "offers ballast.command but returns no valid command table";
    return false;
  }
  if (table->count > 256 || (table->count > 0 && table->commands == nullptr)) {
    *error = who + "command table claims " + std::to_string(table->count) + " command(s) at " +
             (table->commands ? "an address" : "NULL") + " (at most 256 allowed)";
    return false;
  }
  for (uint32_t i = 0; i < table->count; ++i) {
    const ballast_command& c = table->commands[i];
    if (c.name == nullptr || strnlen(c.name, 65) > 64 || (c.summary && strnlen(c.summary, 257) > 256)) {
      *error = who + "command " + std::to_string(i) + " has no name or a name or summary too long";
      return false;
    }
    if (visit(p.state, c)) return true;
  }
  return false;
}

std::vector<PluginProbe> Host::command_probes() {
  std::vector<std::string> files;
  for (const auto& dir : plugin_search_path())
    for (const auto& path : plugin_files_in(dir)) files.push_back(path);
  return probe_plugin_files(files, true);
}

std::vector<std::pair<std::string, std::string>> Host::list_commands(const std::vector<PluginProbe>& probes) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& p : probes)
    for (const auto& c : p.commands) {
      bool dup = false;
      for (const auto& o : out) dup = dup || o.first == c.first;
      if (!dup) out.push_back(c);
    }
  return out;
}

int Host::run_command(const std::string& name, const std::vector<PluginProbe>& probes, int argc, char** argv) {
  for (const auto& probe : probes) {
    bool offers = false;
    for (const auto& c : probe.commands) offers = offers || c.first == name;
    if (!offers) continue;
    // Only the plugin that offers the command is loaded in this process.
    PluginFile f;
    std::string error;
    int rc = -1;
    if (load_plugin_file(probe.path, &f) != BALLAST_OK) {
      error = last_error();
    } else {
      commands_in(f, &error, [&](void* state, const ballast_command& c) {
        if (name != c.name || c.run == nullptr) return false;
        rc = c.run(state, argc, argv);
        return true;
      });
    }
    if (rc >= 0) return rc;
    std::fprintf(stderr, "ballast %s: %s\n", name.c_str(), error.empty() ? "the command has no run()" : error.c_str());
    return 1;
  }
  return -1;
}

}  // namespace ballast
