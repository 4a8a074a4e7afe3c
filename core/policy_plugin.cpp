#include "policy_plugin.hpp"

#include "error.hpp"
#include "event_codec.hpp"
#include "topic.hpp"

#include <ballast/events.h>
#include <ballast/status.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ballast {

namespace {

// What the policy publishes is handed to this thread instead of being
// published from the dispatcher thread that runs the policy: a policy
// subscribed to its own topics (recovery.action, "*") would otherwise block
// that dispatcher on its own full queue. It grows only as fast as the
// policy reacts.
class Outbox {
 public:
  explicit Outbox(const ballast_host_api* host) : host_(host), thread_([this] { loop(); }) {}
  ~Outbox() { close(); }

  // False once closed: the event is not published.
  bool push(OwnedEvent event) {
    {
      std::lock_guard lock(mutex_);
      if (quit_) return false;
      events_.push_back(std::move(event));
    }
    cv_.notify_one();
    return true;
  }

  // Publish what is queued, then stop the thread. Idempotent.
  void close() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || !events_.empty(); });
      if (events_.empty()) return;  // quit, and everything handed over
      OwnedEvent ev = std::move(events_.front());
      events_.pop_front();
      lock.unlock();
      if (host_->publish(host_, &ev.view()) != BALLAST_OK) {
        const std::string why = std::string("could not publish ") + ev.view().topic + ": " + host_->last_error(host_);
        host_->log(host_, BALLAST_LOG_WARN, why.c_str());
      }
      lock.lock();
    }
  }

  const ballast_host_api* host_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<OwnedEvent> events_;
  bool quit_ = false;
  std::thread thread_;
};

struct PolicyPlugin;

// Turns what the policy does into events for the outbox and lines for the log.
class OutboxSink : public PolicySink {
 public:
  OutboxSink(const ballast_host_api* host, Outbox& outbox, const std::string& policy)
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
    host_->counter_add(host_, "actions", 1);
    push(OwnedEvent(ev));
  }
  void on_publish(OwnedEvent event) override { push(std::move(event)); }
  void on_log(int level, const std::string& message) override { log(level, message); }
  void on_error(const std::string& message) override {
    host_->counter_add(host_, "errors", 1);
    log(BALLAST_LOG_ERROR, message);
    OwnedEvent ev;
    std::string why;
    const nlohmann::json j = {{"topic", "policy.error"}, {"payload", {{"policy", policy_}, {"message", message}}}};
    if (event_from_json(j, &ev, &why) == BALLAST_OK) push(std::move(ev));
  }

 private:
  void push(OwnedEvent event) {
    const std::string topic = event.view().topic;
    if (!outbox_.push(std::move(event))) log(BALLAST_LOG_WARN, "stopped: " + topic + " not published");
  }
  void log(int level, const std::string& message) { host_->log(host_, level, (policy_ + ": " + message).c_str()); }

  const ballast_host_api* host_;
  Outbox& outbox_;
  const std::string& policy_;
};

struct PolicyPlugin {
  const ballast_host_api* host;
  // One handler call or reload at a time (Policy's thread rule); timed: a
  // reload waiting for a stuck handler gives up when the host stops.
  std::timed_mutex mutex;
  std::unique_ptr<Policy> policy;
  // Events handled (the counter policy.events), counted here rather than
  // through host->counter_add on every event; the host reads it
  // (policy_plugin_events). Written under `mutex` only.
  std::atomic<uint64_t> events{0};
  std::vector<uint64_t> subscriptions;  // main thread only
  bool started = false;                 // main thread only
  Outbox outbox;

  explicit PolicyPlugin(const ballast_host_api* h) : host(h), outbox(h) {}

  int fail_with(int rc, const std::string& message) {
    host->set_error(host, message.c_str());
    return rc;
  }

