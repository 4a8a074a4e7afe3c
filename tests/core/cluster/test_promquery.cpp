// promquery against a real Prometheus 2.42 and node-exporter started by
// tools/engines/prom-up on loopback ports of their own: the plugin, loaded in
// a real host, publishes the node's CPU busy share as metric.sample.
#include "cluster_harness.hpp"
#include "error.hpp"
#include "host.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <mutex>

using namespace cluster_test;

namespace {

struct Seen {
  std::mutex mutex;
  std::vector<std::pair<std::string, double>> samples;  // node, value of cpu.busy
};

int on_sample(void* user, const ballast_event* ev) {
  auto* seen = static_cast<Seen*>(user);
  if (ev->schema != BALLAST_SCHEMA_METRIC_BATCH) return 0;
  const auto* b = static_cast<const ballast_metric_batch*>(ev->payload);
  std::lock_guard lock(seen->mutex);
  for (uint32_t i = 0; i < b->count; ++i)
    if (std::string(b->samples[i].metric) == "cpu.busy" && b->samples[i].flags == 0)
      seen->samples.emplace_back(b->samples[i].node, b->samples[i].value);
  return 0;
}

}  // namespace

TEST_CASE("machine metrics read from Prometheus's query_range reach the bus as metric.sample") {
  std::string dir = scratch_dir("prom");
  const int base = test::reserve_ports(2);
  REQUIRE(base > 0);
  int up = sh(engines() + "/prom-up " + dir + " " + std::to_string(base) + " " + std::to_string(base + 1) +
              " n7 >/dev/null");
  struct Down {
    std::string d;
    ~Down() { sh(engines() + "/prom-down " + d); }
  } down{dir};
  REQUIRE_MESSAGE(up == 0, read_file(dir + "/prom.log"));

  ballast::HostOptions options;
  options.node = "controller";
  ballast::Host host(options);
  nlohmann::json config = {
      {"url", "http://127.0.0.1:" + std::to_string(base)},
      {"period", 0.5},
      {"lookback", 10},
      {"queries",
       {{{"metric", "cpu.busy"},
         {"query", "100 * (1 - avg by (ballast_node) (rate(node_cpu_seconds_total{mode=\"idle\"}[3s])))"}}}}};
  REQUIRE(host.load_plugin(std::string(BALLAST_PLUGIN_DIR) + "/ballast-promquery.so", config) == BALLAST_OK);
  Seen seen;
  uint64_t id = 0;
  REQUIRE(host.subscribe("metric.sample", nullptr, on_sample, &seen, "test", &id) == BALLAST_OK);
  REQUIRE(host.start() == BALLAST_OK);
  bool got = eventually(20, [&] {
    std::lock_guard lock(seen.mutex);
    return seen.samples.size() >= 3;
  });
  host.stop();
  REQUIRE(got);
  std::lock_guard lock(seen.mutex);
  for (auto& [node, value] : seen.samples) {
    CHECK(node == "n7");
    CHECK(value >= 0.0);
    CHECK(value <= 100.0);
  }
  CHECK(host.counter("promquery.samples") >= 3);
}

TEST_CASE("promquery names a bad query and an unreachable server") {
  ballast::Host host;
  nlohmann::json bad = {{"url", "http://127.0.0.1:1"}, {"queries", nlohmann::json::array()}};
  CHECK(host.load_plugin(std::string(BALLAST_PLUGIN_DIR) + "/ballast-promquery.so", bad) != BALLAST_OK);
  CHECK(std::string(ballast::last_error()).find("queries") != std::string::npos);
  nlohmann::json no_url = {{"queries", {{{"metric", "m"}, {"query", "up"}}}}};
  CHECK(host.load_plugin(std::string(BALLAST_PLUGIN_DIR) + "/ballast-promquery.so", no_url) != BALLAST_OK);
  CHECK(std::string(ballast::last_error()).find("url") != std::string::npos);
  // A server that is not there: counted and logged, the host goes on.
  nlohmann::json nowhere = {
      {"url", "http://127.0.0.1:1"}, {"period", 0.2}, {"queries", {{{"metric", "m"}, {"query", "up"}}}}};
  REQUIRE(host.load_plugin(std::string(BALLAST_PLUGIN_DIR) + "/ballast-promquery.so", nowhere) == BALLAST_OK);
  REQUIRE(host.start() == BALLAST_OK);
  CHECK(eventually(10, [&] { return host.counter("promquery.query_errors") >= 2; }));
  host.stop();
}
