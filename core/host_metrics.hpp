// The host's own metrics, for Prometheus (text exposition format 0.0.4) at
// http://LISTEN/metrics (metrics_http.hpp): every counter of the host (bus,
// journal, each plugin's, the policy's, the cluster role's), and tallies of the events an
// operator alerts on: fault reports by detector and kind, the recovery
// actions the policy decided, the outcomes the executor reported, policy
// errors. docs/config.md lists the families.
#pragma once

#include <ballast/event.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ballast {

class Host;
class MetricsHttp;

// Labelled counts of events, bounded: past kMaxSeries label sets a family
// counts the rest under one series whose labels all read "other".
class EventTally {
 public:
  static constexpr size_t kMaxSeries = 1000;
  void count(const ballast_event& event);
  // The tallied families, in the exposition format.
  std::string render() const;

 private:
  struct Family {
    std::map<std::vector<std::string>, uint64_t> series;
  };
  void add(const char* family, std::vector<std::string> labels);
  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

// The host's counters (Host::counters()) in the exposition format.
std::string render_counters(const nlohmann::json& counters, const std::string& node, size_t plugins);

class HostMetrics {
 public:
  // Subscribes to the tallied topics and serves at `listen`.
  static int create(Host& host, const std::string& listen, std::unique_ptr<HostMetrics>* out);
  ~HostMetrics();
  const std::string& url() const;
  std::string render() const;

 private:
  HostMetrics() = default;
  static int on_event(void* user, const ballast_event* event);
  Host* host_ = nullptr;
  EventTally tally_;
  std::vector<uint64_t> subscriptions_;
  std::unique_ptr<MetricsHttp> http_;
};

}  // namespace ballast
