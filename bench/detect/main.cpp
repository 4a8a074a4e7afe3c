// bench_detect: the faulty-machine detector against real faults injected
// into an emulated job on this machine, and its cost at 10,000 machines.
//
//   bench_detect [--quick] [--faulty N] [--clean N] [--seconds S] [--out DIR]
//   bench_detect --replay DIR [--config FILE.lua]   re-score recorded scenarios
//   bench_detect --cost                              the synthetic-load case only
//
// Each scenario starts the job, samples every machine's real metrics once a
// second with the collector's code (plugins/detector/collect), injects one
// fault into one machine at a random time (or none), writes the samples as
// ts,node,metric,value CSV (replayable with `ballast detect --metrics`), and
// replays them through the detector as `ballast detect` does. Prints JSON
// lines: one per scenario, then precision, recall, F1 and the latency
// distribution, for the detector and for an ablation without denoising and
// continuity.
#include "job.hpp"

#include "detect_command.hpp"
#include "detector.hpp"
#include "detector_config.hpp"
#include "metrics_csv.hpp"
#include "node_sampler.hpp"

#include <ballast/events.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace bench_detect;
using ballast::machine::Alert;
using ballast::machine::Detector;
using ballast::machine::DetectorConfig;

namespace {

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void emit(const std::string& cs, const std::string& metric, double value, const std::string& unit,
          nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {{"bench", "detect"}, {"case", cs}, {"metric", metric}, {"value", value}, {"unit", unit}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

struct Scenario {
  int index;
  Fault fault;
  int machine;     // -1 for none
  double onset_s;  // wall clock seconds; 0 for none
  std::string csv;
  double steps_per_s_before = 0, steps_per_s_after = 0;
};

// ---- running one scenario ----------------------------------------------

volatile sig_atomic_t g_stop = 0;

bool run_scenario(Job& job, Scenario& sc, double seconds, double onset_at, std::string* error) {
  if (!job.start(error)) return false;
  std::vector<ballast::collect::NodeSampler> samplers;
  for (auto& m : job.machines()) {
    ballast::collect::NodeOptions o;
    o.system = false;
    o.cgroups = m.cgroups;
    if (m.cgroups.empty()) o.pids = m.workers;
    if (!m.netns.empty()) o.net_pid = m.workers.front();
    samplers.emplace_back(o);
  }
  gzFile out = gzopen(sc.csv.c_str(), "wb6");
  if (!out) {
    *error = sc.csv + ": cannot write";
    return false;
  }
  gzprintf(out, "ts,node,metric,value\n");
  auto t0 = std::chrono::steady_clock::now();
  auto at = [&](double s) { return t0 + std::chrono::microseconds(static_cast<int64_t>(s * 1e6)); };
  bool injected = sc.fault == Fault::none;
  uint64_t steps_at_onset = 0;
  double onset_rel = 0;
  std::vector<ballast::collect::Sample> samples;
  for (int k = 0; k <= static_cast<int>(seconds) && !g_stop; ++k) {
    if (!injected && at(onset_at) <= at(k)) {
      std::this_thread::sleep_until(at(onset_at));
      sc.onset_s = static_cast<double>(wall_ns()) / 1e9;
      steps_at_onset = job.steps();
      onset_rel = onset_at;
      sc.steps_per_s_before = static_cast<double>(steps_at_onset) / onset_at;
      if (!job.inject(sc.fault, sc.machine, error)) return false;
      injected = true;
    }
    std::this_thread::sleep_until(at(k));
    int64_t ts = wall_ns();
    for (size_t i = 0; i < samplers.size(); ++i) {
      samples.clear();
      samplers[i].sample(ts, &samples);
      for (const auto& s : samples) {
        if (s.flags & (BALLAST_SAMPLE_INVALID | BALLAST_SAMPLE_COUNTER_RESET)) continue;  // not data
        gzprintf(out, "%.3f,%s,%s,%.9g\n", static_cast<double>(ts) / 1e9, job.machines()[i].name.c_str(),
                 s.metric.c_str(), s.value);
      }
    }
  }
  uint64_t steps_end = job.steps();
  if (sc.fault != Fault::none && seconds > onset_rel)
    sc.steps_per_s_after = static_cast<double>(steps_end - steps_at_onset) / (seconds - onset_rel);
  else
    sc.steps_per_s_before = static_cast<double>(steps_end) / seconds;
  gzclose(out);
  job.stop();
  return true;
}

// ---- scoring ---------------------------------------------------------------

struct Score {
  int tp = 0, fp = 0, fn = 0, clean_runs = 0, clean_with_alert = 0;
  std::vector<double> latency;
};

struct Verdict {
  std::string outcome;  // tp, fn (+fp count), tn, fp
  double latency = -1;
  int false_alerts = 0;
  std::string metric;
  nlohmann::json false_detail = nlohmann::json::array();  // node, metric, seconds after onset
};

Verdict judge(const Scenario& sc, const std::vector<Alert>& alerts) {
  Verdict v;
  std::string target = sc.machine >= 0 ? "m" + std::to_string(sc.machine) : "";
  bool found = false;
  for (const Alert& a : alerts) {
    double ts = static_cast<double>(a.ts_ns) / 1e9;
    if (!target.empty() && a.node == target && ts >= sc.onset_s) {
      if (!found) {
        found = true;
        v.latency = ts - sc.onset_s;
        v.metric = a.metric;
      }
    } else {
      ++v.false_alerts;
      v.false_detail.push_back({{"node", a.node},
                                {"metric", a.metric},
                                {"kind", a.kind},
                                {"after_onset_s", sc.onset_s > 0 ? ts - sc.onset_s : 0.0}});
    }
  }
  if (sc.fault == Fault::none)
    v.outcome = v.false_alerts ? "fp" : "tn";
  else
    v.outcome = found ? "tp" : "fn";
  return v;
}

std::vector<Alert> detect(const std::string& csv, const DetectorConfig& config) {
  ballast::machine::MetricsTable table;
  std::string error;
  if (!ballast::machine::read_metrics_csv(csv, &table, &error)) {
    std::fprintf(stderr, "bench_detect: %s\n", error.c_str());
    return {};
  }
  Detector d(config);
  return ballast::machine::replay(table, &d);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  double idx = p * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(idx);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

void report(const std::string& cs, const std::vector<Scenario>& scenarios, const DetectorConfig& config,
            bool per_scenario) {
  Score s;
  for (const Scenario& sc : scenarios) {
    Verdict v = judge(sc, detect(sc.csv, config));
    s.fp += v.false_alerts;
    if (sc.fault == Fault::none) {
      ++s.clean_runs;
      s.clean_with_alert += v.false_alerts > 0;
    } else if (v.outcome == "tp") {
      ++s.tp;
      s.latency.push_back(v.latency);
    } else {
      ++s.fn;
    }
    if (per_scenario) {
      nlohmann::json j = {{"bench", "detect"},
                          {"case", cs + "/scenario"},
                          {"scenario", sc.index},
                          {"fault", fault_name(sc.fault)},
                          {"machine", sc.machine},
                          {"outcome", v.outcome},
                          {"latency_s", v.latency >= 0 ? nlohmann::json(v.latency) : nlohmann::json()},
                          {"alert_metric", v.metric},
                          {"false_alerts", v.false_alerts},
                          {"false_alert_detail", v.false_detail},
                          {"steps_per_s_before", sc.steps_per_s_before},
                          {"steps_per_s_after", sc.steps_per_s_after},
                          {"csv", sc.csv}};
      std::printf("%s\n", j.dump().c_str());
    }
  }
  double precision = s.tp + s.fp ? static_cast<double>(s.tp) / (s.tp + s.fp) : 0;
  double recall = s.tp + s.fn ? static_cast<double>(s.tp) / (s.tp + s.fn) : 0;
  double f1 = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
  double mean = 0;
  for (double l : s.latency) mean += l;
  mean = s.latency.empty() ? NAN : mean / static_cast<double>(s.latency.size());
  nlohmann::json counts = {{"tp", s.tp}, {"fp", s.fp}, {"fn", s.fn}, {"faulty", s.tp + s.fn}, {"clean", s.clean_runs}};
  emit(cs, "precision", precision, "", counts);
  emit(cs, "recall", recall, "");
  emit(cs, "f1", f1, "");
  emit(cs, "clean_runs_with_alert", s.clean_with_alert, "runs", {{"clean", s.clean_runs}});
  emit(cs, "latency_mean", mean, "s", {{"peer", "Minder (published)"}, {"peer_value", 3.6}});
  emit(cs, "latency_p50", percentile(s.latency, 0.5), "s");
  emit(cs, "latency_p90", percentile(s.latency, 0.9), "s");
  emit(cs, "latency_max", s.latency.empty() ? NAN : *std::max_element(s.latency.begin(), s.latency.end()), "s");
  emit(cs, "latency_min", s.latency.empty() ? NAN : *std::min_element(s.latency.begin(), s.latency.end()), "s");
}

// The detector as shipped, and an ablation: no denoising window (one
// sample) and no continuity, to show what those two buy.
void report_all(const std::vector<Scenario>& scenarios, const DetectorConfig& config) {
  report("detector", scenarios, config, true);
  DetectorConfig raw = config;
  raw.window_s = 0.5;
  raw.continuity = 1;
  report("ablation_no_window_no_continuity", scenarios, raw, false);
}

// ---- cost at scale ---------------------------------------------------------

double thread_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

void cost_case(int machines, int metrics, int rounds) {
  DetectorConfig c;
  c.metrics = {"*"};
  Detector d(c);
  std::vector<std::string> nodes, names;
  for (int i = 0; i < machines; ++i) nodes.push_back("node" + std::to_string(i));
  for (int m = 0; m < metrics; ++m) names.push_back("metric." + std::to_string(m));
  std::mt19937 rng(1);
  std::normal_distribution<double> noise(0, 1);
  std::vector<Alert> alerts;
  std::vector<double> add_ms, eval_ms;
  const int64_t sec = 1000000000;
  for (int r = 0; r < rounds + 4; ++r) {
    double t0 = thread_cpu_ms();
    for (int i = 0; i < machines; ++i)
      for (int m = 0; m < metrics; ++m) d.add(nodes[i], names[m], r * sec, 50 + noise(rng), 0);
    double t1 = thread_cpu_ms();
    d.evaluate(r * sec + 1, &alerts);
    double t2 = thread_cpu_ms();
    if (r >= 4) {  // windows full
      add_ms.push_back(t1 - t0);
      eval_ms.push_back(t2 - t1);
    }
  }
  std::vector<double> total;
  for (size_t i = 0; i < add_ms.size(); ++i) total.push_back(add_ms[i] + eval_ms[i]);
  nlohmann::json x = {{"machines", machines}, {"metrics", metrics}, {"rounds", rounds}};
  std::string cs = "cost_" + std::to_string(machines) + "x" + std::to_string(metrics);
  emit(cs, "cpu_per_period_median", percentile(total, 0.5), "ms", x);
  emit(cs, "evaluate_cpu_median", percentile(eval_ms, 0.5), "ms", x);
  emit(cs, "ingest_cpu_median", percentile(add_ms, 0.5), "ms", x);
  emit(cs, "work_per_period", static_cast<double>(d.work()) / (rounds + 4), "steps", x);
}

// ---- main -----------------------------------------------------------------

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

bool load_config(const char* path, DetectorConfig* config) {
  if (!path) return true;
  std::string error;
  if (!ballast::machine::load_config_file(path, config, &error)) {
    std::fprintf(stderr, "bench_detect: %s\n", error.c_str());
    return false;
  }
  return true;
}

Fault fault_from(const std::string& name) {
  for (Fault f : {Fault::none, Fault::cpu_hog, Fault::cpu_throttle, Fault::sigstop, Fault::memory, Fault::disk_io,
                  Fault::net_throttle})
    if (name == fault_name(f)) return f;
  return Fault::none;
}

int replay_main(const std::string& dir, const DetectorConfig& config) {
  std::ifstream in(dir + "/scenarios.jsonl");
  if (!in) {
    std::fprintf(stderr, "bench_detect: %s/scenarios.jsonl: cannot open\n", dir.c_str());
    return 1;
  }
  std::vector<Scenario> scenarios;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    Scenario sc{j["scenario"].get<int>(), fault_from(j["fault"].get<std::string>()), j["machine"].get<int>(),
                j["onset"].get<double>(), j["csv"].get<std::string>()};
    sc.steps_per_s_before = j.value("steps_per_s_before", 0.0);
    sc.steps_per_s_after = j.value("steps_per_s_after", 0.0);
    scenarios.push_back(sc);
  }
  report_all(scenarios, config);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (has(argc, argv, "--help") || has(argc, argv, "-h")) {
    std::fputs(
        "usage: bench_detect [--quick] [--faulty N] [--clean N] [--seconds S] [--out DIR]\n"
        "       bench_detect --replay DIR [--config FILE.lua]   re-score recorded scenarios\n"
        "       bench_detect --cost                              the synthetic-load case only\n"
        "Real faults injected into an emulated job (root: cgroups, network namespaces);\n"
        "JSON lines on stdout. See docs/benchmarks.md, section detect.\n",
        stdout);
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--worker") == 0) return worker_main(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "--hog") == 0) return hog_main(argc, argv);
  DetectorConfig config;
  if (!load_config(flag(argc, argv, "--config"), &config)) return 1;
  if (const char* dir = flag(argc, argv, "--replay")) return replay_main(dir, config);
  bool quick = has(argc, argv, "--quick");
  cost_case(1000, 20, quick ? 3 : 10);
  cost_case(10000, 20, quick ? 3 : 10);
  if (has(argc, argv, "--cost")) return 0;

  if (geteuid() != 0) {
    std::fprintf(stderr, "bench_detect: needs root (cgroups, network namespaces); run the cost case with --cost\n");
    return 77;
  }
  Capabilities caps = probe();
  std::string missing;
  std::vector<Fault> faults = available_faults(caps, &missing);
  int n_faulty = flag(argc, argv, "--faulty") ? std::atoi(flag(argc, argv, "--faulty"))
                                              : (quick ? static_cast<int>(faults.size()) : 54);
  int n_clean = flag(argc, argv, "--clean") ? std::atoi(flag(argc, argv, "--clean")) : (quick ? 2 : 20);
  double seconds = flag(argc, argv, "--seconds") ? std::atof(flag(argc, argv, "--seconds")) : (quick ? 14 : 18);
  std::string dir = flag(argc, argv, "--out") ? flag(argc, argv, "--out") : "bench-detect-out";
  mkdir(dir.c_str(), 0755);
  nlohmann::json env = {{"bench", "detect"},           {"case", "environment"},
                        {"cgroup_v2", caps.cgroup_v2}, {"cgroup_v1_cpu", caps.cgroup_v1_cpu},
                        {"netns", caps.netns},         {"tbf", caps.tbf},
                        {"netem", caps.netem},         {"faults_not_injected", missing},
                        {"notes", caps.notes}};
  std::printf("%s\n", env.dump().c_str());

  JobOptions jo;
  jo.self_exe = "/proc/self/exe";
  char exe[4096] = {};
  if (readlink("/proc/self/exe", exe, sizeof exe - 1) > 0) jo.self_exe = exe;
  Job job(jo, caps);
  std::string error;
  if (!job.setup(&error)) {
    std::fprintf(stderr, "bench_detect: %s\n", error.c_str());
    return 1;
  }
  signal(SIGINT, [](int) { g_stop = 1; });
  signal(SIGTERM, [](int) { g_stop = 1; });
  std::mt19937 rng(2026);
  std::vector<Scenario> plan;
  for (int i = 0; i < n_faulty + n_clean; ++i) {
    Scenario sc{};
    sc.index = i;
    // Faulty and clean runs interleaved so that a change in the machine's
    // background load hits both alike.
    bool clean = n_clean > 0 && (i % ((n_faulty + n_clean) / n_clean) == 0) &&
                 static_cast<int>(std::count_if(plan.begin(), plan.end(),
                                                [](const Scenario& s) { return s.fault == Fault::none; })) < n_clean;
    int faulty_so_far = static_cast<int>(plan.size()) -
                        static_cast<int>(std::count_if(plan.begin(), plan.end(),
                                                       [](const Scenario& s) { return s.fault == Fault::none; }));
    if (faulty_so_far >= n_faulty) clean = true;
    sc.fault = clean ? Fault::none : faults[static_cast<size_t>(faulty_so_far) % faults.size()];
    sc.machine = clean ? -1 : static_cast<int>(rng() % static_cast<unsigned>(jo.machines));
    char name[64];
    std::snprintf(name, sizeof name, "/s%02d-%s.csv.gz", i, fault_name(sc.fault));
    sc.csv = dir + name;
    plan.push_back(sc);
  }
  std::ofstream labels(dir + "/scenarios.jsonl");
  std::vector<Scenario> done;
  std::uniform_real_distribution<double> onset(seconds * 0.4, seconds * 0.55);
  for (Scenario& sc : plan) {
    if (g_stop) break;
    double at = onset(rng);
    if (!run_scenario(job, sc, seconds, at, &error)) {
      std::fprintf(stderr, "bench_detect: scenario %d (%s): %s\n", sc.index, fault_name(sc.fault), error.c_str());
      job.stop();
      continue;
    }
    nlohmann::json j = {{"scenario", sc.index},
                        {"fault", fault_name(sc.fault)},
                        {"machine", sc.machine},
                        {"onset", sc.onset_s},
                        {"csv", sc.csv},
                        {"steps_per_s_before", sc.steps_per_s_before},
                        {"steps_per_s_after", sc.steps_per_s_after}};
    labels << j.dump() << "\n" << std::flush;
    done.push_back(sc);
    std::fprintf(stderr, "scenario %d/%zu %s on m%d done\n", sc.index + 1, plan.size(), fault_name(sc.fault),
                 sc.machine);
  }
  report_all(done, config);
  return 0;
}
