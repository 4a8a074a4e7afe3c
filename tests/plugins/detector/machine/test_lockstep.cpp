// A lock-step job in which one machine stalls: its peers wait at the barrier,
// so their metrics shift too (they poll more, their CPU pressure collapses
// and then wanders). Only the stalled machine is a fault. The figures follow
// what bench/detect records on real processes (5 machines, 1 s sampling).
#include <doctest/doctest.h>

#include "detector.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

using ballast::machine::Alert;
using ballast::machine::Detector;
using ballast::machine::DetectorConfig;

namespace {

constexpr int64_t kSec = 1000000000;
constexpr int kNodes = 5;

struct Round {
  double ctxt[kNodes];       // proc.ctxt_voluntary, wake-ups/s
  double pressure[kNodes];   // cgroup.cpu.pressure, share of time
  double throttled[kNodes];  // cgroup.cpu.throttled, share of time
};

struct LockStep {
  std::mt19937 rng{7};
  std::normal_distribution<double> noise{0.0, 1.0};
  int stalled = -1;    // the machine whose workers are stopped
  bool pause = false;  // every machine waits (a checkpoint written to slow storage)

  // Running: every worker computes, then polls for the release; the VM's
  // CPUs are contended, so the pressure is high everywhere. Stalled: the
  // stopped machine neither wakes nor runs; the others poll all the time.
  Round next() {
    Round r{};
    for (int i = 0; i < kNodes; ++i) {
      if (stalled < 0 && !pause) {
        r.ctxt[i] = 30 + 5 * noise(rng);
        r.pressure[i] = 0.7 + 0.05 * noise(rng);
      } else if (i == stalled) {
        r.ctxt[i] = 0;
        r.pressure[i] = 0;
      } else {
        r.ctxt[i] = 190 + 5 * noise(rng);
        r.pressure[i] = 0.015 + 0.003 * noise(rng);
      }
    }
    return r;
  }
};

std::string name(int i) { return "m" + std::to_string(i); }

void feed(Detector& d, int t, const Round& r, std::vector<Alert>* alerts) {
  for (int i = 0; i < kNodes; ++i) {
    int64_t ts = t * kSec + i * 1000000;
    d.add(name(i), "proc.ctxt_voluntary", ts, r.ctxt[i], 0);
    d.add(name(i), "cgroup.cpu.pressure", ts, r.pressure[i], 0);
    d.add(name(i), "cgroup.cpu.throttled", ts, r.throttled[i], 0);
  }
  d.evaluate(t * kSec + 10000000, alerts);
}

}  // namespace

TEST_CASE("lock-step job: only the stalled machine is alerted, not its waiting peers") {
  Detector d(DetectorConfig{});
  LockStep job;
  std::vector<Alert> alerts;
  for (int t = 0; t < 20; ++t) feed(d, t, job.next(), &alerts);
  REQUIRE(alerts.empty());
  job.stalled = 2;
  for (int t = 20; t < 60; ++t) {
    Round r = job.next();
    // While the job collapses to waiting, one waiting peer keeps a little
    // more CPU pressure than the others for a few seconds (0.09 against
    // 0.015: more than cgroup.cpu.pressure's minimum deviation of 0.05) ...
    if (t < 25) r.pressure[3] = 0.09;
    // ... and later another one is scheduled worse than its peers for ten
    // seconds (0.2 against 0.04), long after the job's level fell. (m2's
    // own pressure, 0, is 0.04 below: less than the minimum deviation.)
    if (t >= 40 && t < 50) {
      for (int i = 0; i < kNodes; ++i)
        if (i != 2) r.pressure[i] = 0.04 + 0.005 * job.noise(job.rng);
      r.pressure[0] = 0.2;
    }
    feed(d, t, r, &alerts);
  }
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].node == "m2");
  CHECK(alerts[0].metric == "proc.ctxt_voluntary");
  CHECK(alerts[0].ts_ns < 23 * kSec);  // within 3 s of the stall
  // m0 was an outlier (pressure) while m2 was the culprit: held, not alerted.
  CHECK(d.counters().held > 0);
}

