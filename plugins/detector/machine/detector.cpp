#include "detector.hpp"

#include <ballast/events.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ballast::machine {

std::vector<std::string> default_metrics() {
  return {
      // Hardware error counters: a non-zero count on one machine is the most
      // specific evidence there is.
      "gpu*.xid", "gpu*.ecc.uncorrected",
      // Accelerator duty cycle and power: they follow the job's progress
      // directly (Minder's most telling metrics).
      "gpu*.util", "gpu*.power", "gpu*.sm_clock", "gpu*.nvlink.*", "gpu*.pcie.*",
      // The job's CPU: throttling and stalls first, then busy time and
      // wake-ups (a stopped process stops waking up while its peers poll).
      "cgroup.cpu.throttled", "cgroup.cpu.pressure", "proc.cpu", "cgroup.cpu.usage",
      "proc.ctxt_voluntary", "cpu.user", "cpu.system", "cpu.iowait", "cpu.steal",
      // Network: retransmits, drops and errors, then throughput.
      "net.tcp.retrans", "net.*_drops", "net.*_errors", "net.*.rx_bytes", "net.*.tx_bytes",
      // Disk and memory last: healthy machines legitimately differ there
      // (a checkpoint writer, a cache), so they decide only when nothing else does.
      "cgroup.io.pressure", "proc.write_bytes", "proc.read_bytes", "cgroup.io.*", "disk.*",
      "cgroup.memory.pressure", "proc.rss_bytes", "cgroup.memory.current", "mem.*"};
}

std::vector<std::pair<std::string, double>> default_min_deviation() {
  return {{"gpu*.xid", 1},           {"gpu*.ecc.*", 1},
          {"net.tcp.retrans", 20},   {"net.*_drops", 20},           {"net.*_errors", 20},
          {"cgroup.cpu.throttled", 0.01}, {"cgroup.*.pressure", 0.05},
          {"proc.cpu", 0.05},        {"cgroup.cpu.*", 0.05},        {"proc.ctxt_*", 50},
          {"proc.write_bytes", 1e6}, {"proc.read_bytes", 1e6},      {"cgroup.io.*_bytes", 1e6},
          {"disk.*_bytes", 1e6},     {"cgroup.io.*_ops", 50},       {"disk.*_ops", 50},
          {"net.*_bytes", 1e6},      {"net.*_packets", 1000}};
}

