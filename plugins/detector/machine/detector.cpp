#include "detector.hpp"

#include <ballast/events.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace ballast::machine {

std::vector<std::string> default_metrics() {
  return {// Hardware error counters: a non-zero count on one machine is the most
          // specific evidence there is.
          "gpu*.xid", "gpu*.ecc.uncorrected",
          // Accelerator duty cycle and power: they follow the job's progress
          // directly (Minder's most telling metrics).
          "gpu*.util", "gpu*.power", "gpu*.sm_clock", "gpu*.nvlink.*", "gpu*.pcie.*",
          // The job's CPU: throttling and stalls first, then busy time and
          // wake-ups (a stopped process stops waking up while its peers poll).
          "cgroup.cpu.throttled", "cgroup.cpu.pressure", "psi.cpu", "proc.cpu", "cgroup.cpu.usage",
          "proc.ctxt_voluntary", "cpu.util", "cpu.user", "cpu.system", "cpu.iowait", "cpu.steal",
          // Network: retransmits, drops and errors, then throughput.
          "net.tcp.retrans", "net.*_drops", "net.*_errors", "net.*.carrier_changes", "net.*_pause", "net.*.rx_bytes",
          "net.*.tx_bytes",
          // Disk and memory last: healthy machines legitimately differ there
          // (a checkpoint writer, a cache), so they decide only when nothing else does.
          "cgroup.io.pressure", "psi.io", "proc.write_bytes", "proc.read_bytes", "cgroup.io.*", "disk.*",
          "cgroup.memory.pressure", "psi.memory", "proc.rss_bytes", "cgroup.memory.current", "mem.*"};
}

std::vector<std::pair<std::string, double>> default_min_deviation() {
  return {{"gpu*.xid", 1},
          {"gpu*.ecc.*", 1},
          {"net.tcp.retrans", 20},
          {"net.*_drops", 20},
          {"net.*_errors", 20},
          {"cgroup.cpu.throttled", 0.01},
          {"cgroup.*.pressure", 0.05},
          {"psi.*", 0.05},
          {"net.*.carrier_changes", 0.5},
          {"net.*_pause", 1000},
          {"proc.cpu", 0.05},
          {"cgroup.cpu.*", 0.05},
          {"proc.ctxt_*", 50},
          {"proc.write_bytes", 1e6},
          {"proc.read_bytes", 1e6},
          {"cgroup.io.*_bytes", 1e6},
          {"disk.*_bytes", 1e6},
          {"cgroup.io.*_ops", 50},
          {"disk.*_ops", 50},
          {"net.*_bytes", 1e6},
          {"net.*_packets", 1000}};
}

std::vector<std::pair<std::string, double>> default_rel_floors() {
  // A GPU's clocks are steady and alike across healthy GPUs (within a
  // percent, busy or not); a capped or slowed GPU's are 20-40% lower.
  return {{"gpu*.sm_clock", 0.02}, {"gpu*.mem_clock", 0.02}};
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

// Finite stand-in for JSON (a garbage machine may produce 1e308 - (-1e308)).
double finite(double x) { return std::isfinite(x) ? x : (x > 0 ? 1e300 : -1e300); }

// Metric names come from the bus or a file: invalid UTF-8 is replaced, never
// thrown, so the evidence is always valid JSON.
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// The score from a z-score ring: the median of its finite entries, and with
// an even count the middle one closer to 0, or 0 when they straddle it (not
// their mean: a window with one round missing and one odd round must not
// look half odd). False with fewer
// than `need` finite entries.
bool ring_score(const std::vector<double>& z, size_t need, std::vector<double>* scratch, double* out) {
  scratch->clear();
  for (double v : z)
    if (!std::isnan(v)) scratch->push_back(v);
  if (scratch->empty() || scratch->size() < need) return false;
  std::sort(scratch->begin(), scratch->end());
  size_t n = scratch->size();
  double hi = (*scratch)[n / 2];
  if (n % 2) {
    *out = hi;
  } else {
    double lo = (*scratch)[n / 2 - 1];
    *out = lo < 0 && hi > 0 ? 0 : std::fabs(lo) < std::fabs(hi) ? lo : hi;
  }
  return true;
}

}  // namespace

