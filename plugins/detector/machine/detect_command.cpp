#include "detect_command.hpp"

#include "config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

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
  int64_t bucket = 0, last_ts = t.rows[order[0]].ts_ns;
  for (uint32_t i : order) {
    const MetricRow& r = t.rows[i];
    int64_t b = (r.ts_ns - t0) / period;
    if (b > bucket) {
      d->evaluate(last_ts, &alerts);
      for (int64_t e = bucket + 1; e < b; ++e) d->evaluate(t0 + (e + 1) * period, &alerts);
      bucket = b;
    }
    d->add(t.nodes[r.node], t.metrics[r.metric], r.ts_ns, r.value, 0);
    last_ts = r.ts_ns;
  }
  d->evaluate(last_ts, &alerts);
  return alerts;
}

namespace {

const char* kUsage =
    "usage: ballast detect --metrics FILE.csv[.gz] [--config FILE.lua] [--json]\n"
    "Replays a CSV with columns ts,node,metric,value (ts in seconds) through the\n"
    "faulty-machine detector and prints one line per alert (--json: one JSON object\n"
    "{\"node\",\"metric\",\"ts\",\"score\",\"kind\",\"since\"} per line).\n"
    "--config: a Lua table with keys period, window, threshold, continuity,\n"
    "silent_after, rel_floor, abs_floor, spread_memory, warmup, min_nodes,\n"
    "max_outlier_fraction, max_metrics, metrics, min_deviation, hold_peers\n"
    "(see plugins/detector/machine/README.md).\n";

bool load_config(const std::string& path, DetectorConfig* config, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  ConfigText text;
  if (!parse_lua_table(ss.str(), path, &text, error)) return false;
  // Nested `min_deviation = { ["pattern"] = n }` arrives as dotted keys.
  nlohmann::json deviations = nlohmann::json::object();
  for (auto it = text.begin(); it != text.end();) {
    if (it->first.rfind("min_deviation.", 0) == 0) {
      deviations[it->first.substr(14)] = it->second;
      it = text.erase(it);
    } else {
      ++it;
    }
  }
  if (!deviations.empty()) text["min_deviation"] = deviations.dump();
  const auto& known = config_keys();
  for (const auto& [key, value] : text) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      *error = path + ": unknown key '" + key + "'";
      return false;
    }
  }
  auto get = [&](const std::string& k, std::string* v) {
    auto it = text.find(k);
    if (it == text.end()) return false;
    *v = it->second;
    return true;
  };
  if (!apply_config(get, config, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return true;
}

}  // namespace

int detect_main(int argc, char** argv) {
  std::string metrics, config_path;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if ((a == "--metrics" || a == "--config") && i + 1 < argc) {
      (a == "--metrics" ? metrics : config_path) = argv[++i];
    } else if (a.rfind("--metrics=", 0) == 0) {
      metrics = a.substr(10);
    } else if (a.rfind("--config=", 0) == 0) {
      config_path = a.substr(9);
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "%s: unexpected argument '%s'\n%s", argv[0], a.c_str(), kUsage);
      return 2;
    }
  }
  if (metrics.empty()) {
    std::fprintf(stderr, "%s: --metrics FILE is required\n%s", argv[0], kUsage);
    return 2;
  }
  DetectorConfig config;
  std::string error;
  if (!config_path.empty() && !load_config(config_path, &config, &error)) {
    std::fprintf(stderr, "ballast detect: %s\n", error.c_str());
    return 1;
  }
  MetricsTable table;
  if (!read_metrics_csv(metrics, &table, &error)) {
    std::fprintf(stderr, "ballast detect: %s\n", error.c_str());
    return 1;
  }
  Detector detector(config);
  std::vector<Alert> alerts = replay(table, &detector);
  for (const Alert& a : alerts) {
    if (json) {
      nlohmann::json j = {{"node", a.node},
                          {"metric", a.metric.empty() ? nlohmann::json() : nlohmann::json(a.metric)},
                          {"ts", static_cast<double>(a.ts_ns) / 1e9},
                          {"score", a.score},
                          {"kind", a.kind},
                          {"since", static_cast<double>(a.since_ns) / 1e9}};
      std::printf("%s\n", j.dump().c_str());
    } else if (a.kind == "silent") {
      std::printf("%.3f  %-16s silent for %.1f s (last sample at %.3f)\n",
                  static_cast<double>(a.ts_ns) / 1e9, a.node.c_str(), a.score,
                  static_cast<double>(a.since_ns) / 1e9);
    } else {
      std::printf("%.3f  %-16s outlier on %s, score %.1f, since %.3f\n",
                  static_cast<double>(a.ts_ns) / 1e9, a.node.c_str(), a.metric.c_str(), a.score,
                  static_cast<double>(a.since_ns) / 1e9);
    }
  }
  if (!json) {
    const DetectorCounters& c = detector.counters();
    std::printf("%zu alert(s); %zu machines, %zu metrics, %zu samples (%llu used, %llu ignored by "
                "the metric list)\n",
                alerts.size(), table.nodes.size(), table.metrics.size(), table.rows.size(),
                static_cast<unsigned long long>(c.accepted),
                static_cast<unsigned long long>(c.ignored));
  }
  return 0;
}

}  // namespace ballast::machine
