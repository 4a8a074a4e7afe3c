// ballast-machine: the faulty-machine detector as a plugin. Consumes
// metric.sample batches, publishes fault.suspected and node.silent, and adds
// the `ballast detect` command. The logic is in detector.cpp.
#include "detect_command.hpp"
#include "detector.hpp"
#include "detector_config.hpp"

#include <ballast/ballast.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace {

using ballast::machine::Alert;
using ballast::machine::Detector;
using ballast::machine::DetectorConfig;

struct State {
  const ballast_host_api* host;
  std::mutex mu;  // guards detector: the bus handler and the timer thread share it
  Detector detector;
  uint64_t sub = 0, timer = 0;
  bool subscribed = false, timing = false;
  State(const ballast_host_api* h, DetectorConfig c) : host(h), detector(std::move(c)) {}
};

int on_batch(void* user, const ballast_event* ev) {
  auto* s = static_cast<State*>(user);
  if (ev->schema != BALLAST_SCHEMA_METRIC_BATCH || !ev->payload || ev->payload_size < BALLAST_METRIC_BATCH_V1_SIZE)
    return 0;
  const auto* b = static_cast<const ballast_metric_batch*>(ev->payload);
  if (b->size < BALLAST_METRIC_BATCH_V1_SIZE || (b->count && !b->samples)) return 0;
  uint64_t rejected = 0;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    for (uint32_t i = 0; i < b->count; ++i) {
      const ballast_metric_sample& m = b->samples[i];
      const char* node = m.node ? m.node : ev->source.node;
      if (!node || !m.metric) {
        ++rejected;
        continue;
      }
      if (!s->detector.add(node, m.metric, m.ts_ns ? m.ts_ns : ev->ts_ns, m.value, m.flags)) ++rejected;
    }
  }
  if (rejected) s->host->counter_add(s->host, "samples_not_data", static_cast<int64_t>(rejected));
  return 0;
}

void publish(State* s, const Alert& a) {
  ballast_fault_report r{};
  r.size = sizeof r;
  r.stage = BALLAST_FAULT_SUSPECTED;
  r.subject = a.node.c_str();
  r.rank = -1;
  r.kind = a.kind.c_str();
  r.metric = a.metric.empty() ? nullptr : a.metric.c_str();
  r.score = a.score;
  double thr = s->detector.config().threshold;
  r.confidence = a.kind == "silent" ? 1.0 : (a.score >= 2 * thr ? 1.0 : a.score / (2 * thr));
  r.since_ns = a.since_ns;
  r.detected_ns = a.ts_ns;
  r.evidence = a.evidence.c_str();
  r.detector = "machine";
  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_FAULT_REPORT;
  ev.topic = a.kind == "silent" ? "node.silent" : "fault.suspected";
  ev.ts_ns = a.ts_ns;
  ev.source = {a.node.c_str(), -1, nullptr};
  ev.payload = &r;
  ev.payload_size = sizeof r;
  s->host->publish(s->host, &ev);
  s->host->counter_add(s->host, a.kind == "silent" ? "silent" : "suspected", 1);
}

void on_tick(void* user) {
  auto* s = static_cast<State*>(user);
  std::vector<Alert> alerts;
  uint64_t held = 0;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    uint64_t before = s->detector.counters().held;
    // Samples reach the bus a little after they are taken: the round ends
    // `lateness` before now, so a machine's sample of it is not judged late.
    const auto& c = s->detector.config();
    double lateness = std::min(c.lateness_s, c.period_s / 2);
    s->detector.evaluate(s->host->now_ns(s->host) - static_cast<int64_t>(lateness * 1e9), &alerts);
    held = s->detector.counters().held - before;
  }
  // Outliers on other machines while one machine is the job's culprit.
  if (held) s->host->counter_add(s->host, "outliers_held", static_cast<int64_t>(held));
  for (const Alert& a : alerts) publish(s, a);
}

int create(const ballast_host_api* host, void** state) {
  DetectorConfig config;
  std::string error;
  auto get = [host](const std::string& key, std::string* value) {
    const char* v = nullptr;
    if (host->config_get(host, key.c_str(), &v) != BALLAST_OK || !v) return false;
    *value = v;
    return true;
  };
  if (!ballast::machine::apply_config(get, &config, &error)) {
    host->set_error(host, error.c_str());
    return BALLAST_EINVAL;
  }
  auto* s = new (std::nothrow) State(host, std::move(config));
  if (!s) return BALLAST_ENOMEM;
  *state = s;
  return BALLAST_OK;
}

int start(void* state) {
  auto* s = static_cast<State*>(state);
  ballast_subscribe_options opt{sizeof opt, BALLAST_DELIVER_QUEUED, 0, 0};
  int rc = s->host->subscribe(s->host, "metric.sample", &opt, on_batch, s, &s->sub);
  if (rc != BALLAST_OK) return rc;
  s->subscribed = true;
  auto period = static_cast<uint64_t>(s->detector.config().period_s * 1e9);
  rc = s->host->timer_start(s->host, period, on_tick, s, &s->timer);
  if (rc != BALLAST_OK) return rc;
  s->timing = true;
  return BALLAST_OK;
}

void stop(void* state) {
  auto* s = static_cast<State*>(state);
  if (s->timing) s->host->timer_cancel(s->host, s->timer);
  if (s->subscribed) s->host->unsubscribe(s->host, s->sub);
  s->timing = s->subscribed = false;
}

void destroy(void* state) { delete static_cast<State*>(state); }

int run_detect(void*, int argc, char** argv) { return ballast::machine::detect_main(argc, argv); }

const ballast_command kCommands[] = {
    {"detect", "replay machine metrics (CSV) through the faulty-machine detector", run_detect}};
const ballast_command_table kCommandTable = {sizeof(ballast_command_table), 1, kCommands};

const void* get_interface(void*, const char* name, uint32_t version) {
  if (std::string(name) == BALLAST_COMMAND_INTERFACE && version == BALLAST_COMMAND_VERSION) return &kCommandTable;
  return nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "machine",
    "0.1.0",
    "detector",
    "faulty-machine detector: peer-relative outliers in machine metrics (after Minder)",
    create,
    start,
    stop,
    destroy,
    get_interface,
    kInterfaces};

}  // namespace

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t) { return &kDescriptor; }
