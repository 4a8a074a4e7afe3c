// The suspect fusion on a small lock-step job, fed by the real detectors:
// the machine detector on the machines' metrics and the straggler analysis
// on the ranks' step timings, as their plugins publish them. 8 machines x 4
// ranks; 4 s steps (2.8 s compute, 1.2 s all-reduce); 1 s sampling.
#include <doctest/doctest.h>

#include "detector.hpp"
#include "fusion.hpp"
#include "online.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kMachines = 8, kRanksPerMachine = 4, kSteps = 40;
constexpr int64_t kSec = 1000000000;

enum class Fault { none, slow_gpu, slow_network };

struct Step {
  double start, compute, comm;  // the job's compute phase, then its all-reduce
};

// From step 20 on: slow_gpu makes machine m5's GPU 1 (rank 21) compute at
// 60% of its clock (compute 1.6x longer, the other ranks wait for it);
// slow_network makes every third step's all-reduce 3x longer for every rank
// (a congested fabric: no machine to blame).
std::vector<Step> timeline(Fault fault) {
  std::vector<Step> steps;
  double t = 0;
  for (int k = 0; k < kSteps; ++k) {
    bool after = k >= 20;
    bool congested = after && fault == Fault::slow_network && k % 3 == 0;
    Step s{t, 2.8 * (after && fault == Fault::slow_gpu ? 1.6 : 1), 1.2 * (congested ? 3 : 1)};
    steps.push_back(s);
    t += s.compute + s.comm;
  }
  return steps;
}

const Step& step_at(const std::vector<Step>& steps, double t) {
  auto it = std::upper_bound(steps.begin(), steps.end(), t, [](double x, const Step& s) { return x < s.start; });
  return it == steps.begin() ? steps.front() : *(it - 1);
}

struct Run {
  std::vector<ballast::fusion::Suspect> ranking;
  size_t machine_alerts = 0, worker_reports = 0, other_reports = 0;
};

