// The faulty-machine detector on noisy series of a lock-step job: every
// machine's CPU hovers around the same level with noise; faults are planted.
#include <doctest/doctest.h>

#include "detector.hpp"

#include <ballast/events.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

using ballast::machine::Alert;
using ballast::machine::Detector;
using ballast::machine::DetectorConfig;

namespace {

constexpr int64_t kSec = 1000000000;

struct Job {
  int nodes;
  std::mt19937 rng{42};
  std::normal_distribution<double> noise{0.0, 1.0};
  std::string name(int i) const { return "node" + std::to_string(i); }
  // One sampling round at second t: cpu around `level` (percent), with
  // +-3% noise and a little jitter in the sampling time.
  void round(Detector& d, int t, double level, int faulty = -1, double faulty_level = 0) {
    for (int i = 0; i < nodes; ++i) {
      double v = (i == faulty ? faulty_level : level) + 3.0 * noise(rng);
      int64_t ts = t * kSec + (i % 7) * 1000000;  // up to 6 ms apart
      d.add(name(i), "proc.cpu", ts, v, 0);
      d.add(name(i), "proc.rss_bytes", ts, 1e9 + 1e7 * noise(rng), 0);
    }
  }
};

std::vector<Alert> run(Detector& d, Job& job, int from, int to, double level, int faulty = -1,
                       double faulty_level = 0) {
  std::vector<Alert> alerts;
  for (int t = from; t < to; ++t) {
    job.round(d, t, level, faulty, faulty_level);
    d.evaluate(t * kSec + 10000000, &alerts);
  }
  return alerts;
}

}  // namespace

TEST_CASE("a planted outlier is reported once, after the continuity period, on the right metric") {
  DetectorConfig c;
  Detector d(c);
  Job job{16};
  CHECK(run(d, job, 0, 20, 80).empty());
  // node5 falls to 20% CPU at t=20 and stays there.
  std::vector<Alert> alerts;
  int first_alert = -1;
  for (int t = 20; t < 30; ++t) {
    job.round(d, t, 80, 5, 20);
    size_t before = alerts.size();
    d.evaluate(t * kSec + 10000000, &alerts);
    if (alerts.size() > before && first_alert < 0) first_alert = t;
  }
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].kind == "outlier");
  CHECK(alerts[0].node == "node5");
  CHECK(alerts[0].metric == "proc.cpu");
  CHECK(alerts[0].score > c.threshold);
  // The median of the last 3 rounds' z-scores flips on the 2nd faulty round
  // (t=21); `continuity` is 1.
  CHECK(first_alert == 21);
  CHECK(alerts[0].since_ns == 21 * kSec + 10000000);
  CHECK(alerts[0].evidence.find("\"median\"") != std::string::npos);
}

TEST_CASE("one-sample glitches do not alert; two samples do with the 3 s window") {
  Detector d(DetectorConfig{});
  Job job{12};
  CHECK(run(d, job, 0, 10, 80).empty());
  for (int k = 0; k < 5; ++k) {  // a single bad sample on one machine, then calm
    CHECK(run(d, job, 10 + 4 * k, 11 + 4 * k, 80, k, 0).empty());
    CHECK(run(d, job, 11 + 4 * k, 14 + 4 * k, 80).empty());
  }
  // Two bad rounds in a row make the window's median bad: an alert at the 2nd.
  CHECK(run(d, job, 30, 31, 80, 3, 0).empty());
  CHECK(run(d, job, 31, 32, 80, 3, 0).size() == 1);
}

TEST_CASE("a job-wide drop (checkpoint pause) is not flagged") {
  Detector d(DetectorConfig{});
  Job job{32};
  CHECK(run(d, job, 0, 15, 85).empty());
  CHECK(run(d, job, 15, 25, 5).empty());   // everybody pauses
  CHECK(run(d, job, 25, 40, 85).empty());  // and resumes
}

TEST_CASE("a job-wide drop caught half-way (machines drop one round apart) is not flagged") {
  Detector d(DetectorConfig{});
  Job job{8};
  std::vector<Alert> alerts;
  for (int t = 0; t < 30; ++t) {
    for (int i = 0; i < job.nodes; ++i) {
      // Half the machines pause one second later than the others.
      bool paused = t >= 10 + (i % 2) && t < 20 + (i % 2);
      d.add(job.name(i), "proc.cpu", t * kSec, (paused ? 5 : 85) + job.noise(job.rng), 0);
    }
    d.evaluate(t * kSec + 1, &alerts);
  }
  CHECK(alerts.empty());
}

TEST_CASE("a machine that stops reporting raises node.silent once") {
  DetectorConfig c;
  c.silent_after_s = 3;
  Detector d(c);
  Job job{6};
  std::vector<Alert> alerts;
  for (int t = 0; t < 20; ++t) {
    for (int i = 0; i < job.nodes; ++i) {
      if (i == 2 && t >= 8) continue;  // node2 dies at t=8
      d.add(job.name(i), "proc.cpu", t * kSec, 80 + job.noise(job.rng), 0);
    }
    d.evaluate(t * kSec + 1, &alerts);
  }
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].kind == "silent");
  CHECK(alerts[0].node == "node2");
  CHECK(alerts[0].since_ns == 7 * kSec);
  CHECK(alerts[0].ts_ns == 10 * kSec + 1);  // first evaluation more than 3 s after
}