bool glob_match(std::string_view p, std::string_view t) {
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (pi < p.size() && p[pi] == t[ti]) {
      ++pi;
      ++ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

namespace {

// Median of v (reordered). v must not be empty.
double median_of(std::vector<double>& v) {
  size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double hi = v[mid];
  if (n % 2) return hi;
  double lo = *std::max_element(v.begin(), v.begin() + mid);
  return lo + (hi - lo) / 2;
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// Finite stand-in for JSON (a garbage machine may produce 1e308 - (-1e308)).
double finite(double x) { return std::isfinite(x) ? x : (x > 0 ? 1e300 : -1e300); }

}  // namespace

Detector::Detector(DetectorConfig config) : config_(std::move(config)) {
  if (config_.metrics.empty()) config_.metrics = default_metrics();
  for (auto& d : default_min_deviation()) config_.min_deviation.push_back(std::move(d));
  if (config_.continuity < 1) config_.continuity = 1;
  if (config_.min_nodes < 3) config_.min_nodes = 3;
}

uint32_t Detector::node_id(std::string_view name) {
  auto it = node_index_.find(std::string(name));
  if (it != node_index_.end()) return it->second;
  uint32_t id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back(Node{std::string(name)});
  node_index_.emplace(std::string(name), id);
  return id;
}

int Detector::metric_id(std::string_view name) {
  auto it = metric_index_.find(std::string(name));
  if (it != metric_index_.end()) return static_cast<int>(it->second);
  if (metrics_.size() >= config_.max_metrics) return -1;
  int rank = -1;
  for (size_t i = 0; i < config_.metrics.size(); ++i) {
    if (glob_match(config_.metrics[i], name)) {
      rank = static_cast<int>(i);
      break;
    }
  }
  double floor = config_.abs_floor;
  for (const auto& [pattern, dev] : config_.min_deviation) {
    if (glob_match(pattern, name)) {
      floor = std::max(floor, dev / std::max(config_.threshold, 1e-9));
      break;
    }
  }
  uint32_t id = static_cast<uint32_t>(metrics_.size());
  metrics_.push_back(Metric{std::string(name), rank, floor, 0, 0, 0, 0, {}});
  metric_index_.emplace(std::string(name), id);
  if (rank >= 0) order_dirty_ = true;
  return static_cast<int>(id);
}

void Detector::sort_order() {
  order_.clear();
  for (uint32_t i = 0; i < metrics_.size(); ++i)
    if (metrics_[i].rank >= 0) order_.push_back(i);
  std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
    if (metrics_[a].rank != metrics_[b].rank) return metrics_[a].rank < metrics_[b].rank;
    return metrics_[a].name < metrics_[b].name;
  });
  order_dirty_ = false;
}

bool Detector::add(std::string_view node, std::string_view metric, int64_t ts_ns, double value,
                   uint32_t flags) {
  // Any sample, even a flagged one, shows the machine is alive.
  Node& n = nodes_[node_id(node)];
  if (ts_ns > n.last_seen_ns) n.last_seen_ns = ts_ns;
  n.silent = false;
  if (flags & (BALLAST_SAMPLE_INVALID | BALLAST_SAMPLE_COUNTER_RESET)) {
    ++counters_.flagged;
    return false;
  }
  if (!std::isfinite(value)) {
    ++counters_.nonfinite;
    return false;
  }
  int m = metric_id(metric);
  if (m < 0) {
    ++counters_.over_cap;
    return false;
  }
  Metric& met = metrics_[static_cast<size_t>(m)];
  if (met.rank < 0) {
    ++counters_.ignored;
    return false;
  }
  uint32_t id = node_index_.find(std::string(node))->second;
  if (met.series.size() <= id) met.series.resize(nodes_.size());
  auto& pts = met.series[id].points;
  // Keep time order; a late sample (older than the newest) is dropped.
  if (!pts.empty() && ts_ns < pts.back().ts_ns) {
    ++counters_.flagged;
    return false;
  }
  pts.push_back(Point{ts_ns, value});
  int64_t horizon = ts_ns - static_cast<int64_t>(config_.window_s * 1e9);
  size_t old = 0;
  while (old < pts.size() && pts[old].ts_ns <= horizon) ++old;
  if (old) pts.erase(pts.begin(), pts.begin() + static_cast<long>(old));
  ++counters_.accepted;
  return true;
}

void Detector::hold_culprit_peers() {
  // The culprit's state as it was before this evaluation: it holds its peers
  // until it has been re-armed (normal for `continuity` evaluations).
  if (culprit_ >= 0 && !nodes_[static_cast<size_t>(culprit_)].alerted) culprit_ = -1;
  // Without a culprit, the new candidate with the highest score may alert.
  int64_t keep = -1;
  if (culprit_ < 0) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (candidate_[i] < 0 || nodes_[i].alerted) continue;
      if (keep < 0 || cand_score_[i] > cand_score_[static_cast<size_t>(keep)]) keep = static_cast<int64_t>(i);
    }
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (candidate_[i] < 0 || nodes_[i].alerted || static_cast<int64_t>(i) == keep) continue;
    candidate_[i] = -1;  // its streak goes on: it alerts once no culprit holds it
    ++counters_.held;
  }
}

