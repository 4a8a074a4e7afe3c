// The online straggler analysis fed what a trainer's step timer produces
// (python/ballast/timer.py): per-step phases (forward, backward, the
// gradients' all-reduce, the optimizer) or the same per micro-batch, in the
// names the timer uses or the usual short words; whole-step rows are counted,
// not analysed. A data-parallel job of 4 ranks in lock-step: the all-reduce
// ends together on every rank, so a slowed rank's compute shows as the
// others' wait.
#include <doctest/doctest.h>

#include "online.hpp"

#include <string>
#include <vector>

using namespace ballast::straggler;

namespace {

struct Names {
  const char* forward;
  const char* backward;
  const char* allreduce;
  const char* optimizer;
};

// Steps 1..steps of `ranks` ranks, `micro` micro-batches each; rank `slow`
// computes `factor` times slower. Rows of one rank per batch, as the timer
// sends them.
std::vector<std::vector<ballast_op_timing>> job(int ranks, int steps, int micro, int slow, double factor, Names n) {
  std::vector<std::vector<ballast_op_timing>> batches;
  double t = 1000;
  for (int step = 1; step <= steps; ++step) {
    std::vector<std::vector<ballast_op_timing>> rows(static_cast<size_t>(ranks));
    std::vector<double> end_compute(static_cast<size_t>(ranks), 0.0);
    for (int r = 0; r < ranks; ++r) {
      double s = t;
      const double f = r == slow ? factor : 1.0;
      for (int mb = 0; mb < micro; ++mb) {
        const int32_t mb_id = micro > 1 ? mb : -1;
        rows[size_t(r)].push_back({r, 0, r, step, n.forward, s, 0.010 * f, mb, -1, mb_id, -1});
        s += 0.010 * f;
        rows[size_t(r)].push_back({r, 0, r, step, n.backward, s, 0.020 * f, mb, -1, mb_id, -1});
        s += 0.020 * f;
      }
      end_compute[size_t(r)] = s;
    }
    double all_in = 0;
    for (double e : end_compute) all_in = std::max(all_in, e);
    for (int r = 0; r < ranks; ++r) {
      const double s = end_compute[size_t(r)];
      rows[size_t(r)].push_back({r, 0, r, step, n.allreduce, s, all_in + 0.004 - s, 0, -1, -1, -1});
      rows[size_t(r)].push_back({r, 0, r, step, n.optimizer, all_in + 0.004, 0.002, 0, -1, -1, -1});
      batches.push_back(rows[size_t(r)]);
    }
    t = all_in + 0.01;
  }
  return batches;
}

std::optional<WhatIfResult> last_report(OnlineDetector& d, const std::vector<std::vector<ballast_op_timing>>& batches) {
  std::optional<WhatIfResult> last;
  for (const auto& b : batches) {
    d.add(b.data(), b.size());
    if (auto r = d.poll()) last = r;
  }
  return last;
}

const Names kTimer{"forward-compute", "backward-compute", "separate-grads-all-reduce", "optimizer"};
const Names kShort{"forward", "backward", "allreduce", "optim"};

}  // namespace

TEST_CASE("per-step phases from a step timer: the slowed rank is named, as a worker straggler") {
  for (const Names& names : {kTimer, kShort}) {
    INFO("names " << names.forward);
    OnlineDetector d({20, 10, 1.03, {}});
    const auto r = last_report(d, job(4, 40, 1, 2, 3.0, names));
    REQUIRE(r);
    CHECK(d.counters().rejected == 0);
    CHECK(r->slowdown > 1.5);
    REQUIRE(!r->by_rank.empty());
    CHECK(r->by_rank[0].name == "2");
    CHECK(r->by_dp_rank[0].name == "2");
    CHECK(r->kind == "worker");
    CHECK(r->by_optype[0].name == "backward-compute");  // the longer of the slowed phases
  }
}

TEST_CASE("per-micro-batch phases: the slowed rank is named") {
  OnlineDetector d({20, 10, 1.03, {}});
  const auto r = last_report(d, job(4, 40, 3, 1, 2.0, kTimer));
  REQUIRE(r);
  CHECK(r->by_rank[0].name == "1");
  CHECK(r->kind == "worker");
  CHECK(r->ops_per_step == 3 * 2 + 2);
}

TEST_CASE("a healthy lock-step job is not reported") {
  OnlineDetector d({20, 10, 1.03, {}});
  CHECK_FALSE(last_report(d, job(4, 40, 2, -1, 1.0, kTimer)));
  CHECK(d.counters().analyses >= 3);
  CHECK(d.counters().failures == 0);
}

TEST_CASE("whole-step rows are counted and not analysed; unknown phase names are rejected") {
  OnlineDetector d({20, 10, 1.03, {}});
  std::vector<ballast_op_timing> rows;
  for (int step = 1; step <= 30; ++step)
    for (int r = 0; r < 4; ++r)
      rows.push_back({r, 0, r, step, "step", 1000.0 + step, r == 2 ? 3.0 : 1.0, 0, -1, -1, -1});
  d.add(rows.data(), rows.size());
  CHECK_FALSE(d.poll());
  CHECK(d.counters().step_rows == 120);
  CHECK(d.counters().ops == 0);
  const ballast_op_timing data_wait{0, 0, 0, 1, "dataloader", 1000.0, 0.1, 0, -1, -1, -1};
  d.add(&data_wait, 1);
  CHECK(d.counters().rejected == 1);
  CHECK(timer_optype("grad-sync") == OpType::separate_grads_all_reduce);
  CHECK_FALSE(timer_optype("gradsync"));
}

TEST_CASE("a job restarted from a checkpoint reports steps again: the old attempt's rows give way") {
  OnlineDetector d({20, 10, 1.03, {}});
  auto first = job(4, 30, 1, 2, 3.0, kTimer);
  auto again = job(4, 40, 1, 2, 3.0, kTimer);
  again.erase(again.begin(), again.begin() + 4 * 20);  // resumed after step 20
  for (auto& b : again)
    for (auto& o : b) o.start_s += 500;  // later on the clock
  first.insert(first.end(), again.begin(), again.end());
  const auto r = last_report(d, first);
  CHECK(d.counters().restarts == 4);
  CHECK(d.counters().failures == 0);
  REQUIRE(r);
  CHECK(r->by_rank[0].name == "2");
  CHECK(r->steps.back() >= 30);
}
