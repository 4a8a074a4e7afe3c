// The straggler plugin: subscribes to step.timing, publishes
// straggler.report every `report_every` completed steps, and offers the
// `ballast whatif` command.
#include <ballast/command.h>
#include <ballast/events.h>
#include <ballast/plugin.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <mutex>
#include <new>
#include <string>

#include "online.hpp"
#include "whatif_command.hpp"

namespace ballast::straggler {
namespace {

struct State {
  const ballast_host_api* host = nullptr;
  std::mutex mu;  // guards detector: queued handlers may run on several dispatcher threads
  OnlineDetector detector{OnlineConfig{}};
  uint64_t subscription = 0;
  bool subscribed = false;
};

void log(const ballast_host_api* host, int level, const std::string& msg) {
  if (host && host->log) host->log(host, level, msg.c_str());
}

// Reads an optional numeric configuration key; false (with the host's error set) on garbage.
template <class T>
bool config_number(const ballast_host_api* host, const char* key, T& value) {
  const char* text = nullptr;
  if (!host->config_get || host->config_get(host, key, &text) != BALLAST_OK || !text) return true;
  std::string_view s(text);
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !(v > T{})) {
    std::string msg = std::string("config ") + key + ": '" + text + "' is not a positive number";
    host->set_error(host, msg.c_str());
    return false;
  }
  value = v;
  return true;
}

void publish_report(State& st, const WhatIfResult& r) {
  // Culprits worst first: every op type, stage and DP rank, and the ranks M_W fixes.
  struct Entry {
    const char* dimension;
    std::string name;
    double slowdown;
  };
  std::vector<Entry> entries;
  for (size_t i = 0; i < r.mw_ranks.size(); ++i) entries.push_back({"rank", r.by_rank[i].name, r.by_rank[i].slowdown});
  for (const auto& a : r.by_stage) entries.push_back({"stage", a.name, a.slowdown});
  for (const auto& a : r.by_dp_rank) entries.push_back({"dp_rank", a.name, a.slowdown});
  for (const auto& a : r.by_optype) entries.push_back({"optype", a.name, a.slowdown});
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.slowdown > b.slowdown; });
  std::vector<ballast_straggler_culprit> culprits;
  for (const Entry& e : entries) culprits.push_back({e.dimension, e.name.c_str(), e.slowdown});

  ballast_straggler_report report{};
  report.size = sizeof report;
  report.count = static_cast<uint32_t>(culprits.size());
  report.slowdown = r.slowdown;
  report.launch_slowdown = r.launch_slowdown;
  report.kind = r.kind.c_str();
  report.culprits = culprits.data();
  report.first_step = r.steps.front();
  report.last_step = r.steps.back();

  ballast_event ev{};
  ev.size = sizeof ev;
  ev.schema = BALLAST_SCHEMA_STRAGGLER_REPORT;
  ev.topic = "straggler.report";
  ev.source.rank = -1;
  ev.payload = &report;
  ev.payload_size = sizeof report;
  int rc = st.host->publish(st.host, &ev);
  if (rc != BALLAST_OK)
    log(st.host, BALLAST_LOG_WARN, std::string("publishing straggler.report failed: ") + st.host->last_error(st.host));
}

