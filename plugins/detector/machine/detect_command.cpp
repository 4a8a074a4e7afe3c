#include "detect_command.hpp"

#include "detector_config.hpp"
#include "metric_names.hpp"

#include "command_line.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <numeric>
#include <sstream>
#include <unordered_map>

namespace ballast::machine {

std::vector<Alert> replay(const MetricsTable& t, Detector* d) {
  std::vector<Alert> alerts;
  if (t.rows.empty()) return alerts;
  std::vector<uint32_t> order(t.rows.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return t.rows[a].ts_ns < t.rows[b].ts_ns; });
  const int64_t period = std::max<int64_t>(1, std::llround(d->config().period_s * 1e9));
  const int64_t t0 = t.rows[order[0]].ts_ns - period / 2;
  // After this many empty periods nothing changes any more (every window has
  // emptied and every machine is silent): a gap of years is not walked.
  const double settle = (d->config().window_s + d->config().silent_after_s) / d->config().period_s + 3;
  const int64_t max_empty = static_cast<int64_t>(std::min(settle, 1e6));
  int64_t bucket = 0, last_ts = t.rows[order[0]].ts_ns;
  for (uint32_t i : order) {
    const MetricRow& r = t.rows[i];
    int64_t b = (r.ts_ns - t0) / period;
    if (b > bucket) {
      d->evaluate(last_ts, &alerts);
      for (int64_t e = bucket + 1; e < b && e <= bucket + max_empty; ++e) d->evaluate(t0 + (e + 1) * period, &alerts);
      bucket = b;
    }
    d->add(t.nodes[r.node], t.metrics[r.metric], r.ts_ns, r.value, 0);
    last_ts = r.ts_ns;
  }
  d->evaluate(last_ts, &alerts);
  return alerts;
}

NameCounts map_exporter_names(MetricsTable* t) {
  NameCounts counts;
  detector_names::Normaliser norm;
  std::vector<MetricRow> kept;
  std::vector<uint8_t> mapped(t->metrics.size(), 0);
  for (const MetricRow& r : t->rows) {
    if (norm.add(t->nodes[r.node], t->metrics[r.metric], r.ts_ns, r.value)) {
      mapped[r.metric] = 1;
      continue;
    }
    kept.push_back(r);
  }
  for (uint8_t m : mapped) counts.mapped_names += m;
  std::vector<detector_names::Normaliser::Out> out;
  norm.flush(&out);
  std::unordered_map<std::string, uint32_t> node_ids, metric_ids;
  for (uint32_t i = 0; i < t->nodes.size(); ++i) node_ids.emplace(t->nodes[i], i);
  for (uint32_t i = 0; i < t->metrics.size(); ++i) metric_ids.emplace(t->metrics[i], i);
  for (const auto& o : out) {
    auto m = metric_ids.find(o.metric);
    if (m == metric_ids.end()) {
      m = metric_ids.emplace(o.metric, static_cast<uint32_t>(t->metrics.size())).first;
      t->metrics.push_back(o.metric);
    }
    kept.push_back(MetricRow{o.ts_ns, node_ids.at(o.node), m->second, o.value});
  }
  t->rows = std::move(kept);
  return counts;
}

namespace {

const char* kDescription =
    "Replays a CSV with columns ts,node,metric,value (ts in seconds) through the\n"
    "faulty-machine detector and prints one line per alert (--json: one JSON object\n"
    "{\"node\",\"metric\",\"ts\",\"score\",\"kind\",\"since\"} per line, then one with\n"
    "\"kind\":\"summary\": series checked and ignored). Exporter names (DCGM exporter,\n"
    "node-exporter, plain gpu_util, net_tx_gbps, ...) are mapped to the detector's\n"
    "(plugins/detector/common/README.md); a labelled series is one quoted CSV field.";

const char* kConfigHelp =
    "a Lua table with keys period, lateness, window, threshold, continuity, silent_after, rel_floor, abs_floor, "
    "spread_memory, warmup, min_nodes, max_outlier_fraction, max_metrics, metrics, min_deviation, rel_floors, "
    "hold_peers (plugins/detector/machine/README.md)";

}  // namespace