TEST_CASE("with hold_peers off, the waiting peer is alerted too (what the rule prevents)") {
  DetectorConfig c;
  c.hold_peers = false;
  Detector d(c);
  LockStep job;
  std::vector<Alert> alerts;
  for (int t = 0; t < 20; ++t) feed(d, t, job.next(), &alerts);
  job.stalled = 2;
  for (int t = 20; t < 50; ++t) {
    Round r = job.next();
    if (t >= 40) {
      for (int i = 0; i < kNodes; ++i)
        if (i != 2) r.pressure[i] = 0.04 + 0.005 * job.noise(job.rng);
      r.pressure[0] = 0.2;
    }
    feed(d, t, r, &alerts);
  }
  REQUIRE(alerts.size() == 2);
  CHECK(alerts[0].node == "m2");
  CHECK(alerts[1].node == "m0");
  CHECK(alerts[1].metric == "cgroup.cpu.pressure");
}

TEST_CASE("a second faulty machine is reported once the first has recovered") {
  Detector d(DetectorConfig{});
  LockStep job;
  std::vector<Alert> alerts;
  for (int t = 0; t < 20; ++t) feed(d, t, job.next(), &alerts);
  job.stalled = 2;
  int recovered = 40;
  for (int t = 20; t < 60; ++t) {
    if (t == recovered) job.stalled = -1;  // m2's workers continue
    Round r = job.next();
    if (t >= 25) r.throttled[0] = 0.5;  // m0 throttled from t=25 on, to the end
    feed(d, t, r, &alerts);
  }
  REQUIRE(alerts.size() == 2);
  CHECK(alerts[0].node == "m2");
  CHECK(alerts[1].node == "m0");
  CHECK(alerts[1].metric == "cgroup.cpu.throttled");
  // Held while m2 was the job's culprit, alerted once m2 had looked normal
  // for `continuity` evaluations (its 3 s window median flips back first).
  CHECK(alerts[1].ts_ns > recovered * kSec);
  CHECK(alerts[1].ts_ns < (recovered + 6) * kSec);
  CHECK(alerts[1].since_ns < 28 * kSec);  // its evidence began long before
}

TEST_CASE("a job-wide fall in level with one machine falling less is no fault (the spread is kept)") {
  // Every machine waits (no culprit to hold anyone): the pressure collapses
  // from 0.7 to 0.015, one machine's to 0.09 for a few seconds. Against the
  // spread of the new level alone (0.003) that is far apart, against the
  // spread the job had a moment ago (0.05) it is not.
  Detector d(DetectorConfig{});
  LockStep job;
  std::vector<Alert> alerts;
  for (int t = 0; t < 20; ++t) feed(d, t, job.next(), &alerts);
  job.pause = true;
  for (int t = 20; t < 30; ++t) {
    Round r = job.next();
    if (t < 25) r.pressure[3] = 0.09;
    feed(d, t, r, &alerts);
  }
  CHECK(alerts.empty());
}

namespace {

// A data-parallel job in lock-step: 4 s steps, 70% compute (GPU busy, little
// traffic) then 30% communication (GPU half busy, the NIC saturated), every
// machine sampled once a second 0-200 ms late, about 1% of samples lost.
// `slow` (a machine index or -1) has its GPU clock capped from t = 60.
std::vector<Alert> bursty_job(int machines, int slow, unsigned seed) {
  DetectorConfig c;
  c.metrics = {"*"};  // every metric checked, as a user replaying their own export would
  Detector d(c);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> noise(0, 1);
  std::vector<Alert> alerts;
  for (int t = 0; t < 120; ++t) {
    int64_t last = 0;
    for (int i = 0; i < machines; ++i) {
      double at = t + 0.2 * u(rng);
      bool compute = std::fmod(at, 4.0) < 2.8;
      int64_t ts = static_cast<int64_t>(at * 1e9);
      last = std::max(last, ts);
      auto put = [&](const char* m, double v) {
        if (u(rng) >= 0.01) d.add("m" + std::to_string(i), m, ts, v, 0);
      };
      put("gpu0.util", (compute ? 95 : 50) + 3 * noise(rng));
      put("gpu0.power", (compute ? 650 : 350) * (1 + 0.03 * noise(rng)));
      put("gpu0.sm_clock", (i == slow && t >= 60 ? 1190 : 1980) + 5 * noise(rng));
      put("net.ib0.tx_bytes", (compute ? 0.3e9 : 20e9) * (1 + 0.05 * noise(rng)));
    }
    d.evaluate(last, &alerts);
  }
  return alerts;
}

}  // namespace