int on_step_timing(void* user, const ballast_event* ev) {
  auto& st = *static_cast<State*>(user);
  if (ev->schema != BALLAST_SCHEMA_OP_TIMING_BATCH || !ev->payload ||
      ev->payload_size < BALLAST_OP_TIMING_BATCH_V1_SIZE)
    return BALLAST_EINVAL;
  const auto* batch = static_cast<const ballast_op_timing_batch*>(ev->payload);
  if (batch->size < BALLAST_OP_TIMING_BATCH_V1_SIZE || (batch->count && !batch->ops)) return BALLAST_EINVAL;
  try {
    std::optional<WhatIfResult> result;
    std::string error;
    uint64_t rejected = 0, step_rows = 0;
    bool first_step_rows = false;
    {
      std::lock_guard lock(st.mu);
      uint64_t before = st.detector.counters().rejected, steps_before = st.detector.counters().step_rows;
      st.detector.add(batch->ops, batch->count);
      rejected = st.detector.counters().rejected - before;
      step_rows = st.detector.counters().step_rows - steps_before;
      first_step_rows = steps_before == 0 && step_rows > 0;
      uint64_t failures = st.detector.counters().failures;
      result = st.detector.poll();
      if (st.detector.counters().failures != failures) error = st.detector.last_error();
    }
    if (rejected && st.host->counter_add) st.host->counter_add(st.host, "rejected_ops", static_cast<int64_t>(rejected));
    if (step_rows && st.host->counter_add) st.host->counter_add(st.host, "step_rows", static_cast<int64_t>(step_rows));
    if (first_step_rows)
      log(st.host, BALLAST_LOG_WARN,
          "step.timing carries whole-step rows (optype \"step\"): they say how long a step took, not which rank "
          "held it up, and are not analysed; time the step's phases (forward, backward, all-reduce, optimizer) "
          "for an attribution (plugins/detector/straggler/README.md)");
    if (!error.empty()) log(st.host, BALLAST_LOG_WARN, "window not analysed: " + error);
    if (result) {
      if (st.host->counter_add) st.host->counter_add(st.host, "reports", 1);
      publish_report(st, *result);
    }
    return BALLAST_OK;
  } catch (const std::exception& e) {  // out of memory: never across the C boundary
    log(st.host, BALLAST_LOG_ERROR, std::string("step.timing handler: ") + e.what());
    return BALLAST_EINTERNAL;
  }
}

int create(const ballast_host_api* host, void** state) {
  OnlineConfig config;
  if (!config_number(host, "window_steps", config.window_steps) ||
      !config_number(host, "report_every", config.report_every) ||
      !config_number(host, "min_slowdown", config.min_slowdown))
    return BALLAST_EINVAL;
  auto* st = new (std::nothrow) State;
  if (!st) return BALLAST_ENOMEM;
  st->host = host;
  st->detector = OnlineDetector(config);
  *state = st;
  return BALLAST_OK;
}

int start(void* state) {
  auto& st = *static_cast<State*>(state);
  ballast_subscribe_options options{};
  options.size = sizeof options;
  options.delivery = BALLAST_DELIVER_QUEUED;  // an analysis takes milliseconds: not in the publisher's thread
  int rc = st.host->subscribe(st.host, "step.timing", &options, &on_step_timing, &st, &st.subscription);
  if (rc != BALLAST_OK) return rc;
  st.subscribed = true;
  return BALLAST_OK;
}

void stop(void* state) {
  auto& st = *static_cast<State*>(state);
  if (st.subscribed) st.host->unsubscribe(st.host, st.subscription);
  st.subscribed = false;
}

void destroy(void* state) { delete static_cast<State*>(state); }

int run_command(void*, int argc, char** argv) { return run_whatif(argc, argv, stdout, stderr); }

const ballast_command kCommands[] = {
    {"whatif", "straggler what-if analysis of a job trace (slowdown, culprits, kind)", &run_command},
};
const ballast_command_table kCommandTable = {sizeof(ballast_command_table), 1, kCommands};

const void* get_interface(void*, const char* name, uint32_t version) {
  if (name && std::string_view(name) == BALLAST_COMMAND_INTERFACE && version == BALLAST_COMMAND_VERSION)
    return &kCommandTable;
  return nullptr;
}

const ballast_interface_info kInterfaces[] = {{BALLAST_COMMAND_INTERFACE, BALLAST_COMMAND_VERSION}, {nullptr, 0}};

const ballast_plugin_descriptor kDescriptor = {
    sizeof(ballast_plugin_descriptor),
    BALLAST_ABI_MAJOR,
    BALLAST_ABI_MINOR,
    0,
    "straggler",
    "0.1.0",
    "detector",
    "straggler what-if analysis: slowdown against a run with no stragglers, culprits, kind",
    &create,
    &start,
    &stop,
    &destroy,
    &get_interface,
    kInterfaces,
};

}  // namespace
}  // namespace ballast::straggler

extern "C" BALLAST_EXPORT const ballast_plugin_descriptor* ballast_plugin_v1(uint32_t host_minor) {
  (void)host_minor;
  return &ballast::straggler::kDescriptor;
}