Run run(Fault fault) {
  std::vector<Step> steps = timeline(fault);
  double onset = steps[20].start;
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0, 1);
  std::uniform_real_distribution<double> u(0, 1);
  ballast::fusion::Fusion fusion(ballast::fusion::FusionConfig{});
  std::vector<std::pair<std::string, int32_t>> placement;
  for (int m = 0; m < kMachines; ++m) placement.emplace_back("m" + std::to_string(m), m * kRanksPerMachine);
  fusion.set_placement(placement);
  Run out;

  // The machine detector, one evaluation per sampling round.
  ballast::machine::Detector detector(ballast::machine::DetectorConfig{});
  double end = steps.back().start + steps.back().compute + steps.back().comm;
  std::vector<ballast::machine::Alert> alerts;
  for (int t = 1; t < end; ++t) {
    const Step& s = step_at(steps, t);
    bool computing = t - s.start < s.compute;
    for (int m = 0; m < kMachines; ++m) {
      double clock = m == 5 && fault == Fault::slow_gpu && t >= onset ? 1190 : 1980;
      int64_t ts = static_cast<int64_t>((t + 0.01 * m) * 1e9);
      detector.add("m" + std::to_string(m), "gpu1.sm_clock", ts, clock + 5 * noise(rng), 0);
      detector.add("m" + std::to_string(m), "gpu1.util", ts, (computing ? 95 : 60) + 3 * noise(rng), 0);
    }
    detector.evaluate(static_cast<int64_t>((t + 0.1) * 1e9), &alerts);
  }
  // The straggler analysis on the ranks' step timings, step by step.
  ballast::straggler::OnlineConfig config;
  config.window_steps = 10;
  config.report_every = 5;
  ballast::straggler::OnlineDetector straggler(config);
  struct Report {
    int64_t at;
    ballast::straggler::WhatIfResult result;
  };
  std::vector<Report> reports;
  for (int k = 0; k < kSteps; ++k) {
    const Step& s = steps[static_cast<size_t>(k)];
    std::vector<ballast_op_timing> ops;
    for (int r = 0; r < kMachines * kRanksPerMachine; ++r) {
      bool slow = r == 21 && fault == Fault::slow_gpu && k >= 20;
      double base = k >= 20 && fault == Fault::slow_gpu ? s.compute / 1.6 : s.compute;
      double busy = slow ? s.compute : base * (1 - 0.08 * u(rng));  // sequence lengths differ
      double done = s.start + s.compute + s.comm;
      ops.push_back({r, 0, r, k, "forward-compute", s.start, busy / 3, 0, -1, 0, -1});
      ops.push_back({r, 0, r, k, "backward-compute", s.start + busy / 3, busy * 2 / 3, 0, -1, 0, -1});
      ops.push_back(
          {r, 0, r, k, "separate-grads-all-reduce", s.start + busy, done - 0.02 - (s.start + busy), 0, -1, -1, -1});
      ops.push_back({r, 0, r, k, "optimizer", done - 0.02, 0.02, 0, -1, -1, -1});
    }
    straggler.add(ops.data(), ops.size());
    if (auto result = straggler.poll())
      reports.push_back({static_cast<int64_t>((s.start + s.compute + s.comm) * 1e9), std::move(*result)});
  }
  // Both detectors' verdicts, in time order, as the fusion plugin receives them.
  size_t a = 0, r = 0;
  while (a < alerts.size() || r < reports.size()) {
    if (a < alerts.size() && (r >= reports.size() || alerts[a].ts_ns <= reports[r].at)) {
      const auto& x = alerts[a++];
      ballast::fusion::Suspicion s;
      s.detector = "machine";
      s.subject = x.node;
      s.kind = x.kind;
      s.metric = x.metric;
      s.score = x.score;
      s.confidence = std::min(1.0, x.score / (2 * detector.config().threshold));
      s.since_ns = x.since_ns;
      s.at_ns = x.ts_ns;
      fusion.add(std::move(s));
      ++out.machine_alerts;
    } else {
      const auto& x = reports[r++];
      (x.result.kind == "worker" ? out.worker_reports : out.other_reports)++;
      for (size_t i = 0; i < x.result.mw_ranks.size() && i < x.result.by_rank.size(); ++i)
        fusion.add_straggler(std::stoi(x.result.by_rank[i].name), x.result.kind, x.result.by_rank[i].slowdown,
                             x.result.slowdown, x.at, "{}");
    }
  }
  out.ranking = fusion.ranking(static_cast<int64_t>(end * 1e9));
  return out;
}

}  // namespace

TEST_CASE("a slow GPU: both detectors name its machine, which the fusion ranks first and alone alerting") {
  Run r = run(Fault::slow_gpu);
  CHECK(r.machine_alerts == 1);
  CHECK(r.worker_reports >= 1);
  REQUIRE_FALSE(r.ranking.empty());
  CHECK(r.ranking[0].node == "m5");
  CHECK(r.ranking[0].alerting);
  REQUIRE(r.ranking[0].evidence.size() == 2);  // the machine detector's and the straggler analysis'
  for (size_t i = 1; i < r.ranking.size(); ++i) CHECK_FALSE(r.ranking[i].alerting);
}

TEST_CASE("a job-wide all-reduce slowdown: the straggler analysis reports it, the fusion suspects no one") {
  Run r = run(Fault::slow_network);
  CHECK(r.machine_alerts == 0);
  CHECK(r.other_reports >= 1);  // slowed, but no worker to blame
  CHECK(r.worker_reports == 0);
  CHECK(r.ranking.empty());
}

TEST_CASE("a fault-free job: no suspect") {
  Run r = run(Fault::none);
  CHECK(r.machine_alerts == 0);
  CHECK(r.worker_reports == 0);
  for (const auto& s : r.ranking) CHECK_FALSE(s.alerting);
}