TEST_CASE("garbage from one machine is not data and does not stop the detector") {
  Detector d(DetectorConfig{});
  Job job{10};
  std::vector<Alert> alerts;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (int t = 0; t < 30; ++t) {
    for (int i = 0; i < job.nodes; ++i) {
      if (i == 0) {
        // node0 sends NaN, inf, flagged samples, time going backwards and a
        // flood of metric names.
        CHECK_FALSE(d.add("node0", "proc.cpu", t * kSec, nan, 0));
        CHECK_FALSE(d.add("node0", "proc.cpu", t * kSec, inf, 0));
        CHECK_FALSE(d.add("node0", "proc.cpu", t * kSec, 1e6, BALLAST_SAMPLE_INVALID));
        CHECK_FALSE(d.add("node0", "proc.cpu", t * kSec, 1e6, BALLAST_SAMPLE_COUNTER_RESET));
        d.add("node0", "cpu.user", (t + 1000) * kSec, 1, 0);
        CHECK_FALSE(d.add("node0", "cpu.user", (t - 1000) * kSec, 1, 0));
        for (int k = 0; k < 200; ++k) d.add("node0", "junk." + std::to_string(t * 200 + k), t * kSec, 1, 0);
        continue;
      }
      double v = (i == 7 && t >= 15 ? 10 : 80) + 3 * job.noise(job.rng);
      d.add(job.name(i), "proc.cpu", t * kSec, v, 0);
    }
    d.evaluate(t * kSec + 1, &alerts);
  }
  // The real fault on node7 is still found; node0's garbage raised nothing.
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].node == "node7");
  CHECK(d.counters().flagged >= 60);
  CHECK(d.counters().nonfinite == 60);
  CHECK(d.counters().over_cap > 0);  // 6,000 junk names past the 4,096 cap
}

TEST_CASE("an outlier beyond double range still gives a finite score") {
  Detector d(DetectorConfig{});
  std::vector<Alert> alerts;
  for (int t = 0; t < 10; ++t) {
    for (int i = 0; i < 5; ++i)
      d.add("n" + std::to_string(i), "proc.cpu", t * kSec, i == 4 ? 1.7e308 : -1.7e308 + i, 0);
    d.evaluate(t * kSec + 1, &alerts);
  }
  for (const Alert& a : alerts) CHECK(std::isfinite(a.score));
}

TEST_CASE("the metric earliest in the priority order names the alert") {
  DetectorConfig c;
  c.metrics = {"net.*", "proc.cpu"};
  Detector d(c);
  Job job{8};
  std::vector<Alert> alerts;
  for (int t = 0; t < 12; ++t) {
    for (int i = 0; i < job.nodes; ++i) {
      bool bad = i == 1 && t >= 5;
      d.add(job.name(i), "proc.cpu", t * kSec, (bad ? 10 : 80) + job.noise(job.rng), 0);
      d.add(job.name(i), "net.eth0.rx_bytes", t * kSec, (bad ? 1e3 : 1e8) + 1e5 * job.noise(job.rng), 0);
      d.add(job.name(i), "mem.used", t * kSec, i == 2 ? 1e3 : 1e9, 0);  // not listed: ignored
    }
    d.evaluate(t * kSec + 1, &alerts);
  }
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].node == "node1");
  CHECK(alerts[0].metric == "net.eth0.rx_bytes");
  CHECK(d.counters().ignored == 12 * 8);
}

TEST_CASE("the work of an evaluation grows linearly with the machines") {
  auto work_for = [](int nodes) {
    Detector d(DetectorConfig{});
    Job job{nodes};
    run(d, job, 0, 5, 80);
    uint64_t before = d.work();
    run(d, job, 5, 6, 80);
    return d.work() - before;
  };
  // Two metrics (proc.cpu, proc.rss_bytes), one step per machine and metric.
  CHECK(work_for(100) == 200);
  CHECK(work_for(1000) == 2000);
  CHECK(work_for(10000) == 20000);
}

TEST_CASE("glob patterns") {
  using ballast::machine::glob_match;
  CHECK(glob_match("gpu*.util", "gpu0.util"));
  CHECK(glob_match("gpu*.util", "gpu13.util"));
  CHECK_FALSE(glob_match("gpu*.util", "gpu0.power"));
  CHECK(glob_match("net.*.rx_bytes", "net.eth0.rx_bytes"));
  CHECK(glob_match("*", "anything"));
  CHECK_FALSE(glob_match("proc.cpu", "proc.cpu2"));
}

TEST_CASE("a metric that is usually 0 needs its minimum deviation: retransmit blips are no fault") {
  Detector d(DetectorConfig{});
  std::vector<Alert> alerts;
  std::mt19937 rng(11);
  for (int t = 0; t < 40; ++t) {
    for (int i = 0; i < 6; ++i) {
      // A retransmit or two now and then on any machine; node4 loses packets from t=25.
      double v = (rng() % 4 == 0) ? 1 + rng() % 3 : 0;
      if (i == 4 && t >= 25) v = 150;
      d.add("node" + std::to_string(i), "net.tcp.retrans", t * kSec, v, 0);
    }
    d.evaluate(t * kSec + 1, &alerts);
  }
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].node == "node4");
  CHECK(alerts[0].ts_ns == 26 * kSec + 1);  // the 2nd round at 150
}

TEST_CASE("no verdict while a metric warms up") {
  DetectorConfig c;
  c.warmup = 5;
  Detector d(c);
  Job job{6};
  // node1 is off from the start: flagged only once the metric is warm.
  std::vector<Alert> alerts = run(d, job, 0, 12, 80, 1, 10);
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0].node == "node1");
  CHECK(alerts[0].ts_ns == 5 * kSec + 10000000);  // evaluation 6 (t = 5) is the first warm one
}
