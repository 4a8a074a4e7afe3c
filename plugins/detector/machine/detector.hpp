// The faulty-machine detector, after Minder (arXiv 2411.01791): machines of
// one job behave alike, so each machine is judged against its peers.
//
// Per metric, at every evaluation (one sampling round, the samples with a
// time in (previous evaluation, now]):
//   1. each machine's round value is its sample of the round (the median when
//      it sent several); a machine without one has none this round;
//   2. score the round: robust z-score of each machine against the machines
//      of the same round,
//      z = (x - median) / max(1.4826 * MAD, usual * |median|, usual_abs, rel_floor * |median|, floor),
//      O(N) per metric (two nth_element passes, no all-pairs distance), where
//      `usual` is the metric's relative spread 1.4826 * MAD / |median|
//      averaged over the last `spread_memory` rounds (with few machines the
//      MAD of one round can be near zero by chance), `usual_abs` the same in
//      the metric's unit (when the job's level falls, its noise does not),
//      and `floor` the metric's min_deviation / threshold. A metric flags no
//      one in its first `warmup` rounds, while its usual spread is learnt.
//      What the machines' sampling instants explain is not a deviation:
//      a machine's value covers (its previous instant, its instant], its
//      peers' values intervals shifted by d_start and d_end from it, so while
//      the job's level swings by R (the range of the round medians over the
//      last `spread_memory` rounds: a lock-step job's compute and
//      communication phases) it can differ by (d_start + d_end) / period * R
//      without any fault; that much is taken off |x - median| before dividing
//      (d = the machine's offset from the round's median instant);
//   3. denoise: a machine's score is the median of its round z-scores over
//      the last `window` seconds of rounds, over the rounds it has a value
//      in (at least half of them): a lost sample removes one round from the
//      machine's evidence instead of comparing it on other instants than its
//      peers, and a machine caught for one round in another phase of a
//      lock-step step (compute vs communication) does not move it;
//   4. continuity: a machine whose |score| exceeds `threshold` for
//      `continuity` consecutive evaluations raises one "outlier" alert.
// One culprit per job (`hold_peers`): machines of a lock-step job wait on
// each other, so while one machine is the job's confirmed outlier its peers'
// metrics shift too (they wait on it). Their outliers are held back (counted
// in counters().held) until the culprit has looked normal again for
// `continuity` evaluations; a peer still apart then is alerted. When several
// machines become outliers at the same evaluation, the highest score wins.
// A job-wide change moves the median with every machine, so it scores zero;
// more than `max_outlier_fraction` outliers at once is a split, not a fault.
// Metrics are checked in the configured priority order; a machine flagged on
// several metrics at once is reported on the first. A machine that sends
// nothing for `silent_after` seconds raises "silent".
//
// Not thread-safe: one owner (the plugin serialises with a mutex).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ballast::machine {

struct DetectorConfig {
  double period_s = 1.0;     // evaluation period of the live plugin
  double lateness_s = 0.25;  // live plugin: a round ends this long before its evaluation
  double window_s = 3.0;     // denoising window: rounds whose z-scores' median is the score
  double threshold = 4.0;    // |robust z| above which a machine is an outlier
  int continuity = 1;        // consecutive outlier evaluations before an alert
  double silent_after_s = 5.0;
  double rel_floor = 0.1;              // scale floor relative to |median|
  double abs_floor = 1e-6;             // scale floor in the metric's unit
  double spread_memory = 10;           // evaluations averaged into the metric's usual relative spread
  int warmup = 5;                      // evaluations of a metric before it can flag anyone
  int min_nodes = 3;                   // fewer reporting machines: no verdict
  double max_outlier_fraction = 0.25;  // more outliers than this: a split, not a fault
  bool hold_peers = true;              // one culprit per job at a time (see above and README.md)
  size_t max_metrics = 4096;           // distinct metric names kept; more are counted and dropped
  std::vector<std::string> metrics;    // priority order, '*' globs; default_metrics()
  // The smallest deviation from the peers that counts, in the metric's unit,
  // for metrics that are usually 0 on every machine (retransmits, throttled
  // time, bytes written): the scale is at least min_deviation / threshold.
  // First matching pattern wins; these come before default_min_deviation().
  std::vector<std::pair<std::string, double>> min_deviation;
  // rel_floor per metric pattern, for metrics steadier than most (clocks,
  // power): first match wins; these come before default_rel_floors().
  std::vector<std::pair<std::string, double>> rel_floors;
};

// The default relative floors by metric and why, see README.md.
std::vector<std::pair<std::string, double>> default_rel_floors();

// The default minimum deviations and why, see README.md.
std::vector<std::pair<std::string, double>> default_min_deviation();

// The default priority order and why, see README.md.
std::vector<std::string> default_metrics();

// '*' matches any run of characters, anything else itself.
bool glob_match(std::string_view pattern, std::string_view text);

