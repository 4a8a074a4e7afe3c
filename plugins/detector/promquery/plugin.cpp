// promquery: machine metrics from a Prometheus server the site runs, as
// metric.sample batches (one per node and period), for the machine detector
// instead of, or beside, the agents' own samples. Config:
//   url = "http://prometheus:9090", period = 5 (s), lookback = 30 (s), step = 1 (s),
//   node_label = "ballast_node",
//   queries = { { metric = "cpu.busy", query = "100 * (1 - avg by (ballast_node)
//   (rate(node_cpu_seconds_total{mode=\"idle\"}[5s])))" } }
// Each period it asks query_range for [now - lookback, now] and publishes the
// points newer than those it published before, per (node, metric).
#include "query_range.hpp"

#include <ballast/events.h>
#include <ballast/plugin.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Query {
  std::string metric, query;
};

struct State {
  const ballast_host_api* host = nullptr;
  std::string url, node_label = "ballast_node";
  double period = 5, lookback = 30, step = 1;
  std::vector<Query> queries;
  std::map<std::pair<std::string, std::string>, double> last_ts;  // (node, metric) -> newest published
  std::thread thread;
  std::mutex mutex;
  std::condition_variable cv;
  bool quit = false;
};

void log(State* s, int level, const std::string& m) { s->host->log(s->host, level, m.c_str()); }

bool number(State* s, const char* key, double* out) {
  const char* v = nullptr;
  if (s->host->config_get(s->host, key, &v) != BALLAST_OK) return true;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(d > 0)) {
    s->host->set_error(s->host, (std::string("config '") + key + "': expected a positive number, got " + v).c_str());
    return false;
  }
  *out = d;
  return true;
}

void poll_once(State* s) {
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<std::string, std::vector<ballast_metric_sample>> by_node;
  std::vector<std::string> keep;  // owns nothing: names below point into State and series
  std::vector<std::vector<ballast::promquery::Series>> all(s->queries.size());
  for (size_t q = 0; q < s->queries.size(); ++q) {
    std::string error;
    if (!ballast::promquery::query_range(s->url, s->queries[q].query, now - s->lookback, now, s->step, s->node_label,
                                         &all[q], &error)) {
      log(s, BALLAST_LOG_WARN, error);
      s->host->counter_add(s->host, "query_errors", 1);
      continue;
    }
    for (auto& series : all[q]) {
      double& last = s->last_ts[{series.node, s->queries[q].metric}];
      for (auto& [ts, value] : series.points) {
        if (ts <= last) continue;
        last = ts;
        ballast_metric_sample m{};
        m.node = series.node.c_str();
        m.metric = s->queries[q].metric.c_str();
        m.ts_ns = static_cast<int64_t>(ts * 1e9);
        m.value = std::isfinite(value) ? value : 0;
        m.flags = std::isfinite(value) ? 0 : BALLAST_SAMPLE_INVALID;
        by_node[series.node].push_back(m);
      }
    }
  }
  for (auto& [node, samples] : by_node) {
    ballast_metric_batch b{sizeof b, static_cast<uint32_t>(samples.size()), samples.data()};
    ballast_event ev{};
    ev.size = sizeof ev;
    ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
    ev.topic = "metric.sample";
    ev.source.node = node.c_str();
    ev.source.rank = -1;
    ev.payload = &b;
    ev.payload_size = sizeof b;
    s->host->publish(s->host, &ev);
    s->host->counter_add(s->host, "samples", static_cast<int64_t>(samples.size()));
  }
}

int create(const ballast_host_api* host, void** state) {
  auto* s = new State;
  s->host = host;
  const char* v = nullptr;
  if (host->config_get(host, "url", &v) != BALLAST_OK) {
    host->set_error(host, "config 'url': the Prometheus server's URL is required");
    delete s;
    return BALLAST_EINVAL;
  }
  s->url = v;
  if (host->config_get(host, "node_label", &v) == BALLAST_OK) s->node_label = v;
  if (!number(s, "period", &s->period) || !number(s, "lookback", &s->lookback) || !number(s, "step", &s->step)) {
    delete s;
    return BALLAST_EINVAL;
  }
  if (host->config_get(host, "queries", &v) != BALLAST_OK) {
    host->set_error(host, "config 'queries': a list of { metric = ..., query = ... } is required");
    delete s;
    return BALLAST_EINVAL;
  }
  auto j = nlohmann::json::parse(v, nullptr, false);
  if (!j.is_array() || j.empty()) {
    host->set_error(host, "config 'queries': expected a non-empty list");
    delete s;
    return BALLAST_EINVAL;
  }
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& q = j[i];
    if (!q.is_object() || !q.contains("metric") || !q["metric"].is_string() || !q.contains("query") ||
        !q["query"].is_string()) {
      host->set_error(
          host,
          ("config 'queries[" + std::to_string(i + 1) + "]': expected { metric = \"...\", query = \"...\" }").c_str());
      delete s;
      return BALLAST_EINVAL;
    }
    s->queries.push_back({q["metric"].get<std::string>(), q["query"].get<std::string>()});
  }
  *state = s;
  return BALLAST_OK;
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  s->thread = std::thread([s] {
    std::unique_lock lock(s->mutex);
    while (!s->quit) {
      lock.unlock();
      poll_once(s);
      lock.lock();
      s->cv.wait_for(lock, std::chrono::duration<double>(s->period), [s] { return s->quit; });
    }
  });
  return BALLAST_OK;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  {
    std::lock_guard lock(s->mutex);
    s->quit = true;
  }
  s->cv.notify_all();
  if (s->thread.joinable()) s->thread.join();
}

void destroy(void* state) { delete static_cast<State*>(state); }

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "promquery",
    "1",
    "detector",
    "machine metrics from a Prometheus server (query_range) as metric.sample",
    create,
    start,
    stop,
    destroy,
    nullptr,
    nullptr};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