TEST_CASE("phase-bursty metrics of a lock-step job with jitter and lost samples make no outlier") {
  for (unsigned seed = 1; seed <= 5; ++seed) {
    CAPTURE(seed);
    CHECK(bursty_job(16, -1, seed).empty());
  }
  // A real fault in the same job is still found, on the right machine.
  std::vector<Alert> alerts = bursty_job(16, 9, 3);
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].node == "m9");
  CHECK(alerts[0].metric == "gpu0.sm_clock");
}

namespace {

// Bytes a lock-step machine's NIC has moved by time t: steps of 4 s, the
// communication burst (20 GB/s) in [2.08, 3.06) of each step, 0.3 GB/s else.
double nic_bytes(double t) {
  double step = std::floor(t / 4), into = t - 4 * step;
  double burst = 0.98 * step + std::clamp(into - 2.08, 0.0, 0.98);
  return 0.3e9 * t + 19.7e9 * burst;
}

// 8 machines sampled once a second, 0.10-0.14 s into it, the NIC's counter
// turned into a rate over each machine's own interval (as counters from an
// exporter are). Machine m3 is sampled 0.20 s into the second in which the
// burst starts and 0.00 s into the one in which it ends: its intervals
// straddle both ends of each burst differently from its peers', so its rate
// is 2-4 times theirs in the rounds after the burst's start and end.
// `faulty` (an index or -1) retransmits 150 segments/s from t = 40.
std::vector<Alert> shifted_sampler_job(int faulty) {
  Detector d(DetectorConfig{});
  std::mt19937 rng(11);
  std::normal_distribution<double> noise(0, 1);
  std::vector<double> prev(8, -1), prev_bytes(8, 0);
  std::vector<Alert> alerts;
  for (int t = 0; t < 80; ++t) {
    int64_t last = 0;
    for (int i = 0; i < 8; ++i) {
      double at = t + 0.10 + 0.005 * i;
      if (i == 3 && t % 4 == 2) at = t + 0.20;
      if (i == 3 && t % 4 == 3) at = t + 0.00;
      int64_t ts = static_cast<int64_t>(at * 1e9);
      last = std::max(last, ts);
      std::string node = "m" + std::to_string(i);
      double bytes = nic_bytes(at);
      if (prev[i] >= 0)
        d.add(node, "net.ib0.rx_bytes", ts, (bytes - prev_bytes[i]) / (at - prev[i]) * (1 + 0.03 * noise(rng)), 0);
      prev[i] = at;
      prev_bytes[i] = bytes;
      double retrans = i == faulty && t >= 40 ? 150 : 1;
      d.add(node, "net.tcp.retrans", ts, std::max(0.0, retrans + std::sqrt(retrans) * noise(rng)), 0);
    }
    d.evaluate(last, &alerts);
  }
  return alerts;
}

}  // namespace

TEST_CASE("a machine sampled off its peers' instants at a communication burst is no outlier") {
  std::vector<Alert> alerts = shifted_sampler_job(-1);
  std::string alerted;
  for (const Alert& a : alerts) alerted += a.node + " on " + a.metric + "; ";
  CHECK(alerted == "");
  // A real fault in the same job is found, on the right machine.
  alerts = shifted_sampler_job(5);
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].node == "m5");
  CHECK(alerts[0].metric == "net.tcp.retrans");
}
