// The what-if analysis reproduces the reference results of the artifact
// (arXiv 2505.05713) on its two real traces: S and every stage's and op
// type's attributed slowdown within 1%, M_W and M_S within 2%.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <random>

#include "data.hpp"
#include "replay.hpp"
#include "whatif.hpp"

using namespace ballast::straggler;
using straggler_test::data;

namespace {

nlohmann::json load(const std::string& trace, const std::string& file) {
  std::ifstream in(data(trace, file));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

bool within(double actual, double expected, double rel) {
  return std::fabs(actual - expected) <= rel * std::fabs(expected);
}

double find(const std::vector<Attribution>& v, const std::string& name) {
  for (const Attribution& a : v) {
    if (a.name == name) return a.slowdown;
  }
  FAIL("no attribution for " << name);
  return 0;
}

void check_against_reference(const std::string& name) {
  Trace trace = read_trace(data(name, "trace.csv.gz"));
  Meta meta = read_meta(data(name, "meta.yaml"));
  WhatIfResult r = analyze(trace, meta);
  nlohmann::json expected = load(name, "expected-result.json");
  nlohmann::json mw = load(name, "expected-mw.json");
  nlohmann::json ms = load(name, "expected-ms.json");

  CHECK(within(r.slowdown, expected["blocking_slowdown"].get<double>(), 0.01));
  CHECK(within(r.launch_slowdown, expected["launch_slowdown"].get<double>(), 0.01));
  for (auto& [stage, v] : expected["blocking_decompose_by_stage"].items()) {
    CAPTURE(stage);
    CHECK(within(find(r.by_stage, stage), v.get<double>(), 0.01));
  }
  for (auto& [optype, v] : expected["blocking_decompose_by_optype"].items()) {
    CAPTURE(optype);
    CHECK(within(find(r.by_optype, optype), v.get<double>(), 0.01));
  }
  for (auto& [dp, v] : expected["blocking_decompose_by_dp_rank"].items()) {
    CAPTURE(dp);
    CHECK(within(find(r.by_dp_rank, dp), v.get<double>(), 0.01));
  }
  CHECK(r.by_stage.size() == expected["blocking_decompose_by_stage"].size());
  CHECK(r.by_optype.size() == expected["blocking_decompose_by_optype"].size());
  CHECK(r.by_dp_rank.size() == expected["blocking_decompose_by_dp_rank"].size());

  CHECK(within(r.mw.removed, mw["Mw"].get<double>(), 0.02));
  CHECK(within(r.mw.added, mw["add"].get<double>(), 0.02));
  CHECK(within(r.ms.removed, ms["Ms"].get<double>(), 0.02));
  CHECK(within(r.ms.added, ms["add"].get<double>(), 0.02));
  CHECK(within(r.mw.t_removed, mw["trem"].get<double>(), 0.01));
  CHECK(within(r.ms.t_removed, ms["trem"].get<double>(), 0.01));

  // Per step: the recorded, the no-delay and the ideal step times.
  REQUIRE(r.steps.size() == expected["step_t_base"].size());
  for (size_t i = 0; i < r.steps.size(); ++i) {
    std::string step = std::to_string(r.steps[i]);
    CAPTURE(step);
    CHECK(within(r.t_base[i], expected["step_t_base"][step].get<double>(), 0.01));
    CHECK(within(r.t_nodelay[i], expected["step_t_nodelay"][step].get<double>(), 0.01));
    CHECK(within(r.t_ideal[i], expected["step_t_noblk"][step].get<double>(), 0.01));
  }
  // Replaying the recorded durations and launch delays gives the recorded run back.
  CHECK(r.replay_error < 1e-3);
}

// A consistent synthetic trace on ST's schedule: every op takes its type's
// mean duration (communication its shortest, as pure transfer), times
// slow(row, lane) for compute ops, replayed on the dependency graph so that
// waits and timestamps are what a real run would record.
template <class Slow>
Trace synthetic(const Trace& base, const Meta& meta, Slow slow) {
  Model m = build_model(base, meta);
  Replay replay(m);
  const size_t lanes = m.lanes();
  std::map<OpType, std::pair<double, double>> sum;
  std::map<OpType, double> shortest;
  for (const TraceRow& r : base.rows) {
    sum[r.optype].first += r.duration;
    sum[r.optype].second += 1;
    if (!shortest.count(r.optype) || r.duration < shortest[r.optype]) shortest[r.optype] = r.duration;
  }
  std::vector<double> cost(replay.size()), start(replay.size()), end(replay.size());
  for (size_t op = 0; op < m.ops.size(); ++op) {
    for (size_t l = 0; l < lanes; ++l) {
      const TraceRow& r = base.rows[m.row[op * lanes + l]];
      double mean = sum[r.optype].first / sum[r.optype].second;
      double c = m.ops[op].group >= 0 ? shortest[r.optype] : mean;
      if (is_compute_kernel(r.optype)) c *= slow(r, l);
      cost[replay.index(op, l)] = c;
    }
  }
  replay.run(cost.data(), nullptr, start.data(), end.data());
  Trace t;
  t.source = "synthetic";
  for (size_t op = 0; op < m.ops.size(); ++op) {
    for (size_t l = 0; l < lanes; ++l) {
      TraceRow r = base.rows[m.row[op * lanes + l]];
      size_t i = replay.index(op, l);
      r.start = start[i];
      r.duration = end[i] - start[i];
      t.rows.push_back(r);
    }
  }
  return t;
}

}  // namespace

TEST_CASE("AR: one slow worker, S = 1.973, M_W = 100%") {
  check_against_reference("AR");
  WhatIfResult r = analyze(read_trace(data("AR", "trace.csv.gz")), read_meta(data("AR", "meta.yaml")));
  CHECK(r.kind == "worker");
  CHECK(r.mw_ranks == std::vector<int32_t>{0});
  CHECK(r.by_rank.front().name == "0");
  CHECK(r.ranks == 16);
}

TEST_CASE("ST: long last stage, S = 1.179, M_S = 122%") {
  check_against_reference("ST");
  WhatIfResult r = analyze(read_trace(data("ST", "trace.csv.gz")), read_meta(data("ST", "meta.yaml")));
  CHECK(r.kind == "stage");
  CHECK(r.by_stage.front().name == "3");
}

TEST_CASE("without meta.yaml the sizes come from the trace") {
  WhatIfResult r = analyze(read_trace(data("ST", "trace.csv.gz")), Meta{});
  CHECK(r.dp == 2);
  CHECK(r.pp == 4);
  CHECK(within(r.slowdown, 1.1787021836556841, 0.01));
}

TEST_CASE("the kind follows M_W, then M_S, at half the slowdown") {
  WhatIfOptions o;
  CHECK(classify_kind(1.01, 0.9, 0.9, o) == "none");
  CHECK(classify_kind(1.5, 0.6, 0.9, o) == "worker");
  CHECK(classify_kind(1.5, 0.4, 0.5, o) == "stage");
  CHECK(classify_kind(1.5, 0.4, 0.3, o) == "random");
}

TEST_CASE("synthetic runs: no straggler, sequence-length imbalance, one slow worker") {
  const Trace st = read_trace(data("ST", "trace.csv.gz"));
  const Meta meta = read_meta(data("ST", "meta.yaml"));

  // Every op at its type's mean: the ideal run is the run.
  WhatIfResult even = analyze(synthetic(st, meta, [](const TraceRow&, size_t) { return 1.0; }), meta);
  CHECK(even.slowdown == doctest::Approx(1.0).epsilon(1e-9));
  CHECK(even.kind == "none");
  CHECK(even.mw.removed == 0);
  CHECK(even.replay_error < 1e-9);

  // Each micro-batch of each DP rank and step takes a random 1x..1.8x
  // (sequence lengths): the slowdown moves around, no rank or stage owns it.
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> length(1.0, 1.8);
  std::map<std::pair<size_t, int>, double> factor;
  auto sequences = [&](const TraceRow& r, size_t lane) {
    auto key = std::make_pair(lane, r.mb_id);
    if (!factor.count(key)) factor[key] = length(rng);
    return factor[key];
  };
  WhatIfResult random = analyze(synthetic(st, meta, sequences), meta);
  CAPTURE(random.mw.removed);
  CAPTURE(random.ms.removed);
  CHECK(random.slowdown > 1.03);
  CHECK(random.kind == "random");

  // Rank 5 (dp_rank 1, stage 2) computes 1.5x slower in every step.
  WhatIfResult worker =
      analyze(synthetic(st, meta, [](const TraceRow& r, size_t) { return r.rank == 5 ? 1.5 : 1.0; }), meta);
  CHECK(worker.slowdown > 1.03);  // the ideal means include the slow rank
  CHECK(worker.kind == "worker");
  CHECK(worker.mw_ranks == std::vector<int32_t>{5});
  CHECK(worker.by_stage.front().name == "2");
  CHECK(worker.by_dp_rank.front().name == "1");
}
