// bench_detect_lockstep: the faulty-machine detector on generated metrics of
// a lock-step data-parallel job, independent of bench_detect's emulated job
// (which the detector was tuned on).
//
//   bench_detect_lockstep [--seed N | --fresh] [--per-fault N] [--clean N]
//                         [--seconds S] [--set classic|partial|all]
//                         [--style exporter|plain] [--config F.lua] [--out DIR]
//
// Each scenario is a job of 8-64 machines x 4 GPUs in lock-step: steps of
// 3-8 s, 70% compute then 30% communication; checkpoints every 25-40 s;
// job-wide slowdowns and pauses (which must not alert); every machine
// sampled once a second with 0-200 ms jitter, about 1% of samples lost;
// metrics named as the DCGM exporter and node-exporter name them (counters
// cumulative), or with plain names (--style plain). One fault on one machine
// from a random onset to the end, or none. Samples are replayed exactly as
// `ballast detect` replays a CSV (exporter names mapped, counters turned into
// rates, one evaluation per round); --out DIR also writes each scenario as a
// CSV that `ballast detect --metrics` reads (labelled series quoted).
// The same job's per-rank step timings go through the straggler analysis,
// its all-reduces, as each rank's trace ring records them, through the hang
// analysis, and the three detectors' verdicts through the suspect fusion: the
// suspects/* lines score each source side by side (use --seconds 300: the
// straggler analysis reports every 10 steps of 3-8 s). --set picks the
// faults: classic (the seven of issue 27's item 3, the default), partial
// (hangs, a late input pipeline, an XID error: faults each detector sees only
// in part) or all (both).
#include "detect_command.hpp"
#include "detector.hpp"
#include "detector_config.hpp"
#include "fusion.hpp"
#include "lockstep_hang.hpp"
#include "lockstep_job.hpp"
#include "metrics_csv.hpp"
#include "online.hpp"

#include <sys/stat.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

using namespace bench_lockstep;
using ballast::machine::Alert;
using ballast::machine::Detector;
using ballast::machine::DetectorConfig;