Detector::Detector(DetectorConfig config) : config_(std::move(config)) {
  if (config_.metrics.empty()) config_.metrics = default_metrics();
  for (auto& d : default_min_deviation()) config_.min_deviation.push_back(std::move(d));
  for (auto& d : default_rel_floors()) config_.rel_floors.push_back(std::move(d));
  if (config_.continuity < 1) config_.continuity = 1;
  if (config_.min_nodes < 3) config_.min_nodes = 3;
  double rounds = config_.period_s > 0 ? config_.window_s / config_.period_s : 1;
  rounds_ = std::isfinite(rounds) && rounds > 1 ? static_cast<size_t>(std::min(std::lround(rounds), 1000L)) : 1;
}

MetricCounts Detector::metric_counts(size_t max_names) const {
  MetricCounts c;
  for (const Metric& m : metrics_) {
    if (m.rank >= 0) {
      ++c.checked_metrics;
      c.checked_series += m.seen_series;
    } else {
      ++c.ignored_metrics;
      c.ignored_series += m.seen_series;
      if (c.ignored_names.size() < max_names) c.ignored_names.push_back(m.name);
    }
  }
  return c;
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
  double rel_floor = config_.rel_floor;
  for (const auto& [pattern, f] : config_.rel_floors) {
    if (glob_match(pattern, name)) {
      rel_floor = f;
      break;
    }
  }
  Metric met;
  met.rel_floor = rel_floor;
  met.name = std::string(name);
  met.rank = rank;
  met.floor = floor;
  metrics_.push_back(std::move(met));
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

bool Detector::add(std::string_view node, std::string_view metric, int64_t ts_ns, double value, uint32_t flags) {
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
  uint32_t id = node_index_.find(std::string(node))->second;
  if (met.series.size() <= id) met.series.resize(nodes_.size());
  Series& s = met.series[id];
  if (!s.seen) {
    s.seen = true;
    ++met.seen_series;
  }
  if (met.rank < 0) {
    ++counters_.ignored;
    return false;
  }
  // A sample of a round already judged, or out of time order, is not data.
  if (ts_ns <= last_eval_ns_) {
    ++counters_.late;
    return false;
  }
  auto& pts = s.points;
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
  const int64_t round_start = last_eval_ns_;
  if (now_ns > last_eval_ns_) last_eval_ns_ = now_ns;
  const size_t need = rounds_ / 2 + 1;  // a majority of the window's rounds

  for (uint32_t mi : order_) {
    Metric& met = metrics_[mi];
    // 1. Each machine's value in this round: its samples in (round_start, now].
    values_.clear();
    value_node_.clear();
    instants_.clear();
    for (uint32_t i = 0; i < met.series.size(); ++i) {
      Series& s = met.series[i];
      ++work_;
      if (s.z.size() != rounds_) s.z.assign(rounds_, std::nan(""));
      s.z[s.z_next] = std::nan("");  // until this round scores it
      round_.clear();
      size_t used = 0;
      int64_t instant = 0;
      for (const Point& p : s.points) {
        if (p.ts_ns > now_ns) break;
        ++used;
        if (p.ts_ns > round_start) {
          round_.push_back(p.value);
          instant = p.ts_ns;
        }
      }
      if (used) s.points.erase(s.points.begin(), s.points.begin() + static_cast<long>(used));
      if (round_.empty()) {
        s.offset_s = 0;
        continue;
      }
      s.last_value = median_of(round_);
      values_.push_back(s.last_value);
      value_node_.push_back(i);
      instants_.push_back(static_cast<double>(now_ns - instant) / 1e9);
    }
    // 2. Score the round against the machines of the same round.
    size_t n = values_.size();
    if (n >= static_cast<size_t>(config_.min_nodes)) {
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
      double scale = std::max({robust, met.usual * level, met.usual_abs, met.rel_floor * level, met.floor});
      met.round_median = med;
      met.round_mad = mad;
      // The job's swing: the range of its recent round medians.
      size_t memory = static_cast<size_t>(std::clamp(config_.spread_memory, 1.0, 1000.0));
      if (met.medians.size() < memory) {
        met.medians.push_back(med);
      } else {
        met.medians[met.medians_next] = med;
        met.medians_next = (met.medians_next + 1) % met.medians.size();
      }
      auto [lo, hi] = std::minmax_element(met.medians.begin(), met.medians.end());
      double swing_per_s = (*hi - *lo) / std::max(config_.period_s, 1e-3);
      scratch_.assign(instants_.begin(), instants_.end());
      double instant_median = median_of(scratch_);
      // Several machines apart in one round: the job changed phase while it
      // was being sampled (lock-step machines caught on both sides of a
      // compute/communication boundary), which says nothing about any one
      // machine. The round is no evidence for anyone.
      size_t apart = 0;
      for (size_t k = 0; k < n; ++k) apart += std::fabs(values_[k] - med) > config_.threshold * scale;
      for (size_t k = 0; k < n; ++k) {
        Series& s = met.series[value_node_[k]];
        double offset = std::fabs(instants_[k] - instant_median);
        double timing = (s.offset_s + offset) * swing_per_s;
        s.offset_s = offset;
        if (apart > std::max<size_t>(1, n / 20)) continue;
        double beyond = std::max(0.0, std::fabs(values_[k] - med) - timing);
        s.z[s.z_next] = finite(std::copysign(beyond, values_[k] - med) / scale);
      }
    } else {
      for (uint32_t i : value_node_) met.series[i].offset_s = 0;
    }
    // 3. Each machine's score: the median of its z-scores over the window.
    bool warm = met.evaluations > config_.warmup;
    size_t scored = 0, outliers = 0;
    for (Series& s : met.series) {
      s.score_ok = warm && ring_score(s.z, need, &scratch_, &s.score);
      if (!s.score_ok) continue;
      ++scored;
      if (std::fabs(s.score) > config_.threshold) ++outliers;
    }
    // Many machines apart at once is a split of the job (or a job-wide change
    // caught half-way), not one faulty machine.
    bool split = static_cast<double>(outliers) > config_.max_outlier_fraction * static_cast<double>(scored);
    // 4. Continuity.
    for (uint32_t i = 0; i < met.series.size(); ++i) {
      Series& s = met.series[i];
      if (!s.z.empty()) s.z_next = (s.z_next + 1) % s.z.size();
      if (!s.score_ok || split || std::fabs(s.score) <= config_.threshold) {
        s.streak = 0;
        continue;
      }
      if (s.streak == 0) s.since_ns = now_ns;
      ++s.streak;
      outlier_now_[i] = 1;
      if (s.streak >= config_.continuity && candidate_[i] < 0) {
        candidate_[i] = static_cast<int>(mi);
        cand_score_[i] = std::fabs(s.score);
        cand_z_[i] = s.score;
        cand_value_[i] = s.last_value;
        cand_median_[i] = met.round_median;
        cand_mad_[i] = met.round_mad;
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
      a.evidence = dump(
          {{"last_seen_s", static_cast<double>(node.last_seen_ns) / 1e9}, {"silent_after_s", config_.silent_after_s}});
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
      a.evidence = dump({{"metric", met.name},
                         {"value", finite(cand_value_[i])},
                         {"median", finite(cand_median_[i])},
                         {"mad", finite(cand_mad_[i])},
                         {"z", cand_z_[i]},
                         {"threshold", config_.threshold},
                         {"window_s", config_.window_s},
                         {"continuity", config_.continuity}});
      out->push_back(std::move(a));
    } else if (node.alerted) {
      // Re-arm after the machine has looked normal for `continuity` evaluations.
      node.clean_evals = outlier_now_[i] ? 0 : node.clean_evals + 1;
      if (node.clean_evals >= config_.continuity) node.alerted = false;
    }
  }
}

}  // namespace ballast::machine
