// The scheduler plugin on a real host (libballast's C API): placement.request
// answered with placement.plan, fault.confirmed respected, and a replacement
// asked for with the plan event itself, as a recovery policy would.
#include <doctest/doctest.h>

#include <ballast/host.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kData = BALLAST_SOURCE_DIR "/tests/plugins/scheduler/data/";

struct Collector {
  std::mutex mu;
  std::vector<nlohmann::json> events;
  static int handler(void* user, const ballast_event* ev) {
    auto* c = static_cast<Collector*>(user);
    std::vector<char> buf(1 << 16);
    int64_t need = ballast_event_to_json(ev, buf.data(), buf.size());
    if (need < 0) return -1;
    if (static_cast<uint64_t>(need) >= buf.size()) {
      buf.resize(static_cast<size_t>(need) + 1);
      ballast_event_to_json(ev, buf.data(), buf.size());
    }
    std::lock_guard<std::mutex> lock(c->mu);
    c->events.push_back(nlohmann::json::parse(buf.data()));
    return 0;
  }
  // Wait, bounded, for n events; false when they did not come.
  bool wait_for(size_t n) {
    for (int i = 0; i < 6000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (events.size() >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  nlohmann::json at(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return events.at(i);
  }
};

}  // namespace

TEST_CASE("placement requests and replacements over a real bus") {
  ballast_host* host = nullptr;
  REQUIRE(ballast_host_create("test-node", &host) == BALLAST_OK);
  std::string cfg = "{ topology = '" + kData + "tree.conf' }";
  REQUIRE_MESSAGE(ballast_host_load_plugin(host, BALLAST_PLUGIN_DIR "/ballast-scheduler.so", cfg.c_str()) == BALLAST_OK,
                  ballast_last_error());
  Collector plans, errors;
  ballast_subscribe_options queued{sizeof queued, BALLAST_DELIVER_QUEUED, 0, 0};
  uint64_t id = 0;
  REQUIRE(ballast_host_subscribe(host, "placement.plan", &queued, Collector::handler, &plans, &id) == BALLAST_OK);
  REQUIRE(ballast_host_subscribe(host, "placement.error", &queued, Collector::handler, &errors, &id) == BALLAST_OK);
  REQUIRE(ballast_host_start(host) == BALLAST_OK);

  REQUIRE(ballast_host_publish_json(host, "fault.confirmed", R"({"stage": 1, "subject": "gpu20", "kind": "xid"})") ==
          BALLAST_OK);
  std::string job = R"({"name": "bus", "gpus_per_node": 8, "tp": 4, "pp": 2, "dp": 12, "alpha": 0.3})";
  std::string req = R"({"job": )" + job + R"(, "state": {"busy": ["gpu[01-12]"]}})";
  REQUIRE(ballast_host_publish_json(host, "placement.request", req.c_str()) == BALLAST_OK);
  REQUIRE(plans.wait_for(1));
  nlohmann::json plan = plans.at(0)["payload"];
  INFO(plan.dump());
  REQUIRE(plan["nodes"].size() == 12);
  CHECK(plan["job"] == "bus");
  CHECK(plan["algorithm"] == "arnold");
  for (const auto& n : plan["nodes"]) {
    std::string name = n["name"];
    CHECK(name > "gpu12");
    CHECK(name != "gpu20");
  }

  // A policy's replacement request, carrying the plan event's payload.
  nlohmann::json ask{{"replace", {{"plan", plan}, {"failed", plan["nodes"][0]["name"]}, {"alpha", 0.3}}},
                     {"state", {{"busy", {"gpu[01-12]"}}}}};
  REQUIRE(ballast_host_publish_json(host, "placement.request", ask.dump().c_str()) == BALLAST_OK);
  REQUIRE(plans.wait_for(2));
  nlohmann::json after = plans.at(1)["payload"];
  CHECK(after["algorithm"] == "replace");
  CHECK(after["nodes"][0]["name"] != plan["nodes"][0]["name"]);
  CHECK(after["nodes"][0]["name"] != "gpu20");
  for (size_t x = 1; x < 12; ++x) CHECK(after["nodes"][x]["name"] == plan["nodes"][x]["name"]);

  REQUIRE(ballast_host_publish_json(host, "placement.request", R"({"job": {"gpus_per_node": 8}})") == BALLAST_OK);
  REQUIRE(errors.wait_for(1));
  CHECK(errors.at(0)["payload"].dump().find("missing field") != std::string::npos);
  ballast_host_destroy(host);
}