static int detect_run(int argc, char** argv) {
  CLI::App app(kDescription, "ballast detect");
  std::string metrics, config_path;
  bool json = false;
  app.add_option("--metrics", metrics, "the metrics CSV, plain or gzip")->required();
  app.add_option("--config", config_path, kConfigHelp);
  app.add_flag("--json", json, "JSON lines instead of text");
  if (int rc = util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  DetectorConfig config;
  std::string error;
  if (!config_path.empty() && !load_config_file(config_path, &config, &error)) {
    std::fprintf(stderr, "ballast detect: %s\n", error.c_str());
    return 1;
  }
  MetricsTable table;
  if (!read_metrics_csv(metrics, &table, &error)) {
    std::fprintf(stderr, "ballast detect: %s\n", error.c_str());
    return 1;
  }
  NameCounts names = map_exporter_names(&table);
  Detector detector(config);
  std::vector<Alert> alerts = replay(table, &detector);
  MetricCounts mc = detector.metric_counts();
  std::string warning;
  if (mc.checked_series == 0 && !table.rows.empty()) {
    warning = "no series matched the metric list: nothing was checked (ignored e.g.";
    for (const auto& n : mc.ignored_names) warning += " '" + n + "'";
    warning += "; see the metrics key and plugins/detector/common/README.md)";
  }
  for (const Alert& a : alerts) {
    if (json) {
      nlohmann::json j = {{"node", a.node},
                          {"metric", a.metric.empty() ? nlohmann::json() : nlohmann::json(a.metric)},
                          {"ts", static_cast<double>(a.ts_ns) / 1e9},
                          {"score", a.score},
                          {"kind", a.kind},
                          {"since", static_cast<double>(a.since_ns) / 1e9}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (a.kind == "silent") {
      std::printf("%.3f  %-16s silent for %.1f s (last sample at %.3f)\n", static_cast<double>(a.ts_ns) / 1e9,
                  a.node.c_str(), a.score, static_cast<double>(a.since_ns) / 1e9);
    } else {
      std::printf("%.3f  %-16s outlier on %s, score %.1f, since %.3f\n", static_cast<double>(a.ts_ns) / 1e9,
                  a.node.c_str(), a.metric.c_str(), a.score, static_cast<double>(a.since_ns) / 1e9);
    }
  }
  const DetectorCounters& c = detector.counters();
  if (json) {
    nlohmann::json j = {{"kind", "summary"},
                        {"alerts", alerts.size()},
                        {"machines", table.nodes.size()},
                        {"samples", table.rows.size()},
                        {"samples_used", c.accepted},
                        {"metrics_checked", mc.checked_metrics},
                        {"metrics_ignored", mc.ignored_metrics},
                        {"series_checked", mc.checked_series},
                        {"series_ignored", mc.ignored_series},
                        {"exporter_names_mapped", names.mapped_names}};
    if (!warning.empty()) j["warning"] = warning;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf(
        "%zu alert(s); %zu machines, %zu samples (%llu used); %zu series checked "
        "(%zu metrics), %zu series ignored by the metric list (%zu metrics)",
        alerts.size(), table.nodes.size(), table.rows.size(), static_cast<unsigned long long>(c.accepted),
        mc.checked_series, mc.checked_metrics, mc.ignored_series, mc.ignored_metrics);
    if (names.mapped_names) std::printf("; %zu exporter names mapped", names.mapped_names);
    std::printf("\n");
  }
  if (!warning.empty()) std::fprintf(stderr, "ballast detect: warning: %s\n", warning.c_str());
  return 0;
}

int detect_main(int argc, char** argv) {
  // Nothing a file holds may end the process with an uncaught exception.
  try {
    return detect_run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ballast detect: out of memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ballast detect: internal error: %s\n", e.what());
  }
  return 1;
}

}  // namespace ballast::machine
