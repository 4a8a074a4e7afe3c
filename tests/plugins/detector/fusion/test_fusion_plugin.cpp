// The fusion as a plugin in the real host, beside the real machine detector:
// the detector's fault.suspected and a hang verdict on a rank of the same
// machine (placed by a placement.plan) come back as one suspects.ranking.
#include <doctest/doctest.h>

#include <ballast/host.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Seen {
  std::mutex mu;
  std::vector<nlohmann::json> rankings;
};

int on_ranking(void* user, const ballast_event* ev) {
  auto* seen = static_cast<Seen*>(user);
  if (ev->schema != BALLAST_SCHEMA_JSON) return 0;
  std::string text(static_cast<const char*>(ev->payload), ev->payload_size);
  std::lock_guard<std::mutex> lock(seen->mu);
  seen->rankings.push_back(nlohmann::json::parse(text));
  return 0;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("the machine detector's and the hang analysis's suspicions become one ranking") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("controller", &host) == BALLAST_OK);
  REQUIRE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-machine.so",
                                   "{ period = 0.1, window = 0.3, warmup = 3 }") == BALLAST_OK);
  REQUIRE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-fusion.so", "{ min_score = 0.5 }") == BALLAST_OK);
  Seen seen;
  uint64_t id = 0;
  REQUIRE(ballast_host_subscribe(host, "suspects.ranking", nullptr, on_ranking, &seen, &id) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);

  // Ranks 0-3 on m0, 4-7 on m1, ...
  const std::vector<std::string> nodes = {"m0", "m1", "m2", "m3", "m4"};
  std::vector<ballast_placement_node> placed;
  for (int i = 0; i < 5; ++i) placed.push_back({nodes[static_cast<size_t>(i)].c_str(), 0, i, 4 * i});
  ballast_placement_plan plan{};
  plan.size = sizeof plan;
  plan.count = 5;
  plan.job = "job";
  plan.algorithm = "test";
  plan.nodes = placed.data();
  ballast_event pe{};
  pe.size = sizeof pe;
  pe.schema = BALLAST_SCHEMA_PLACEMENT_PLAN;
  pe.topic = "placement.plan";
  pe.payload = &plan;
  pe.payload_size = sizeof plan;
  REQUIRE(ballast_host_publish(host, &pe) == BALLAST_OK);

  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0, 0.005);
  auto start = std::chrono::steady_clock::now();
  bool hang_sent = false;
  for (int round = 0; round < 300; ++round) {  // up to 15 s
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<ballast_metric_sample> samples;
    for (size_t i = 0; i < nodes.size(); ++i) {
      double v = (i == 2 && t > 1.5 ? 0.9 : 0.1) + noise(rng);
      samples.push_back({nodes[i].c_str(), "proc.cpu", now_ns(), v, 0});
    }
    ballast_metric_batch batch{sizeof batch, static_cast<uint32_t>(samples.size()), samples.data()};
    ballast_event ev{};
    ev.size = sizeof ev;
    ev.schema = BALLAST_SCHEMA_METRIC_BATCH;
    ev.topic = "metric.sample";
    ev.payload = &batch;
    ev.payload_size = sizeof batch;
    REQUIRE(ballast_host_publish(host, &ev) == BALLAST_OK);
    if (!hang_sent && t > 2.5) {
      // The hang analysis names rank 9, which the plan put on m2.
      ballast_fault_report r{};
      r.size = sizeof r;
      r.stage = BALLAST_FAULT_CONFIRMED;
      r.subject = "rank:9";
      r.rank = 9;
      r.kind = "stuck";
      r.score = 1;
      r.confidence = 1;
      r.detector = "hang";
      r.evidence = "{\"seq\":12}";
      ballast_event he{};
      he.size = sizeof he;
      he.schema = BALLAST_SCHEMA_FAULT_REPORT;
      he.topic = "fault.confirmed";
      he.payload = &r;
      he.payload_size = sizeof r;
      REQUIRE(ballast_host_publish(host, &he) == BALLAST_OK);
      hang_sent = true;
    }
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (hang_sent && !seen.rankings.empty() && seen.rankings.back()["suspects"][0]["evidence"].size() == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ballast_host_destroy(host);
  REQUIRE_FALSE(seen.rankings.empty());
  const auto& last = seen.rankings.back();
  REQUIRE(last["suspects"].size() == 1);
  const auto& top = last["suspects"][0];
  CHECK(top["node"] == "m2");
  CHECK(top["alerting"] == true);
  REQUIRE(top["evidence"].size() == 2);
  std::vector<std::string> detectors = {top["evidence"][0]["detector"], top["evidence"][1]["detector"]};
  std::sort(detectors.begin(), detectors.end());
  CHECK(detectors == std::vector<std::string>{"hang", "machine"});
}