  static int on_event(void* user, const ballast_event* event) {
    auto* p = static_cast<PolicyPlugin*>(user);
    std::lock_guard<std::timed_mutex> lock(p->mutex);
    p->events.store(p->events.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    OutboxSink sink(p->host, p->outbox, p->policy->name());
    p->policy->handle(*event, sink);
    return 0;
  }

  // Subscribe to a covering set of the script's patterns, so that no event
  // reaches the policy twice.
  int subscribe() {
    for (uint64_t id : subscriptions) host->unsubscribe(host, id);
    subscriptions.clear();
    std::vector<std::string> patterns;
    {
      std::lock_guard<std::timed_mutex> lock(mutex);
      patterns = policy->patterns();
    }
    const ballast_subscribe_options queued{sizeof queued, BALLAST_DELIVER_QUEUED, 0, 0};
    for (size_t i = 0; i < patterns.size(); ++i) {
      bool covered = false;
      for (size_t j = 0; j < patterns.size() && !covered; ++j)
        covered =
            i != j && pattern_covers(patterns[j], patterns[i]) && !(pattern_covers(patterns[i], patterns[j]) && j > i);
      if (covered) continue;
      uint64_t id = 0;
      if (int rc = host->subscribe(host, patterns[i].c_str(), &queued, on_event, this, &id); rc != BALLAST_OK)
        return rc;
      subscriptions.push_back(id);
    }
    return BALLAST_OK;
  }

  int load(const std::string& path, const PolicyOptions& options) {
    std::unique_ptr<Policy> fresh;
    if (int rc = Policy::load(path, options, &fresh); rc != BALLAST_OK) return fail_with(rc, last_error());
    {
      std::lock_guard<std::timed_mutex> lock(mutex);
      policy = std::move(fresh);
    }
    return started ? subscribe() : BALLAST_OK;
  }
};

// A config value as text, or `fallback` when absent.
std::string config_text(const ballast_host_api* host, const char* key, const std::string& fallback) {
  const char* value = nullptr;
  return host->config_get(host, key, &value) == BALLAST_OK ? std::string(value) : fallback;
}

// A non-negative integer config value, or `fallback` when absent.
int config_uint(const ballast_host_api* host, const char* key, uint64_t fallback, uint64_t* out) {
  const char* value = nullptr;
  if (host->config_get(host, key, &value) != BALLAST_OK) {
    *out = fallback;
    return BALLAST_OK;
  }
  char* end = nullptr;
  const unsigned long long v = std::strtoull(value, &end, 10);
  if (end == value || *end != '\0' || value[0] == '-') {
    host->set_error(host,
                    (std::string("config key '") + key + "': expected a non-negative integer, got " + value).c_str());
    return BALLAST_EINVAL;
  }
  *out = v;
  return BALLAST_OK;
}

int policy_create(const ballast_host_api* host, void** state) {
  const std::string script = config_text(host, "script", "");
  if (script.empty()) {
    host->set_error(host, "config key 'script': the policy file is required");
    return BALLAST_EINVAL;
  }
  PolicyOptions options;
  options.name = config_text(host, "name", "");
  options.fallback_action = config_text(host, "fallback", options.fallback_action);
  uint64_t deadline = 0, memory = 0;
  if (int rc = config_uint(host, "deadline_ms", options.call_deadline_ms, &deadline); rc != BALLAST_OK) return rc;
  if (int rc = config_uint(host, "memory_bytes", options.memory_limit_bytes, &memory); rc != BALLAST_OK) return rc;
  options.call_deadline_ms = static_cast<uint32_t>(deadline);
  options.memory_limit_bytes = memory;
  auto plugin = std::make_unique<PolicyPlugin>(host);
  if (int rc = plugin->load(script, options); rc != BALLAST_OK) return rc;
  *state = plugin.release();
  return BALLAST_OK;
}

int policy_start(void* state) {
  auto* p = static_cast<PolicyPlugin*>(state);
  p->started = true;
  return p->subscribe();
}

// The host has stopped the timers; the subscriptions go after stop returns.
// The handler call in progress is interrupted and the events still queued
// are skipped (counted): what it would answer is not published any more,
// and a stuck handler must not hold the host for its deadline. What the
// outbox holds is published before stop returns.
void policy_stop(void* state) {
  auto* p = static_cast<PolicyPlugin*>(state);
  p->started = false;
  p->policy->stop();
  p->outbox.close();
}

void policy_destroy(void* state) {
  auto* p = static_cast<PolicyPlugin*>(state);
  if (const uint64_t skipped = p->policy->skipped(); skipped > 0) {
    const std::string why =
        p->policy->name() + ": " + std::to_string(skipped) + " queued event(s) not handled: the host stopped";
    p->host->log(p->host, BALLAST_LOG_WARN, why.c_str());
  }
  delete p;
}

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "policy",
    "built in",
    "policy",
    "the Lua recovery policy: runs the script's handlers on the events they watch",
    policy_create,
    policy_start,
    policy_stop,
    policy_destroy,
    nullptr,
    nullptr};

}  // namespace

const ballast_plugin_descriptor* policy_plugin_descriptor() { return &kDescriptor; }

int policy_plugin_load(void* state, const std::string& path, const PolicyOptions& options) {
  return static_cast<PolicyPlugin*>(state)->load(path, options);
}

uint64_t policy_plugin_events(const void* state) {
  return static_cast<const PolicyPlugin*>(state)->events.load(std::memory_order_relaxed);
}

int policy_plugin_reload(void* state, const std::function<bool()>& give_up) {
  auto* p = static_cast<PolicyPlugin*>(state);
  int rc;
  {
    std::unique_lock lock(p->mutex, std::defer_lock);
    while (!lock.try_lock_for(std::chrono::milliseconds(100))) {
      if (give_up()) return p->fail_with(BALLAST_ESTATE, "policy reload abandoned: the host is stopping");
    }
    rc = p->policy->reload();
  }
  if (rc != BALLAST_OK) return p->fail_with(rc, last_error());
  return p->started ? p->subscribe() : BALLAST_OK;
}

}  // namespace ballast