struct Alert {
  std::string kind;  // "outlier" or "silent"
  std::string node;
  std::string metric;    // empty for "silent"
  double score = 0;      // |z| for outliers, seconds without data for silent
  int64_t ts_ns = 0;     // when the alert was raised
  int64_t since_ns = 0;  // first evaluation the evidence held (last sample, for silent)
  std::string evidence;  // JSON object
};

struct DetectorCounters {
  uint64_t accepted = 0;
  uint64_t flagged = 0;    // BALLAST_SAMPLE_INVALID / COUNTER_RESET: not data
  uint64_t nonfinite = 0;  // NaN/inf without a flag: not data either
  uint64_t over_cap = 0;   // new metric names past max_metrics
  uint64_t ignored = 0;    // metrics matching no priority pattern
  uint64_t held = 0;       // outlier verdicts held back: another machine was the job's culprit
  uint64_t late = 0;       // samples older than the last evaluated round: not data
};

// How many metric names (and node x metric series) are checked, and how many
// the priority list ignores.
struct MetricCounts {
  size_t checked_metrics = 0, ignored_metrics = 0;
  size_t checked_series = 0, ignored_series = 0;
  std::vector<std::string> ignored_names;  // the first few, for a warning
};

class Detector {
 public:
  explicit Detector(DetectorConfig config);

  // Feed one sample. Returns false when it is not data (flagged, NaN/inf,
  // unknown metric past the cap, or ignored by the priority list).
  bool add(std::string_view node, std::string_view metric, int64_t ts_ns, double value, uint32_t flags);

  // Score every metric at time now_ns and append new alerts to *out.
  void evaluate(int64_t now_ns, std::vector<Alert>* out);

  // Per-machine-per-metric steps done by evaluate() so far: the cost model,
  // checked by the tests to grow linearly with the machines.
  uint64_t work() const { return work_; }
  const DetectorCounters& counters() const { return counters_; }
  MetricCounts metric_counts(size_t max_names = 5) const;
  const DetectorConfig& config() const { return config_; }

 private:
  struct Point {
    int64_t ts_ns;
    double value;
  };
  struct Series {
    std::vector<Point> points;  // not yet evaluated, oldest first
    std::vector<double> z;      // the last rounds' z-scores (ring; NaN: no value that round)
    size_t z_next = 0;          // ring position of the next round
    double last_value = 0;      // the latest round value (evidence)
    double offset_s = 0;        // |instant - round's median instant| last round, 0 without a value
    double score = 0;           // median of z over the window (valid when score_ok)
    bool score_ok = false;
    int streak = 0;  // consecutive outlier evaluations
    int64_t since_ns = 0;
    bool seen = false;  // ever sent a sample of this metric
  };
  struct Metric {
    std::string name;
    int rank = -1;         // index of the first matching pattern, -1 = ignored
    double floor = 0;      // abs_floor, or min_deviation / threshold
    double rel_floor = 0;  // config rel_floor, or its rel_floors entry
    double usual = 0;      // running mean of 1.4826 * MAD / |median|
    double usual_abs = 0;  // running mean of 1.4826 * MAD, in the metric's unit
    int evaluations = 0;   // with enough machines reporting
    int usual_updates = 0;
    double round_median = 0, round_mad = 0;  // of the last scored round (evidence)
    std::vector<double> medians;             // the last spread_memory rounds' medians (ring)
    size_t medians_next = 0;
    std::vector<Series> series;  // by node index (grown lazily)
    size_t seen_series = 0;      // series that sent a sample (ignored metrics too)
  };
  struct Node {
    std::string name;
    int64_t last_seen_ns = 0;
    bool silent = false;
    bool alerted = false;
    int clean_evals = 0;
  };

  uint32_t node_id(std::string_view name);
  int metric_id(std::string_view name);  // -1 when over the cap
  void sort_order();
  void hold_culprit_peers();  // one culprit per job: drop the other new candidates

  DetectorConfig config_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, uint32_t> node_index_;
  std::vector<Metric> metrics_;
  std::unordered_map<std::string, uint32_t> metric_index_;
  std::vector<uint32_t> order_;  // metrics checked, by priority then name
  bool order_dirty_ = false;
  int64_t culprit_ = -1;              // node index of the job's confirmed outlier, -1: none
  int64_t last_eval_ns_ = INT64_MIN;  // end of the last evaluated round
  size_t rounds_ = 1;                 // rounds in the window: max(1, window / period)
  uint64_t work_ = 0;
  DetectorCounters counters_;
  // Scratch reused by evaluate(): no allocation per evaluation once warm.
  std::vector<double> values_, scratch_, round_, instants_;
  std::vector<uint32_t> value_node_;
  std::vector<int> candidate_;  // per node: metric id of the first alerting metric, -1
  std::vector<double> cand_score_, cand_z_, cand_value_, cand_median_, cand_mad_;
  std::vector<int64_t> cand_since_;
  std::vector<uint8_t> outlier_now_;
};

}  // namespace ballast::machine