void Detector::evaluate(int64_t now_ns, std::vector<Alert>* out) {
  if (order_dirty_) sort_order();
  size_t nn = nodes_.size();
  candidate_.assign(nn, -1);
  cand_score_.assign(nn, 0);
  cand_z_.assign(nn, 0);
  cand_value_.assign(nn, 0);
  cand_median_.assign(nn, 0);
  cand_mad_.assign(nn, 0);
  cand_since_.assign(nn, 0);
  outlier_now_.assign(nn, 0);
  int64_t horizon = now_ns - static_cast<int64_t>(config_.window_s * 1e9);

  for (uint32_t mi : order_) {
    Metric& met = metrics_[mi];
    values_.clear();
    value_node_.clear();
    for (uint32_t i = 0; i < met.series.size(); ++i) {
      Series& s = met.series[i];
      ++work_;
      size_t old = 0;
      while (old < s.points.size() && s.points[old].ts_ns <= horizon) ++old;
      if (old) s.points.erase(s.points.begin(), s.points.begin() + static_cast<long>(old));
      window_.clear();
      for (const Point& p : s.points)
        if (p.ts_ns <= now_ns) window_.push_back(p.value);
      if (window_.empty()) {
        s.streak = 0;
        continue;
      }
      values_.push_back(median_of(window_));
      value_node_.push_back(i);
    }
    size_t n = values_.size();
    if (n < static_cast<size_t>(config_.min_nodes)) {
      for (uint32_t i : value_node_) met.series[i].streak = 0;
      continue;
    }
    scratch_.assign(values_.begin(), values_.end());
    double med = median_of(scratch_);
    for (size_t k = 0; k < n; ++k) scratch_[k] = std::fabs(values_[k] - med);
    double mad = median_of(scratch_);
    double robust = 1.4826 * mad, level = std::fabs(med);
    ++met.evaluations;
    if (level > config_.abs_floor) {  // a metric that is usually 0 has no relative spread
      ++met.usual_updates;
      met.usual += (robust / level - met.usual) / std::min<double>(met.usual_updates, config_.spread_memory);
    }
    met.usual_abs += (robust - met.usual_abs) / std::min<double>(met.evaluations, config_.spread_memory);
    bool warm = met.evaluations > config_.warmup;
    double scale =
        std::max({robust, met.usual * level, met.usual_abs, config_.rel_floor * level, met.floor});
    size_t outliers = 0;
    for (size_t k = 0; k < n; ++k)
      if (std::fabs(values_[k] - med) > config_.threshold * scale) ++outliers;
    // Many machines apart at once is a split of the job (or a job-wide change
    // caught half-way), not one faulty machine.
    bool split = static_cast<double>(outliers) > config_.max_outlier_fraction * static_cast<double>(n);
    for (size_t k = 0; k < n; ++k) {
      uint32_t i = value_node_[k];
      Series& s = met.series[i];
      double z = finite((values_[k] - med) / scale);
      if (!warm || split || std::fabs(z) <= config_.threshold) {
        s.streak = 0;
        continue;
      }
      if (s.streak == 0) s.since_ns = now_ns;
      ++s.streak;
      outlier_now_[i] = 1;
      if (s.streak >= config_.continuity && candidate_[i] < 0) {
        candidate_[i] = static_cast<int>(mi);
        cand_score_[i] = std::fabs(z);
        cand_z_[i] = z;
        cand_value_[i] = values_[k];
        cand_median_[i] = med;
        cand_mad_[i] = mad;
        cand_since_[i] = s.since_ns;
      }
    }
  }

  if (config_.hold_peers) hold_culprit_peers();

  int64_t silent_ns = static_cast<int64_t>(config_.silent_after_s * 1e9);
  for (size_t i = 0; i < nn; ++i) {
    Node& node = nodes_[i];
    if (!node.silent && now_ns - node.last_seen_ns > silent_ns) {
      node.silent = true;
      Alert a;
      a.kind = "silent";
      a.node = node.name;
      a.score = static_cast<double>(now_ns - node.last_seen_ns) / 1e9;
      a.ts_ns = now_ns;
      a.since_ns = node.last_seen_ns;
      char buf[128];
      std::snprintf(buf, sizeof buf, "{\"last_seen_s\":%.3f,\"silent_after_s\":%g}",
                    static_cast<double>(node.last_seen_ns) / 1e9, config_.silent_after_s);
      a.evidence = buf;
      out->push_back(std::move(a));
    }
    if (candidate_[i] >= 0 && !node.alerted) {
      node.alerted = true;
      culprit_ = static_cast<int64_t>(i);
      node.clean_evals = 0;
      const Metric& met = metrics_[static_cast<size_t>(candidate_[i])];
      Alert a;
      a.kind = "outlier";
      a.node = node.name;
      a.metric = met.name;
      a.score = cand_score_[i];
      a.ts_ns = now_ns;
      a.since_ns = cand_since_[i];
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "{\"metric\":\"%s\",\"value\":%.17g,\"median\":%.17g,\"mad\":%.17g,\"z\":%.6g,"
                    "\"threshold\":%g,\"window_s\":%g,\"continuity\":%d}",
                    json_escape(met.name).c_str(), finite(cand_value_[i]), finite(cand_median_[i]),
                    finite(cand_mad_[i]), cand_z_[i], config_.threshold, config_.window_s,
                    config_.continuity);
      a.evidence = buf;
      out->push_back(std::move(a));
    } else if (node.alerted) {
      // Re-arm after the machine has looked normal for `continuity` evaluations.
      node.clean_evals = outlier_now_[i] ? 0 : node.clean_evals + 1;
      if (node.clean_evals >= config_.continuity) node.alerted = false;
    }
  }
}

}  // namespace ballast::machine