namespace {

void emit(const std::string& cs, const std::string& metric, double value, const std::string& unit,
          nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {{"bench", "detect_lockstep"}, {"case", cs}, {"metric", metric}, {"value", value}, {"unit", unit}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

struct Verdict {
  bool found = false;
  double latency = -1;
  int false_alerts = 0;
  std::string metric;
  nlohmann::json false_detail = nlohmann::json::array();  // metric, seconds from the start
};

Verdict judge(const Scenario& sc, const std::vector<Alert>& alerts) {
  Verdict v;
  std::string target = sc.faulty >= 0 ? machine_name(sc.faulty) : "";
  for (const Alert& a : alerts) {
    double ts = static_cast<double>(a.ts_ns) / 1e9;
    if (!target.empty() && a.node == target && ts >= sc.onset_s) {
      if (!v.found) {
        v.found = true;
        v.latency = ts - sc.onset_s;
        v.metric = a.metric;
      }
    } else {
      ++v.false_alerts;
      v.false_detail.push_back({{"node", a.node}, {"metric", a.metric}, {"t_s", std::round((ts - 1.8e9) * 10) / 10}});
    }
  }
  return v;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  double idx = p * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(idx), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

// Who names which machine when, for one source of verdicts: the machine
// detector (an alert), the straggler analysis (a report of kind "worker":
// its rank culprits slowed the job by at least min_slowdown), or the fused
// ranking (a suspect reaches "alerting").
struct Naming {
  double t;
  std::string node;
};

// The straggler analysis (plugins/detector/straggler, as its plugin runs it
// on step.timing events) over the scenario's step timings: every report it
// would publish, and the fusion's inputs from it.
struct StragglerReport {
  double t;
  ballast::straggler::WhatIfResult result;
};

std::vector<StragglerReport> run_straggler(const std::vector<StepTimings>& steps) {
  ballast::straggler::OnlineDetector online(ballast::straggler::OnlineConfig{});
  std::vector<StragglerReport> out;
  for (const StepTimings& st : steps) {
    if (st.hung) continue;  // no rank finished it: none reported it
    online.add(st.ops.data(), st.ops.size());
    if (auto r = online.poll()) out.push_back({st.end_s, std::move(*r)});
  }
  return out;
}

constexpr double kStraggling = 1.03;  // OnlineConfig's min_slowdown: a rank slowing the job less is not named

std::vector<Naming> straggler_namings(const std::vector<StragglerReport>& reports) {
  std::vector<Naming> out;
  for (const auto& r : reports) {
    if (r.result.kind != "worker") continue;
    for (size_t i = 0; i < r.result.mw_ranks.size() && i < r.result.by_rank.size(); ++i)
      if (r.result.by_rank[i].slowdown >= kStraggling)
        out.push_back({r.t, machine_name(std::atoi(r.result.by_rank[i].name.c_str()) / kRanksPerMachine)});
  }
  return out;
}

std::vector<Naming> hang_namings(const std::vector<HangReport>& reports) {
  std::vector<Naming> out;
  for (const auto& r : reports) out.push_back({r.t, machine_name(r.cause.rank / kRanksPerMachine)});
  return out;
}

// Every verdict of the chosen detectors through the suspect fusion
// (plugins/detector/fusion), in time order, as its plugin receives them;
// ranks are folded into machines by the placement (4 ranks per machine).
// After each: the ranking's first suspect, and every alerting one.
struct FusedNamings {
  std::vector<Naming> first, alerting;
};

struct FusionInputs {
  const std::vector<Alert>* alerts = nullptr;
  const std::vector<StragglerReport>* straggler = nullptr;
  const std::vector<HangReport>* hang = nullptr;
};

FusedNamings fused_namings(const Scenario& sc, const FusionInputs& in, double threshold) {
  ballast::fusion::Fusion f(ballast::fusion::FusionConfig{});
  std::vector<std::pair<std::string, int32_t>> placement;
  for (int m = 0; m < sc.machines; ++m) placement.emplace_back(machine_name(m), m * kRanksPerMachine);
  f.set_placement(placement);
  // (time, source, index): the inputs in time order.
  std::vector<std::tuple<int64_t, int, size_t>> order;
  for (size_t i = 0; in.alerts && i < in.alerts->size(); ++i) order.emplace_back((*in.alerts)[i].ts_ns, 0, i);
  for (size_t i = 0; in.straggler && i < in.straggler->size(); ++i)
    order.emplace_back(std::llround((*in.straggler)[i].t * 1e9), 1, i);
  for (size_t i = 0; in.hang && i < in.hang->size(); ++i) order.emplace_back(std::llround((*in.hang)[i].t * 1e9), 2, i);
  std::stable_sort(order.begin(), order.end());
  FusedNamings out;
  for (const auto& [now, source, i] : order) {
    if (source == 0) {
      const Alert& x = (*in.alerts)[i];
      ballast::fusion::Suspicion s;
      s.detector = "machine";
      s.subject = x.node;
      s.kind = x.kind;
      s.metric = x.metric;
      s.score = x.score;
      s.confirmed = x.kind == "silent";
      s.confidence = s.confirmed ? 1.0 : std::min(1.0, x.score / (2 * threshold));  // as the machine plugin publishes
      s.since_ns = x.since_ns;
      s.at_ns = x.ts_ns;
      f.add(std::move(s));
    } else if (source == 1) {
      const StragglerReport& x = (*in.straggler)[i];
      for (size_t k = 0; k < x.result.mw_ranks.size() && k < x.result.by_rank.size(); ++k)
        f.add_straggler(std::atoi(x.result.by_rank[k].name.c_str()), x.result.kind, x.result.by_rank[k].slowdown,
                        x.result.slowdown, now, "");
    } else {
      const HangReport& x = (*in.hang)[i];
      ballast::fusion::Suspicion s;  // as the hang plugin publishes (fault.confirmed)
      s.detector = "hang";
      s.subject = "rank:" + std::to_string(x.cause.rank);
      s.rank = x.cause.rank;
      s.kind = x.cause.kind;
      s.metric = "collective.progress";
      s.score = static_cast<double>(now - x.since_ns) / 1e9;
      s.confidence = 1.0;
      s.confirmed = true;
      s.since_ns = x.since_ns;
      s.at_ns = now;
      f.add(std::move(s));
    }
    auto ranking = f.ranking(now);
    if (!ranking.empty()) out.first.push_back({static_cast<double>(now) / 1e9, ranking[0].node});
    for (const auto& suspect : ranking)
      if (suspect.alerting) out.alerting.push_back({static_cast<double>(now) / 1e9, suspect.node});
  }
  return out;
}

// One source's score over the runs: faulty runs whose first naming is the
// faulty machine at or after the onset, and how long after it; machines
// alerted falsely (another machine, or before the onset) and fault-free runs
// with an alert. A detector names by alerting; the fusion names the first
// suspect of its ranking and alerts at min_score.
struct SourceTally {
  int named_first = 0, faulty_runs = 0, false_machines = 0, clean_named = 0, found = 0;
  std::vector<double> latency;

  void add(const Scenario& sc, const std::vector<Naming>& namings) { add(sc, namings, namings); }
  void add(const Scenario& sc, const std::vector<Naming>& namings, const std::vector<Naming>& alerts) {
    std::string target = sc.faulty >= 0 ? machine_name(sc.faulty) : "";
    auto right = [&](const Naming& n) { return !target.empty() && n.node == target && n.t >= sc.onset_s; };
    std::set<std::string> wrong;
    for (const Naming& n : alerts)
      if (!right(n)) wrong.insert(n.node);
    false_machines += static_cast<int>(wrong.size());
    if (sc.fault == Fault::none) {
      clean_named += !alerts.empty();
      return;
    }
    ++faulty_runs;
    auto first_right = std::find_if(namings.begin(), namings.end(), right);
    if (first_right == namings.end()) return;
    ++found;
    latency.push_back(first_right->t - sc.onset_s);
    named_first += first_right == namings.begin();
  }
};

struct Tally {
  int tp = 0, fp = 0, fn = 0, clean = 0, clean_with_alert = 0;
  std::vector<double> latency;
};

void write_csv(const std::string& path, const ballast::machine::MetricsTable& t) {
  gzFile f = gzopen(path.c_str(), "wb6");
  if (!f) return;
  gzprintf(f, "ts,node,metric,value\n");
  for (const auto& r : t.rows) {
    std::string m = t.metrics[r.metric], quoted = "\"";
    for (char c : m) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    quoted += '"';
    gzprintf(f, "%.3f,%s,%s,%.9g\n", static_cast<double>(r.ts_ns) / 1e9, t.nodes[r.node].c_str(), quoted.c_str(),
             r.value);
  }
  gzclose(f);
}

const char* flag(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return nullptr;
}
bool has(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

const char* kUsage =
    "usage: bench_detect_lockstep [--seed N | --fresh] [--per-fault N] [--clean N] [--seconds S]\n"
    "                             [--set classic|partial|all] [--style exporter|plain]\n"
    "                             [--config FILE.lua] [--out DIR]\n"
    "Generates lock-step job metrics with one planted fault per scenario (or none) and\n"
    "scores the faulty-machine detector: precision, recall, F1, latency, fault-free runs\n"
    "with an alert; then the machine detector, the straggler analysis (on the ranks' step\n"
    "timings), the hang analysis (on the ranks' trace rings) and their fusion side by side\n"
    "(suspects/*). --set: the seven faults of issue 27 (classic, the default), those each\n"
    "detector sees only in part (partial: hangs, late input, an XID error), or all. JSON lines\n"
    "on stdout.\n";

bool load_config(const char* path, DetectorConfig* config) {
  if (!path) return true;
  std::string error;
  if (!ballast::machine::load_config_file(path, config, &error)) {
    std::fprintf(stderr, "bench_detect_lockstep: %s\n", error.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (has(argc, argv, "--help") || has(argc, argv, "-h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  uint64_t seed = flag(argc, argv, "--seed") ? std::strtoull(flag(argc, argv, "--seed"), nullptr, 10) : 2027;
  if (has(argc, argv, "--fresh")) seed = std::random_device{}();
  int per_fault = flag(argc, argv, "--per-fault") ? std::atoi(flag(argc, argv, "--per-fault")) : 10;
  int n_clean = flag(argc, argv, "--clean") ? std::atoi(flag(argc, argv, "--clean")) : 20;
  double seconds = flag(argc, argv, "--seconds") ? std::atof(flag(argc, argv, "--seconds")) : 90;
  std::string style = flag(argc, argv, "--style") ? flag(argc, argv, "--style") : "exporter";
  const char* out_dir = flag(argc, argv, "--out");
  std::string set = flag(argc, argv, "--set") ? flag(argc, argv, "--set") : "classic";
  if (style != "exporter" && style != "plain") {
    std::fprintf(stderr, "bench_detect_lockstep: --style: expected exporter or plain\n%s", kUsage);
    return 2;
  }
  if (set != "classic" && set != "partial" && set != "all") {
    std::fprintf(stderr, "bench_detect_lockstep: --set: expected classic, partial or all\n%s", kUsage);
    return 2;
  }
  std::vector<Fault> faults;
  if (set != "partial") faults = all_faults();
  if (set != "classic") faults.insert(faults.end(), partial_faults().begin(), partial_faults().end());
  DetectorConfig config;
  if (!load_config(flag(argc, argv, "--config"), &config)) return 1;
  if (out_dir) mkdir(out_dir, 0755);
  emit("setup", "seed", static_cast<double>(seed), "", {{"style", style}, {"seconds", seconds}, {"set", set}});

  std::mt19937_64 rng(seed);
  std::vector<Scenario> plan;
  int index = 0;
  for (int k = 0; k < per_fault; ++k)
    for (Fault f : faults) plan.push_back(make_scenario(index++, f, seconds, rng));
  for (int k = 0; k < n_clean; ++k) plan.push_back(make_scenario(index++, Fault::none, seconds, rng));
  for (Scenario& sc : plan) sc.extended = set != "classic";

  Tally all;
  // The sources side by side on the same runs: each single detector, the
  // fusion of all three (named by its ranking's first suspect; by alerting),
  // and the fusion without the hang analysis; each also per fault.
  const std::vector<std::string> sources = {"machine_detector", "straggler_analysis", "hang_analysis",
                                            "fusion",           "fusion_alerting",    "fusion_without_hang"};
  std::map<std::string, SourceTally> by_source;
  std::map<std::string, std::map<std::string, SourceTally>> by_fault_source;
  size_t n_faults = all_faults().size() + partial_faults().size() + 1;
  std::vector<Tally> by_fault(n_faults);
  std::vector<std::vector<std::string>> metrics_by_fault(by_fault.size());
  for (const Scenario& sc : plan) {
    ballast::machine::MetricsTable table = generate(sc, style == "plain");
    if (out_dir) {
      char name[96];
      std::snprintf(name, sizeof name, "/s%03d-%s.csv.gz", sc.index, fault_name(sc.fault));
      write_csv(out_dir + std::string(name), table);
    }
    ballast::machine::map_exporter_names(&table);
    Detector d(config);
    std::vector<Alert> alerts = ballast::machine::replay(table, &d);
    Verdict v = judge(sc, alerts);
    std::vector<Naming> machine_namings;
    for (const Alert& a : alerts) machine_namings.push_back({static_cast<double>(a.ts_ns) / 1e9, a.node});
    std::vector<StepTimings> steps = step_timings(sc);
    std::vector<StragglerReport> reports = run_straggler(steps);
    std::vector<HangReport> hangs = run_hang(sc, steps);
    double threshold = d.config().threshold;
    FusedNamings fused = fused_namings(sc, {&alerts, &reports, &hangs}, threshold);
    FusedNamings without_hang = fused_namings(sc, {&alerts, &reports, nullptr}, threshold);
    for (auto* tally : {&by_source, &by_fault_source[fault_name(sc.fault)]}) {
      (*tally)["machine_detector"].add(sc, machine_namings);
      (*tally)["straggler_analysis"].add(sc, straggler_namings(reports));
      (*tally)["hang_analysis"].add(sc, hang_namings(hangs));
      (*tally)["fusion"].add(sc, fused.first, fused.alerting);
      (*tally)["fusion_alerting"].add(sc, fused.alerting);
      (*tally)["fusion_without_hang"].add(sc, without_hang.first, without_hang.alerting);
    }
    size_t fi = static_cast<size_t>(sc.fault);
    for (Tally* t : {&all, &by_fault[fi]}) {
      t->fp += v.false_alerts;
      if (sc.fault == Fault::none) {
        ++t->clean;
        t->clean_with_alert += v.false_alerts > 0;
      } else if (v.found) {
        ++t->tp;
        t->latency.push_back(v.latency);
      } else {
        ++t->fn;
      }
    }
    if (v.found) metrics_by_fault[fi].push_back(v.metric);
    nlohmann::json j = {{"bench", "detect_lockstep"},
                        {"case", "scenario"},
                        {"scenario", sc.index},
                        {"fault", fault_name(sc.fault)},
                        {"machines", sc.machines},
                        {"faulty", sc.faulty},
                        {"onset_s", sc.onset_s},
                        {"found", v.found},
                        {"latency_s", v.found ? nlohmann::json(v.latency) : nlohmann::json()},
                        {"alert_metric", v.metric},
                        {"false_alerts", v.false_alerts},
                        {"false_detail", v.false_detail}};
    j["straggler_reports"] = nlohmann::json::array();
    for (const auto& r : reports) {
      nlohmann::json ranks = nlohmann::json::array();
      for (size_t i = 0; i < r.result.mw_ranks.size() && i < r.result.by_rank.size(); ++i)
        ranks.push_back({{"rank", r.result.by_rank[i].name}, {"slowdown", r.result.by_rank[i].slowdown}});
      j["straggler_reports"].push_back({{"t_s", std::round((r.t - 1.8e9) * 10) / 10},
                                        {"kind", r.result.kind},
                                        {"slowdown", r.result.slowdown},
                                        {"mw_ranks", ranks}});
    }
    j["hang_reports"] = nlohmann::json::array();
    for (const auto& h : hangs)
      j["hang_reports"].push_back(
          {{"t_s", std::round((h.t - kEpochS) * 10) / 10}, {"rank", h.cause.rank}, {"kind", h.cause.kind}});
    j["fused_first"] = fused.first.empty() ? "" : fused.first.back().node;
    std::printf("%s\n", j.dump().c_str());
  }
  auto report = [&](const std::string& cs, const Tally& s) {
    double precision = s.tp + s.fp ? static_cast<double>(s.tp) / (s.tp + s.fp) : 0;
    double recall = s.tp + s.fn ? static_cast<double>(s.tp) / (s.tp + s.fn) : 0;
    double f1 = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
    double mean = 0;
    for (double l : s.latency) mean += l;
    mean = s.latency.empty() ? NAN : mean / static_cast<double>(s.latency.size());
    nlohmann::json counts = {{"tp", s.tp}, {"fp", s.fp}, {"fn", s.fn}, {"clean", s.clean}, {"style", style}};
    emit(cs, "precision", precision, "", counts);
    emit(cs, "recall", recall, "");
    emit(cs, "f1", f1, "");
    emit(cs, "clean_runs_with_alert", s.clean_with_alert, "runs", {{"clean", s.clean}});
    emit(cs, "latency_mean", mean, "s", {{"peer", "Minder (published)"}, {"peer_value", 3.6}});
    emit(cs, "latency_p90", percentile(s.latency, 0.9), "s");
  };
  report("detector", all);
  for (const std::string& name : sources) {
    const SourceTally& t = by_source[name];
    std::string cs = "suspects/" + name;
    emit(cs, "faulty_named_first", t.named_first, "runs", {{"of", t.faulty_runs}, {"found", t.found}});
    emit(cs, "machines_falsely_alerted", t.false_machines, "machines",
         {{"clean_runs_alerted", t.clean_named}, {"clean", n_clean}});
    emit(cs, "latency_median", percentile(t.latency, 0.5), "s");
  }
  for (Fault f : faults) {
    nlohmann::json first = nlohmann::json::object(), falsely = nlohmann::json::object();
    for (const std::string& name : sources) {
      const SourceTally& t = by_fault_source[fault_name(f)][name];
      first[name] = t.named_first;
      falsely[name] = t.false_machines;
    }
    emit(std::string("suspects_by_fault/") + fault_name(f), "faulty_named_first", per_fault, "runs",
         {{"named_first", first}, {"machines_falsely_alerted", falsely}});
  }
  for (Fault f : faults) {
    size_t fi = static_cast<size_t>(f);
    std::string top;
    auto& ms = metrics_by_fault[fi];
    size_t best = 0;
    for (const auto& m : ms) {
      size_t c = static_cast<size_t>(std::count(ms.begin(), ms.end(), m));
      if (c > best) best = c, top = m;
    }
    const Tally& t = by_fault[fi];
    double mean = 0;
    for (double l : t.latency) mean += l;
    emit(std::string("fault/") + fault_name(f), "detected", t.tp, "runs",
         {{"of", t.tp + t.fn},
          {"false_alerts", t.fp},
          {"latency_mean_s",
           t.latency.empty() ? nlohmann::json() : nlohmann::json(mean / static_cast<double>(t.latency.size()))},
          {"metric", top}});
  }
  return 0;
}
