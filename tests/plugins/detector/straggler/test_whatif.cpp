// The what-if analysis reproduces the reference results of the artifact
// (arXiv 2505.05713) on its two real traces: S and every stage's and op
// type's attributed slowdown within 1%, M_W and M_S within 2%.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "data.hpp"
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
